"""Errors about a trace's content: one line naming file:line and the field."""

from __future__ import annotations

from harness.core.exit_codes import ExitCode


class TraceError(Exception):
    """Bad input: `path:line: field: message`, exit code 2 (3 for a version with
    no profile, which is the environment's problem rather than the trace's)."""

    def __init__(self, path: str, line: int, field: str, message: str,
                 exit_code: ExitCode = ExitCode.BAD_INPUT) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.message = message
        self.exit_code = exit_code
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.message}"
