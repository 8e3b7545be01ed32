"""Comparing answers: where two observation streams first disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.events import Event


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The path of the first differing field of two answers ('' = the root), or
    None if they are equal. Lists are compared element by element."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}.{key}" if path else str(key)
            sub = first_difference(a[key], b[key], f"{path}.{key}" if path else str(key))
            if sub is not None:
                return sub
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            sub = first_difference(x, y, f"{path}[{i}]")
            if sub is not None:
                return sub
        return f"{path}[{min(len(a), len(b))}]"
    return path


def check_expected(answer: dict, expected: dict | None) -> str | None:
    """None if `answer` has every expected field with the expected value (a
    hand-derived expectation names only the fields it cares about)."""
    if expected is None:
        return None
    for key, want in expected.items():
        if answer.get(key) != want:
            return f"{key}: expected {want!r}, got {answer.get(key)!r}"
    return None


@dataclass(slots=True)
class Divergence:
    index: int  # 0-based position of the event in the stream
    event: Event
    # backend name (or "recorded" / "expected") -> its answer
    answers: dict[str, Any]
    field: str
    # Where the event is, when it comes from a trace.
    path: str = ""
    line: int = 0
    record: Any = None

    def describe(self) -> str:
        where = f"{self.path}:{self.line}: " if self.path else ""
        lines = [f"{where}event #{self.index} {self.event.kind}: {self.event!r}",
                 f"  first differing field: {self.field or '(whole answer)'}"]
        for name, answer in self.answers.items():
            lines.append(f"  {name:>8}: {answer}")
        return "\n".join(lines)
