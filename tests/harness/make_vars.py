"""Read a variable of the Makefile, for the tests that hold a Makefile list and
the code together (one parser, so both read it alike)."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def make_words(name: str, text: str | None = None) -> tuple[str, ...]:
    """The words of a `NAME := a b c` line (the Makefile's when no text is given)."""
    text = MAKEFILE.read_text() if text is None else text
    m = re.search(rf"^{re.escape(name)}\s*:?=(.*)$", text, re.M)
    if not m:
        raise AssertionError(f"Makefile: no {name} variable")
    return tuple(m.group(1).split())
