"""What a trace run produced: its outcome and, at a divergence, the context
around it. Plain data that runs fill in and reports read."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.compare import Failure
from harness.core.exit_codes import ExitCode
from harness.core.trace_error import TraceError
from harness.core.traffic import Traffic


@dataclass(slots=True)
class DivergenceContext:
    involved_blocks: list[int]
    before: dict[str, list[dict]]  # backend -> states of the involved blocks
    after: dict[str, list[dict]]
    related: list[dict]  # earlier events touching the request or the blocks


@dataclass(slots=True)
class TraceOutcome:
    path: str
    num_events: int = 0
    seconds: float = 0.0  # all of it, backend construction included
    run_seconds: float = 0.0  # executing the events only
    divergence: Failure | None = None  # DIVERGED or INVARIANT
    context: DivergenceContext | None = None
    error: TraceError | None = None
    skipped: str | None = None
    # A foreign backend's capabilities leave the trace out ("not covered by
    # exec:CMD: ..."): not a pass, not a divergence (specs/FOREIGN_BACKEND.md).
    not_covered: str | None = None
    recorded: str | None = None  # path written by record
    profile: str | None = None  # the trace's version profile, once its header is read
    # The header's `truncated` note: the trace lacks its end (a capture whose
    # server died), so a pass is "truncated", never plainly "conformant".
    truncated: str | None = None
    # With observe: the run's traffic step by step, as the first backend saw
    # it (harness/core/traffic.py), with observe_pool also the pool's states.
    traffic: Traffic | None = None

    @property
    def exit_code(self) -> ExitCode:
        if self.error is not None:
            return self.error.exit_code
        return ExitCode.DIVERGED if self.divergence is not None else ExitCode.OK
