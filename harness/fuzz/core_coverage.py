"""Branch coverage of vLLM's KV core reached by fuzzing: vllm/v1/core and the
CPU offload tier (vllm/v1/kv_offload) of whichever vLLM is imported (the
installed one or a release's overlay).

Measured with coverage.py in the process that runs vLLM, one data file per
fuzz slice under a folder the gate owns; the gate combines them for its
summary. Every source file of those packages counts towards the total, the
ones no slice imported included, so two runs' figures compare
(specs/FUZZING.md, "The gate's fuzz").
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

CORE_PACKAGES = ("vllm.v1.core", "vllm.v1.kv_offload")
_DATA = ".coverage"


def core_dirs() -> list[str]:
    """The folders of CORE_PACKAGES in the vLLM this process imports (found
    without importing them)."""
    dirs = []
    for name in CORE_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    return dirs


def _coverage(data_dir: str, suffix: str | None = None):
    import coverage

    cov = coverage.Coverage(data_file=os.path.join(data_dir, _DATA), data_suffix=suffix,
                            branch=True, source=core_dirs(), config_file=False,
                            messages=False)
    # A slice that never reached vLLM is a figure (0), not a warning.
    cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-imported"])
    return cov


def _suffix(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", name)


# A slice's data file is whole once its name is in here (the budget's
# steering reads the slices that explored first, harness/fuzz/steering.py).
_DONE = "done"


@contextmanager
def measured(data_dir: str | None, name: str) -> Iterator[None]:
    """vLLM's KV core measured while the block runs, saved as slice `name`'s
    data file in `data_dir` (nothing measured when data_dir is None); the
    slice is marked done even where nothing could be measured."""
    if data_dir is None:
        yield
        return
    os.makedirs(os.path.join(data_dir, _DONE), exist_ok=True)
    cov = _coverage(data_dir, _suffix(name)) if core_dirs() else None
    if cov is not None:
        cov.start()
    try:
        yield
    finally:
        if cov is not None:
            cov.stop()
            cov.save()
        with open(os.path.join(data_dir, _DONE, _suffix(name)), "w"):
            pass


def is_done(data_dir: str, name: str) -> bool:
    return os.path.exists(os.path.join(data_dir, _DONE, _suffix(name)))


def arcs_of(data_dir: str, name: str) -> frozenset[tuple[str, int, int]]:
    """The code paths (file, from line, to line) slice `name` took inside
    functions of vLLM's KV core; none where it measured nothing. Module-level
    lines are left out: they run once per process, at import, so only the
    first slice of each worker would have them."""
    import coverage

    path = os.path.join(data_dir, f"{_DATA}.{_suffix(name)}")
    if not os.path.exists(path):
        return frozenset()
    data = coverage.CoverageData(basename=path)
    data.read()
    arcs = set()
    for f in data.measured_files():
        body = _function_lines(f)
        arcs.update((f, a, b) for a, b in (data.arcs(f) or ()) if a in body)
    return frozenset(arcs)


@cache
def _function_lines(path: str) -> frozenset[int]:
    """The lines of a source file inside function bodies (not the def lines,
    which run at import)."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            lines.update(range(node.body[0].lineno, (node.end_lineno or 0) + 1))
    return frozenset(lines)


@dataclass(slots=True, frozen=True)
class CoreBranches:
    """Branches of vLLM's KV core taken, of all it has."""
    covered: int
    total: int
    slices: int

    def line(self) -> str:
        pct = 100.0 * self.covered / self.total if self.total else 0.0
        return (f"vLLM KV core branch coverage ({', '.join(CORE_PACKAGES)}): "
                f"{self.covered:,} of {self.total:,} branches ({pct:.1f}%), "
                f"from {self.slices} fuzz slices")


def combined(data_dir: str, html_dir: str | None = None) -> CoreBranches | None:
    """The slices' data files in data_dir as one figure (None: no slice
    measured anything); with html_dir, coverage.py's HTML report there too
    (every branch of the KV core, taken or not, by file)."""
    import coverage

    names = os.listdir(data_dir) if os.path.isdir(data_dir) else []
    suffixed = [f for f in names if f.startswith(_DATA + ".")]
    if not suffixed:
        return None
    cov = _coverage(data_dir)
    cov.combine([data_dir], keep=True)
    data = cov.get_data()
    if not data.has_arcs():  # no slice took a branch: still counted by branches
        data.add_arcs({})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "core.json")
        try:
            cov.json_report(outfile=out)
        except coverage.exceptions.NoDataError:
            return None
        with open(out, encoding="utf-8") as f:
            totals = json.load(f)["totals"]
    if html_dir is not None:
        cov.html_report(directory=html_dir, title="vLLM KV core reached by kvconform's fuzz")
    return CoreBranches(totals["covered_branches"], totals["num_branches"], len(suffixed))
