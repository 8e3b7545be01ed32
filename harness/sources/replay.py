"""Running traces through backends and checking every answer.

- replay: one backend (impl by default); its answers must equal the trace's
  recorded answers and satisfy its hand-derived expectations.
- diff: impl and the installed vLLM side by side; their answers must be equal,
  and each is checked against the trace as in replay.
- record: the installed vLLM answers an input-only trace; a copy with the answers
  is written.

Each event goes through harness/lockstep.run_event. A call the reference
backend rejects (vLLM raises on it) is bad input: one line `file:line: field:
vLLM rejects this: ...`, exit 2, unless the trace recorded an answer for it
(then the backend diverges from the vLLM that answered).

A trace is first run in batches (lockstep.run_batch: each backend runs a
batch of events in turn, every answer checked after the batch). A batch that
fails anywhere sends the whole trace through again, event by event from fresh
backends, to find the failure and report it exactly as it happened; a trace
that passes is never run twice.

On the first divergence the trace is run again up to the event before it, to
observe the context a report needs (the blocks involved before and after, the
earlier events that touched the same request or blocks); the hot path keeps no
history.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from itertools import islice

from harness.backends.base import Backend, BackendStopped
from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_batch, run_event
from harness.backends.vllm_backend import EnvironmentProblem, installed_vllm_profile
from harness.core import pool_memory
from harness.core.cache_config import CacheConfig
from harness.core.compare import Failure, FailureKind, check_expected, first_difference
from harness.core.events import Event, EvictBlocks
from harness.core.exit_codes import ExitCode
from harness.core.outcome import DivergenceContext, TraceOutcome
from harness.core.traffic import Traffic
from harness.sources import side_by_side
from harness.trace import Trace, TraceError, TraceRecord, TraceWriter, open_trace
from harness.trace.codec import TraceHeader, cache_to_dict, event_to_dict
from harness.trace.reader import events_checked_elsewhere
from harness.trace.rules import random_none_hash
from impl.profiles import VersionProfile

RECORDED = "recorded"
EXPECTED = "expected"
# How many earlier related events a divergence report shows.
RELATED_EVENTS = 8
# Events per batch: long enough for a backend's code to stay warm, short
# enough that a batch's records are few (the reader streams).
BATCH = 64


BackendFactory = Callable[[TraceHeader, VersionProfile, bool], Backend]


def make_impl(header: TraceHeader, profile: VersionProfile, check: bool = False) -> Backend:
    return ImplBackend(header.cache, profile, check=check)


def make_vllm(header: TraceHeader, profile: VersionProfile, check: bool = False) -> Backend:
    from harness.backends.vllm_backend import VllmBackend

    return VllmBackend(header.cache, profile, check=True)


BACKENDS: dict[str, BackendFactory] = {"impl": make_impl, "vllm": make_vllm}


def exec_backend(command: str, cache: CacheConfig, profile: VersionProfile,
                 vllm_version: str, processes=None) -> Backend:
    """A foreign backend (specs/FOREIGN_BACKEND.md) for this config, handed
    the trace format's own encoding of the config and of each event; its
    process from `processes` (ForeignProcesses) when given."""
    from harness.backends.exec_backend import ExecBackend

    return ExecBackend(command, cache, profile, cache_to_dict(cache), vllm_version,
                       event_to_dict, processes=processes)


def make_exec(command: str) -> BackendFactory:
    def make(header: TraceHeader, profile: VersionProfile, check: bool = False) -> Backend:
        return exec_backend(command, header.cache, profile, header.vllm_version)
    return make


def backend_factory(name: str) -> BackendFactory:
    """impl, vllm, or exec:CMD."""
    if name.startswith("exec:"):
        return make_exec(name[len("exec:"):])
    return BACKENDS[name]


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
    backends = [backend_factory(n)(trace.header, trace.profile, False) for n in names]
    req = getattr(record.event, "req", None)
    wanted = set(blocks)
    related: deque = deque(maxlen=RELATED_EVENTS)
    reference, others = backends[0], tuple(backends[1:])
    for rec in trace.records:
        if rec.line >= divergence_line:
            break
        answer = run_event(rec.event, reference, others)
        if answer.__class__ is Failure:  # cannot happen before the first failure
            break
        if _touches(rec.event, answer, req, wanted):
            related.append({"line": rec.line, "event": event_to_dict(rec.event),
                            "answer": answer})
    before = {b.name: [b.block_state(i) for i in blocks] for b in backends}
    return DivergenceContext(blocks, before, after, list(related))


def _build(path: str, trace: Trace, names: list[str], check_invariants: bool) -> list[Backend]:
    """The named backends for the trace's cache config; a config a backend
    refuses to build is bad input, one line naming the header; a pool the
    machine has not the memory for is the environment, said before any
    backend builds it."""
    _check_pool(path, trace.header.cache.num_blocks, names)
    backends = []
    for name in names:
        try:
            backends.append(backend_factory(name)(trace.header, trace.profile,
                                                  check_invariants))
        except (EnvironmentProblem, BackendStopped):
            _close(backends)
            raise
        except Exception as e:  # noqa: BLE001 - the backend's own verdict on the config
            title = "vLLM" if name == "vllm" else name
            raise TraceError(path, 1, "cache", f"{title} rejects this: {type(e).__name__}: {e}"
                             ) from None
    return backends


def _check_pool(path: str, num_blocks: int, names: list[str]) -> None:
    estimate, problem = pool_memory.pool_problem(num_blocks, names,
                                                 pool_memory.available_bytes())
    if problem is not None:
        raise TraceError(path, 1, "cache.num_blocks", problem, ExitCode.ENVIRONMENT)
    if num_blocks >= pool_memory.NOTE_FROM_BLOCKS:
        print(f"{path}: {estimate.describe()} on {' and '.join(names)}", file=sys.stderr)


def check_trace(
    path: str,
    backend_names: list[str],
    progress: bool = False,
    writer_path: str | None = None,
    explicit: bool = True,
    check_invariants: bool = False,
    observe: bool = False,
    observe_pool: bool = False,
) -> TraceOutcome:
    """Run one trace through the named backends (in lockstep) and check it.

    With `writer_path`, the first backend's answers are written to a copy of the
    trace there (record). `explicit` is False for traces found in a folder: a
    trace for another vLLM version is then skipped rather than an error. With
    `check_invariants`, impl's invariant checker runs after every event and a
    violation counts as a divergence. With `observe` (or `observe_pool`: also
    the pool's states, for the picture), the outcome keeps the run's traffic.
    """
    outcome = TraceOutcome(path)
    t0 = time.perf_counter()
    writer: TraceWriter | None = None
    try:
        trace = _open_replayable(path, outcome, writer_path)
        backends = _backends_unless_skipped(path, trace, backend_names, explicit,
                                            check_invariants, outcome)
        if backends is None:
            return outcome
        if writer_path is not None:
            writer = _writer(writer_path, trace.header, backends[0])
        if observe or observe_pool:
            outcome.traffic = Traffic(pool_samples=observe_pool)
        backends = _run_checked(path, trace, backends, backend_names, check_invariants,
                                outcome, writer, progress)
        if outcome.divergence is not None:
            d = outcome.divergence
            record = d.record
            outcome.context = _context(path, backend_names, record.line, record,
                                       d.answers, backends)
        if writer is not None:
            _close_writer(writer, writer_path, outcome)
        _close(backends)
    except TraceError as e:
        outcome.error = e
        if writer is not None:
            writer.abort()
    except BackendStopped as e:
        _stopped(path, e, outcome)
    finally:
        outcome.seconds = time.perf_counter() - t0
    return outcome


def _stopped(path: str, e: BackendStopped, outcome: TraceOutcome) -> None:
    """A backend that could not go on: outside its capabilities (not
    covered, its own result), or a foreign process that failed (an error)."""
    if e.exit_code == ExitCode.OK:
        outcome.not_covered = str(e)
        return
    outcome.error = TraceError(path, getattr(e, "line", 1), "backend", str(e), e.exit_code)


def _close(backends) -> None:
    for b in backends:
        b.close()


def _open_replayable(path: str, outcome: TraceOutcome, writer_path: str | None) -> Trace:
    """The trace opened, its profile and truncation noted in the outcome; one
    whose NONE_HASH vLLM drew at random is bad input, unless it is being
    recorded (the recording vLLM's NONE_HASH is then written)."""
    trace = open_trace(path)
    outcome.profile = trace.profile.name
    outcome.truncated = trace.header.truncated
    if writer_path is None and random_none_hash(trace.header, trace.profile):
        raise TraceError(path, 1, "cache.hash_seed", "not replayable: random NONE_HASH "
                         f"(hash_seed null: vLLM {trace.header.vllm_version} drew NONE_HASH "
                         f"at random for {trace.header.cache.hash_algo} and the trace does "
                         "not record it in cache.none_hash; capture with PYTHONHASHSEED "
                         "set, or with kvconform's capture, which records it)")
    return trace


def _backends_unless_skipped(path: str, trace: Trace, names: list[str], explicit: bool,
                             check_invariants: bool, outcome: TraceOutcome
                             ) -> list[Backend] | None:
    """The named backends, or None (outcome.skipped says why) for a trace
    found in a folder that was recorded for another vLLM than the installed
    one. vLLM missing or without a profile is an environment error of the
    trace."""
    try:
        if "vllm" in names:
            installed = installed_vllm_profile()
            if installed.name != trace.profile.name and not explicit:
                outcome.skipped = (f"recorded for vLLM {trace.header.vllm_version}; "
                                   f"the installed vLLM has profile {installed.name}")
                return None
        return _build(path, trace, names, check_invariants)
    except EnvironmentProblem as e:
        raise TraceError(path, 1, "vllm_version", str(e), ExitCode.ENVIRONMENT) from None


def _writer(writer_path: str, header: TraceHeader, reference: Backend) -> TraceWriter:
    """record's copy of the trace, headed by the installed vLLM's version."""
    from harness.backends.vllm_backend import installed_vllm_version

    cache = header.cache
    if cache.hash_seed is None and cache.none_hash is None:
        # Whatever NONE_HASH vLLM drew, the recorded answers need it.
        cache = replace(cache, none_hash=reference.none_hash)
    return TraceWriter(writer_path, TraceHeader(
        installed_vllm_version(), header.source, cache, header.description,
        header.model, header.tensors, truncated=header.truncated))


def _run_checked(path: str, trace: Trace, backends: list[Backend], names: list[str],
                 check_invariants: bool, outcome: TraceOutcome, writer: TraceWriter | None,
                 progress: bool) -> list[Backend]:
    """Every event through the backends and checked, in batches where nothing
    needs each answer as it comes (observing, recording), else or after a
    failed batch event by event, from fresh backends; the run's time and event
    count go in the outcome. Returns the backends that ran last."""
    bar = _progress(trace) if progress else None
    _start(backends)
    t_run = time.perf_counter()
    try:
        batched = writer is None and outcome.traffic is None
        n = _run_batched(trace, backends, bar) if batched else None
        if n is None and batched:
            # A batch failed: find the failure event by event.
            trace = open_trace(path)
            backends = _build(path, trace, names, check_invariants)
            _start(backends)
            if bar is not None:
                bar.close()
                bar = _progress(trace)
        if n is None:
            n = _run(trace, backends, outcome, writer, bar)
    finally:
        if bar is not None:
            bar.close()
        gc.unfreeze()
    outcome.run_seconds = time.perf_counter() - t_run
    outcome.num_events = n
    return backends


def _close_writer(writer: TraceWriter, writer_path: str, outcome: TraceOutcome) -> None:
    """record's copy kept when the trace passed, removed when it diverged."""
    if outcome.divergence is None:
        writer.close()
        outcome.recorded = writer_path
    else:
        writer.abort()


def _start(backends: list[Backend]) -> None:
    """Each backend's once-per-run work (Backend.start: the free-queue
    digest's first walk, impl's full invariant check) before the clock; then
    the pools' blocks are frozen out of the garbage collector, as vLLM does
    after start-up: a full collection walks every live object, and would
    charge a pool of a million blocks to whichever event triggers it."""
    for b in backends:
        b.start()
    gc.freeze()


def _progress(trace: Trace):
    """A bar on a terminal once a trace takes more than a second, a line every
    few seconds otherwise (harness/core/progress.py)."""
    from harness.core.progress import Progress

    return Progress(trace.size, trace.path, unit="bytes", delay=1.0)


def _run_batched(trace: Trace, backends: list[Backend], bar) -> int | None:
    """The events through run_batch, each answer checked against the trace's
    recorded answer and expectations after its batch: the number of events
    when every check passed, None at the first batch with a failure. Two
    backends run side by side where the machine allows (the reference in a
    forked process, harness/sources/side_by_side.py), with the same answers."""
    if len(backends) == 2 and side_by_side.available():
        reference = side_by_side.BatchProcess(partial(_reference_batches, trace.path,
                                                      backends[0]))
        try:
            return _check_batches(trace, bar, partial(_beside, reference, backends[1]))
        finally:
            reference.close()
    return _check_batches(trace, bar, partial(_in_turn, backends[0], tuple(backends[1:])))


def _in_turn(reference: Backend, others: tuple[Backend, ...], events: list[Event]
             ) -> list | None:
    return run_batch(events, reference, others)


def _beside(reference: side_by_side.BatchProcess, other: Backend, events: list[Event]
            ) -> list | None:
    mine = run_batch(events, other, ())
    if mine is None or not reference.agrees(mine):
        return None
    return mine


def _reference_batches(path: str, reference: Backend):
    """In the forked process: the reference backend (inherited as built, the
    parent's copy) over the trace's events, read again without the checks
    the parent's reader makes (reader.events_checked_elsewhere)."""
    events = events_checked_elsewhere(path)

    def batches():
        while True:
            batch = list(islice(events, BATCH))
            if batch:
                answers = run_batch(batch, reference, ())
                yield answers
                if answers is None:
                    return
            if len(batch) < BATCH:
                return
    return batches()


def _check_batches(trace: Trace, bar, run: Callable[[list[Event]], list | None]
                   ) -> int | None:
    records = iter(trace.records)
    n = 0
    while True:
        batch, bad_input = _next_batch(records)
        if batch:
            answers = run([r.event for r in batch])
            if answers is None:
                return None
            for record, answer in zip(batch, answers):
                recorded, expect = record.answer, record.expect
                if recorded is not None and recorded != answer:
                    return None
                if expect is not None and check_expected(answer, expect) is not None:
                    return None
            n += len(batch)
            if bar is not None:
                bar.update(trace.bytes_read() - bar.n)
        if bad_input is not None:
            # Only now: a failure in the events before the bad line comes first.
            raise bad_input
        if len(batch) < BATCH:
            return n


def _next_batch(records) -> tuple[list[TraceRecord], TraceError | None]:
    """Up to BATCH records, and the reader's error if it met bad input."""
    batch: list[TraceRecord] = []
    try:
        for record in records:
            batch.append(record)
            if len(batch) == BATCH:
                break
    except TraceError as e:
        return batch, e
    return batch, None


def _run(trace: Trace, backends: list[Backend], outcome: TraceOutcome,
         writer: TraceWriter | None, bar) -> int:
    """The events through run_event, each agreed answer checked against the
    trace's recorded answer and expectations; stops at the first failure."""
    reference, others = backends[0], tuple(backends[1:])
    traffic = outcome.traffic
    n = 0
    last_bytes = 0
    line = 0
    for record in trace.records:
        n += 1
        try:
            answer = run_event(record.event, reference, others)
        except BackendStopped as e:
            e.line = record.line
            raise
        if answer.__class__ is Failure:
            if traffic is not None:
                traffic.finish(n - 1, record.line, reference)
            _stop(trace.path, n, record, answer, outcome)
            return n
        recorded = record.answer
        if traffic is not None:
            traffic.observe(n - 1, record.line, record.event, answer, reference)
        if recorded is not None and recorded != answer:
            outcome.divergence = _divergence(trace.path, n, record, {RECORDED: recorded,
                                                                     reference.name: answer})
            return _finish(traffic, n, record.line, reference)
        if record.expect is not None and check_expected(answer, record.expect) is not None:
            outcome.divergence = _divergence(trace.path, n, record, {EXPECTED: record.expect,
                                                                     reference.name: answer})
            return _finish(traffic, n, record.line, reference)
        if writer is not None:
            writer.write(record.event, answer, record.expect, record.note)
        line = record.line
        if bar is not None and n % 4096 == 0:
            done = trace.bytes_read()
            bar.update(done - last_bytes)
            last_bytes = done
    return _finish(traffic, n, line, reference)


def _finish(traffic: Traffic | None, n: int, line: int, reference: Backend) -> int:
    if traffic is not None and n:
        traffic.finish(n - 1, line, reference)
    return n


def _stop(path: str, n: int, record: TraceRecord, failure: Failure,
          outcome: TraceOutcome) -> None:
    """A failure of run_event, placed in the trace. A rejection is bad input
    (one line), unless the trace recorded an answer for the call: then the
    backend that refused it diverges from the vLLM that answered it."""
    recorded = record.answer
    if failure.kind is FailureKind.REJECTED and recorded is None:
        raise TraceError(path, record.line, failure.field, failure.message)
    if failure.kind is FailureKind.REJECTED:
        failure.kind = FailureKind.DIVERGED
    if recorded is not None and len(failure.answers) == 1:
        failure.answers = {RECORDED: recorded, **failure.answers}
    _place(path, n, record, failure)
    outcome.divergence = failure


def _divergence(path: str, n: int, record: TraceRecord, answers: dict) -> Failure:
    a, b = list(answers.values())
    if EXPECTED in answers:
        field_ = next((k for k in a if b.get(k) != a[k]), "")
    else:
        field_ = first_difference(a, b) or ""
    return _place(path, n, record, Failure(FailureKind.DIVERGED, record.event, answers, field_))


def _place(path: str, n: int, record: TraceRecord, failure: Failure) -> Failure:
    """Where the failure is: the event's line, or the line of the recorded
    answer / expectation it contradicts (YAML traces)."""
    failure.index, failure.path, failure.record = n - 1, path, record
    line = record.line
    if EXPECTED in failure.answers:
        line = record.expect_line or line
    elif RECORDED in failure.answers:
        line = record.answer_line or line
    failure.line = line
    return failure
