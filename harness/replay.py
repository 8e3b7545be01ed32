"""Running traces through backends and checking every answer.

- replay: one backend (impl by default); its answers must equal the trace's
  recorded answers and satisfy its hand-derived expectations.
- diff: impl and the installed vLLM side by side; their answers must be equal,
  and each is checked against the trace as in replay.
- record: the installed vLLM answers an input-only trace; a copy with the answers
  is written.

On the first divergence the trace is run again up to the event before it, to
observe the context a report needs (the blocks involved before and after, the
earlier events that touched the same request or blocks); the hot path keeps no
history.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from harness.backends.base import Backend, BackendError
from harness.backends.impl_backend import ImplBackend
from harness.backends.vllm_backend import EnvironmentProblem, installed_vllm_profile
from harness.diff import Divergence, check_expected, first_difference
from harness.events import Event, EvictBlocks
from harness.exit_codes import ExitCode
from harness.trace import Trace, TraceError, TraceRecord, TraceWriter, open_trace
from harness.trace.codec import TraceHeader, event_to_dict
from impl.invariants import InvariantViolation
from impl.profiles import VersionProfile

RECORDED = "recorded"
EXPECTED = "expected"
# How many earlier related events a divergence report shows.
RELATED_EVENTS = 8


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
    divergence: Divergence | None = None
    context: DivergenceContext | None = None
    error: TraceError | None = None
    skipped: str | None = None
    recorded: str | None = None  # path written by record
    profile: str | None = None  # the trace's version profile, once its header is read
    # With observe_pool: per event (trace line, op, pool codes) of the first
    # backend, for the block-pool picture (Backend.pool_codes).
    pool_timeline: list[tuple[int, str, list[int]]] | None = None
    request_index: dict[str, int] | None = None

    @property
    def exit_code(self) -> ExitCode:
        if self.error is not None:
            return self.error.exit_code
        return ExitCode.DIVERGED if self.divergence is not None else ExitCode.OK


BackendFactory = Callable[[TraceHeader, VersionProfile, bool], Backend]


def make_impl(header: TraceHeader, profile: VersionProfile, check: bool = False) -> Backend:
    return ImplBackend(header.cache, profile, check=check)


def make_vllm(header: TraceHeader, profile: VersionProfile, check: bool = False) -> Backend:
    from harness.backends.vllm_backend import VllmBackend

    return VllmBackend(header.cache, profile)


BACKENDS: dict[str, BackendFactory] = {"impl": make_impl, "vllm": make_vllm}


def _involved_blocks(record: TraceRecord, answers: dict[str, dict], backends) -> list[int]:
    ids: set[int] = set()
    for answer in answers.values():
        if isinstance(answer, dict):
            for group in answer.get("block_ids", ()):
                ids.update(group)
    event = record.event
    if isinstance(event, EvictBlocks):
        ids.update(event.block_ids)
    req = getattr(event, "req", None)
    if req is not None:
        for b in backends:
            if req in b.requests:
                for group in b.block_table(req):
                    ids.update(group)
    ids.discard(0)
    return sorted(ids)


def _touches(record_event: Event, answer: dict | None, req: str | None, blocks: set[int]) -> bool:
    if req is not None and getattr(record_event, "req", None) == req:
        return True
    if isinstance(record_event, EvictBlocks) and blocks.intersection(record_event.block_ids):
        return True
    if answer:
        for group in answer.get("block_ids", ()):
            if blocks.intersection(group):
                return True
    return False


def _context(
    path: str, names: list[str], divergence_line: int, record: TraceRecord,
    answers: dict[str, dict], after_backends: list[Backend],
) -> DivergenceContext:
    """Run the trace again up to the diverging event and look around it."""
    blocks = _involved_blocks(record, answers, after_backends)
    after = {b.name: [b.block_state(i) for i in blocks] for b in after_backends}
    trace = open_trace(path)
    backends = [BACKENDS[n](trace.header, trace.profile, False) for n in names]
    req = getattr(record.event, "req", None)
    wanted = set(blocks)
    related: deque = deque(maxlen=RELATED_EVENTS)
    for rec in trace.records:
        if rec.line >= divergence_line:
            break
        answer = None
        for b in backends:
            answer = b.run(rec.event)
        if _touches(rec.event, answer, req, wanted):
            related.append({"line": rec.line, "event": event_to_dict(rec.event),
                            "answer": answer})
    before = {b.name: [b.block_state(i) for i in blocks] for b in backends}
    return DivergenceContext(blocks, before, after, list(related))


def check_trace(
    path: str,
    backend_names: list[str],
    progress: bool = False,
    writer_path: str | None = None,
    explicit: bool = True,
    check_invariants: bool = False,
    observe_pool: bool = False,
) -> TraceOutcome:
    """Run one trace through the named backends (in lockstep) and check it.

    With `writer_path`, the first backend's answers are written to a copy of the
    trace there (record). `explicit` is False for traces found in a folder: a
    trace for another vLLM version is then skipped rather than an error. With
    `check_invariants`, impl's invariant checker runs after every event and a
    violation counts as a divergence.
    """
    outcome = TraceOutcome(path)
    t0 = time.perf_counter()
    writer: TraceWriter | None = None
    try:
        trace = open_trace(path)
        outcome.profile = trace.profile.name
        try:
            if "vllm" in backend_names:
                installed = installed_vllm_profile()
                if installed.name != trace.profile.name and not explicit:
                    outcome.skipped = (f"recorded for vLLM {trace.header.vllm_version}; "
                                       f"the installed vLLM has profile {installed.name}")
                    return outcome
            backends = [BACKENDS[n](trace.header, trace.profile, check_invariants)
                        for n in backend_names]
        except EnvironmentProblem as e:
            raise TraceError(path, 1, "vllm_version", str(e), ExitCode.ENVIRONMENT) from None
        if writer_path is not None:
            from harness.backends.vllm_backend import installed_vllm_version

            header = trace.header
            writer = TraceWriter(writer_path, TraceHeader(
                installed_vllm_version(), header.source, header.cache, header.description,
                header.model, header.tensors))
        bar = _progress(trace) if progress else None
        if observe_pool:
            outcome.pool_timeline, outcome.request_index = [], {}
        t_run = time.perf_counter()
        n = _run(trace, backends, outcome, writer, bar)
        outcome.run_seconds = time.perf_counter() - t_run
        outcome.num_events = n
        if outcome.divergence is not None:
            d = outcome.divergence
            record = d.record
            outcome.context = _context(path, backend_names, record.line, record,
                                       d.answers, backends)
        if writer is not None:
            if outcome.divergence is None:
                writer.close()
                outcome.recorded = writer_path
            else:
                writer.abort()
    except TraceError as e:
        outcome.error = e
        if writer is not None:
            writer.abort()
    finally:
        outcome.seconds = time.perf_counter() - t0
    return outcome


def _progress(trace: Trace):
    if not sys.stderr.isatty() or trace.size < (1 << 20):
        return None
    from tqdm import tqdm

    return tqdm(total=trace.size, unit="B", unit_scale=True, desc=trace.path, leave=False)


def _run(trace: Trace, backends: list[Backend], outcome: TraceOutcome,
         writer: TraceWriter | None, bar) -> int:
    path = trace.path
    reference, others = backends[0], backends[1:]
    timeline, request_index = outcome.pool_timeline, outcome.request_index
    n = 0
    last_bytes = 0
    for record in trace.records:
        n += 1
        event = record.event
        try:
            answer = reference.run(event)
            theirs = [(b.name, b.run(event)) for b in others]
            if timeline is not None:
                timeline.append((record.line, event.kind, reference.pool_codes(request_index)))
        except InvariantViolation as e:
            outcome.divergence = _divergence(path, n, record, {
                RECORDED: record.answer, "impl": f"invariant violated: {e}"})
            return n
        except BackendError as e:
            raise TraceError(path, record.line, "op", str(e)) from None
        except ValueError as e:  # the manager refuses the call itself
            raise TraceError(path, record.line, event.kind, f"{type(e).__name__}: {e}") from None
        for name, other in theirs:
            if other != answer:
                outcome.divergence = _divergence(path, n, record, {reference.name: answer,
                                                                   name: other})
                return n
        if record.answer is not None and record.answer != answer:
            outcome.divergence = _divergence(path, n, record, {RECORDED: record.answer,
                                                               reference.name: answer})
            return n
        if record.expect is not None:
            err = check_expected(answer, record.expect)
            if err is not None:
                outcome.divergence = _divergence(path, n, record, {EXPECTED: record.expect,
                                                                   reference.name: answer})
                return n
        if writer is not None:
            writer.write(event, answer, record.expect, record.note)
        if bar is not None and n % 4096 == 0:
            done = trace.bytes_read()
            bar.update(done - last_bytes)
            last_bytes = done
    if bar is not None:
        bar.close()
    return n


def _divergence(path: str, n: int, record: TraceRecord, answers: dict) -> Divergence:
    a, b = list(answers.values())
    line = record.line
    if EXPECTED in answers:
        field_ = next((k for k in a if b.get(k) != a[k]), "")
        line = record.expect_line or line
    else:
        field_ = first_difference(a, b) or ""
        if RECORDED in answers:
            line = record.answer_line or line
    return Divergence(n - 1, record.event, answers, field_, path=path, line=line,
                      record=record)

