"""The exit codes every kvconform verb ends with, defined once.

A divergence (impl and vLLM, or an answer and the trace, disagree) is the only
thing that exits 1. Anything the user can fix in their input or command line is
2; anything about the machine (vLLM missing, a release without a profile, an op
the installed build lacks) is 3.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    DIVERGED = 1
    BAD_INPUT = 2
    ENVIRONMENT = 3


def worst(codes) -> ExitCode:
    """The exit code of a run made of several parts: environment beats bad
    input beats divergence beats success, so a run that could not check
    something never reads as a plain divergence or a pass."""
    order = (ExitCode.ENVIRONMENT, ExitCode.BAD_INPUT, ExitCode.DIVERGED)
    codes = {ExitCode(c) for c in codes}
    for code in order:
        if code in codes:
            return code
    return ExitCode.OK
