"""Run the same events through several backends in lockstep, comparing answers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.backends.base import Backend
from harness.diff import Divergence, first_difference
from harness.events import Event
from harness.workload import EventStream, drive


@dataclass(slots=True)
class LockstepResult:
    num_events: int
    divergence: Divergence | None


def run_lockstep(
    source: EventStream | Iterable[Event],
    backends: list[Backend],
    on_event: Callable[[int], None] | None = None,
) -> LockstepResult:
    """Execute every event on every backend; stop at the first disagreement.

    A workload generator is driven by the first backend's answers (put the
    reference first); a plain iterable of events is just replayed.
    """
    reference, others = backends[0], backends[1:]
    n = 0

    def run_all(event: Event) -> dict:
        return reference.run(event)

    if hasattr(source, "send"):
        pairs = drive(source, run_all)
    else:
        pairs = ((e, reference.run(e)) for e in source)
    for n, (event, answer) in enumerate(pairs, 1):
        for other in others:
            theirs = other.run(event)
            if theirs != answer:
                return LockstepResult(
                    n,
                    Divergence(
                        n - 1,
                        event,
                        {reference.name: answer, other.name: theirs},
                        first_difference(answer, theirs) or "",
                    ),
                )
        if on_event is not None:
            on_event(n)
    return LockstepResult(n, None)
