"""The exit codes every kvconform verb ends with, defined once.

A divergence (impl and vLLM, or an answer and the trace, disagree) is the only
thing that exits 1. Anything the user can fix in their input or command line is
2 (a malformed trace, an unknown op, a call or config vLLM rejects); anything
about the machine (vLLM missing, a release without a profile, an op the
installed build lacks) is 3. Ctrl-C is 130, the shell's 128 + SIGINT.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    DIVERGED = 1
    BAD_INPUT = 2
    ENVIRONMENT = 3
    INTERRUPTED = 130


# Most telling first. A run that was cut short, or could not check something,
# must never read as a plain divergence or a pass: the divergences it did find
# are still printed, but fixing the environment or the input comes first, since
# what it hides could change the verdict.
_RANK = (ExitCode.INTERRUPTED, ExitCode.ENVIRONMENT, ExitCode.BAD_INPUT, ExitCode.DIVERGED)


def worst(codes: Iterable[int]) -> ExitCode:
    """The exit code of a run made of several parts (traces, cases):
    interrupted > environment > bad input > divergence > success. No parts is
    success. A code outside ExitCode is a bug in the caller: ValueError."""
    seen = {ExitCode(c) for c in codes}
    for code in _RANK:
        if code in seen:
            return code
    return ExitCode.OK


PROG = "kvconform"


class CommandError(Exception):
    """Ends a verb with one line on stderr and `code` (the verb's runner
    catches it: harness/cli/support.py run_verb)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.BAD_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> ExitCode:
    """One line on stderr; returns `code` for the verb to exit with."""
    print(f"{PROG}: {message}".replace("\n", " "), file=sys.stderr)
    return code
