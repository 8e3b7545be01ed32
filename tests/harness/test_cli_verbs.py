"""One way to declare a verb (harness/cli/main.py): a verb module's
`register(subparsers)` adds its parser and sets its handler as `func`, and
main.py lists the modules. Checked against the modules on disk, each check
with a negative control."""

from __future__ import annotations

import argparse
from pathlib import Path

import harness.cli
from harness.cli.main import VERBS, build_parser

# The modules of harness/cli/ that declare no verb.
NOT_VERBS = {"__init__", "main", "support"}


def verb_modules() -> set[str]:
    folder = Path(harness.cli.__file__).parent
    return {f"harness.cli.{p.stem}" for p in folder.glob("*.py") if p.stem not in NOT_VERBS}


def undeclared(modules: set[str], listed) -> set[str]:
    """Verb modules main.py does not list, and listed ones without register."""
    names = {m.__name__ for m in listed}
    return (modules - names) | {m.__name__ for m in listed
                                if not callable(getattr(m, "register", None))}


def without_handler(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    """The verbs (and capture's sources) whose parser sets no `func`."""
    missing = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                missing += without_handler(sub, (*path, name))
            elif not callable(sub.get_default("func")):
                missing.append(" ".join((*path, name)))
    return missing


def test_every_verb_module_is_listed_and_registers():
    assert undeclared(verb_modules(), VERBS) == set()


def test_a_verb_module_left_out_of_the_list_is_caught():
    listed = [m for m in VERBS if m.__name__ != "harness.cli.fuzz"]
    assert undeclared(verb_modules(), listed) == {"harness.cli.fuzz"}


def test_every_verb_and_capture_source_has_a_handler():
    assert without_handler(build_parser()) == []


def test_a_verb_without_a_handler_is_caught():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verbs.add_parser("orphan")
    capture = verbs.choices["capture"]
    sources = next(a for a in capture._actions if isinstance(a, argparse._SubParsersAction))
    sources.add_parser("stray")
    assert without_handler(parser) == ["capture stray", "orphan"]
