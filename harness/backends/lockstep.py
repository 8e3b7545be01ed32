"""One event on every backend: the step every run of the harness is made of.

`run_event(event, reference, others)` executes the event on the reference
backend, then on each other backend, and compares. It returns either the
reference's answer (a dict: every backend gave the same one) or a Failure
(harness/core/compare.py), whatever happened:

- an answer that differs from the reference's            -> DIVERGED
- an exception in another backend where the reference answered -> DIVERGED
- impl's InvariantViolation (ImplBackend(check=True))     -> INVARIANT
- BackendError in the reference (the driver protocol cannot execute the
  call: an unknown request)                               -> REJECTED
- vLLM's AssertionError or ValueError (a call it does not accept), or any
  other exception in the reference that every other backend raises too -> REJECTED
- any other exception in vLLM (the reference) where another backend answers, or
  vLLM's own state breaking an invariant (UpstreamViolation) -> UPSTREAM

replay/diff/record (harness/sources/replay.py), the seeded workloads (run_lockstep
below) and the fuzz driver (harness/fuzz/driver.py) all run their events
through it. The path where every backend agrees allocates nothing beyond what
the backends return: no per-event objects, no copies of the answers.

`run_batch(events, reference, others)` is the fast way through a recorded
trace: each backend runs the whole batch in turn, so its code and data stay
warm in the CPU's caches instead of being evicted by the other backend at every
event (about a tenth of a diff's time). It can only say that the batch passed:
at a failure every backend has already run past it, so the caller finds and
reports the failure with run_event, from fresh backends (harness/sources/replay.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from harness.backends.base import Backend, BackendError, BackendStopped
from harness.backends.vllm_invariants import UpstreamViolation
from harness.core.compare import Failure, FailureKind, first_difference
from harness.core.events import Event, EventStream
from impl.invariants import InvariantViolation

# The backend whose crashes are findings of their own (the oracle of vLLM),
# and how a backend is named in a one-line rejection.
_VLLM = "vllm"
_TITLES = {_VLLM: "vLLM"}
# How vLLM refuses a call it does not take (its argument asserts, its
# ValueErrors, a manager that says it does not do this, as cross-attention
# does for prefix caching), which trace/rules.py mirrors up front and impl
# need not: a refusal even where impl answers. Any other exception where impl
# answers (an IndexError, a KeyError) is a bug in vLLM.
_REFUSALS = (AssertionError, ValueError, NotImplementedError)
# How many of vLLM's frames a crash's site names.
_SITE_FRAMES = 4
# The checkpoint field that stands for the free queue's order.
DIGEST = "free_queue_digest"


def _raised(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _rejected(event: Event, backend: Backend, e: Exception) -> Failure:
    if isinstance(e, BackendError):
        message, field = str(e), e.field
    else:
        title = _TITLES.get(backend.name, backend.name)
        message, field = f"{title} rejects this: {_raised(e)}", event.kind
    return Failure(FailureKind.REJECTED, event, {backend.name: message}, field,
                   backend=backend.name, message=message)


def _upstream(event: Event, backend: Backend, message: str, answers: dict) -> Failure:
    title = _TITLES.get(backend.name, backend.name)
    message = f"{title} is wrong: {message}"
    return Failure(FailureKind.UPSTREAM, event, {backend.name: message, **answers},
                   event.kind, backend=backend.name, message=message)


def _refused(event: Event, reference: Backend, others: Sequence[Backend],
             e: Exception) -> Failure:
    """The reference raised: a rejection when it refused the call, or when
    every other backend raises otherwise (the call is likely bad, neither
    guards it); a bug in the reference where another answers. An exception
    of vLLM that every other backend raises alike (impl mirrors a crash of
    vLLM, as the reproducers of traces/upstream/ say), or that vLLM raises
    alone, is a crash of vLLM: a bug there too."""
    if isinstance(e, (BackendError, *_REFUSALS)):
        return _rejected(event, reference, e)
    answers, alike = {}, True
    for other in others:
        try:
            answers[other.name] = other.run(event)
        except Exception as theirs:  # noqa: BLE001 - it raises too: recorded as such
            answers[other.name] = _raised(theirs)
            alike = alike and type(theirs) is type(e)
            continue
        return _upstream(event, reference, f"raises {_raised(e)}{_site(e)}", answers)
    if alike and reference.name == _VLLM:
        return _upstream(event, reference, f"crashes: {_raised(e)}{_site(e)}", answers)
    return _rejected(event, reference, e)


def _site(e: BaseException) -> str:
    """Where inside vLLM the exception was raised: its last frames in the
    vllm package, outermost first, which tell a crash apart from others of
    its type (a sidecar of traces/upstream/ names one of them)."""
    chain = []
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("vllm."):
            chain.append(tb.tb_frame.f_code.co_qualname)
        tb = tb.tb_next
    return f" (in {' > '.join(chain[-_SITE_FRAMES:])})" if chain else ""


def crash_site(message: str) -> list[str]:
    """The functions of vLLM that a crash's message names (_site), outermost
    first; [] when it names none."""
    if " (in " not in message:
        return []
    return message.rsplit(" (in ", 1)[1].rstrip(")").split(" > ")


def _invariant(event: Event, answers: dict, backend: Backend, e: InvariantViolation) -> Failure:
    answers[backend.name] = f"invariant violated: {e}"
    return Failure(FailureKind.INVARIANT, event, answers)


def run_event(event: Event, reference: Backend, others: Sequence[Backend]) -> dict | Failure:
    """Run one event on the reference and every other backend; the agreed
    answer, or the Failure that ends the run."""
    try:
        answer = reference.run(event)
    except BackendStopped:
        raise
    except UpstreamViolation as e:
        return _upstream(event, reference, f"invariant violated: {e}", {})
    except InvariantViolation as e:
        return _invariant(event, {}, reference, e)
    except Exception as e:  # noqa: BLE001 - whatever the reference raises is its verdict
        return _refused(event, reference, others, e)
    for other in others:
        try:
            theirs = other.run(event)
        except BackendStopped:
            raise
        except InvariantViolation as e:
            return _invariant(event, {reference.name: answer}, other, e)
        except Exception as e:  # noqa: BLE001 - the reference answered; this one did not
            theirs = _raised(e)
        if theirs != answer:
            return _diverged(event, reference, answer, other, theirs)
    return answer


def run_batch(events: Sequence[Event], reference: Backend,
              others: Sequence[Backend]) -> list | None:
    """Every backend's answers to the events, when all agree; None when any
    backend raised or answered differently somewhere in the batch."""
    try:
        answers = list(map(reference.run, events))
        for other in others:
            if list(map(other.run, events)) != answers:
                return None
    except Exception:  # noqa: BLE001 - any failure is found again by run_event
        return None
    return answers


def _diverged(event: Event, reference: Backend, answer: dict, other: Backend,
              theirs) -> Failure:
    field = first_difference(answer, theirs) or ""
    if field == DIGEST and isinstance(theirs, dict) and "free_queue" not in answer:
        # The digests say the orders differ; the lists say where.
        answer = {**answer, "free_queue": reference.free_queue()}
        theirs = {**theirs, "free_queue": other.free_queue()}
        field = first_difference(answer["free_queue"], theirs["free_queue"], "free_queue") or field
    return Failure(FailureKind.DIVERGED, event, {reference.name: answer, other.name: theirs},
                   field)


@dataclass(slots=True)
class LockstepResult:
    num_events: int
    failure: Failure | None


def run_lockstep(
    source: EventStream | Iterable[Event],
    backends: list[Backend],
    on_event: Callable[[int], None] | None = None,
) -> LockstepResult:
    """Run every event of `source` through run_event; stop at the first Failure.

    A workload generator (harness/sources/workload.py) is sent each agreed answer, as a
    scheduler reads the answer before its next call; a plain iterable of events
    is just replayed.
    """
    reference, others = backends[0], tuple(backends[1:])
    n = 0
    if hasattr(source, "send"):
        try:
            event = next(source)
            while True:
                answer = run_event(event, reference, others)
                if answer.__class__ is Failure:
                    answer.index = n
                    return LockstepResult(n + 1, answer)
                n += 1
                if on_event is not None:
                    on_event(n)
                event = source.send(answer)
        except StopIteration:
            return LockstepResult(n, None)
    for event in source:
        answer = run_event(event, reference, others)
        if answer.__class__ is Failure:
            answer.index = n
            return LockstepResult(n + 1, answer)
        n += 1
        if on_event is not None:
            on_event(n)
    return LockstepResult(n, None)
