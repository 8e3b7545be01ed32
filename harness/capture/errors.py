"""What can go wrong while capturing (the CLI maps each to one line and an
exit code: harness/cli/capture.py)."""

from __future__ import annotations


class CaptureGap(RuntimeError):
    """vLLM made a call, or passed an argument, that the trace format cannot
    express (so a replay could not reproduce it). The trace written so far is
    valid and ends before the call."""


class PresetError(ValueError):
    """A workload preset is malformed: `file:line: field: message` (exit 2)."""

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field, self.message = path, line, field, message
        super().__init__(f"{path}:{line}: {field}: {message}")
