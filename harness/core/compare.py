"""Comparing answers: where two observation streams first disagree, and the one
type every disagreement becomes (`Failure`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from harness.core.events import Event
from harness.core.exit_codes import ExitCode


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


class FailureKind(Enum):
    # Two answers differ (or a backend raised where the reference answered).
    DIVERGED = "diverged"
    # impl's invariant checker (impl/invariants.py) found a broken invariant.
    INVARIANT = "invariant violated"
    # The reference refused the call: an exception inside it (vLLM's
    # AssertionError on a request it does not accept) or a call the driver
    # protocol cannot execute (BackendError: an unknown request). Bad input.
    REJECTED = "rejected"
    # vLLM itself is wrong: it raised where impl answered, or its own state
    # broke an invariant (harness/backends/vllm_invariants.py). A finding in
    # vLLM, exit 1, never bad input.
    UPSTREAM = "UPSTREAM"


@dataclass(slots=True)
class Failure:
    """An event that did not end with every backend (and the trace) agreeing."""

    kind: FailureKind
    event: Event
    # backend name (or "recorded" / "expected") -> its answer, or the text of
    # what it raised.
    answers: dict[str, Any]
    # The first differing field; for REJECTED the field the rejection names.
    field: str = ""
    index: int = 0  # 0-based position of the event in its stream
    # Where the event is, when it comes from a trace.
    path: str = ""
    line: int = 0
    record: Any = None
    # REJECTED: who refused it, and why (one line).
    backend: str = ""
    message: str = ""

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.BAD_INPUT if self.kind is FailureKind.REJECTED else ExitCode.DIVERGED
