"""The worker differential: the scheduler's answers drive impl's and vLLM's
worker block tables the way vLLM's model runner does, and every step's
tables, slot mappings and kernel block tables are compared
(specs/WORKER_BLOCK_TABLE.md).

The events run on impl's backend (its answers are the block ids the manager
diff holds equal to vLLM's). The events between two `step` events form one
scheduler output: a successful `allocate` with tokens schedules its request
(num_new_tokens tokens from its num_computed_tokens before the allocation); a
request that was not in the batch brings every block it holds (new, resumed
after preemption, or back after a step out), one in the batch its new block
ids. `free` and `preempt` take a request out of the batch at the next step
(a request preempted in the step it was scheduled in leaves that step; one
freed in the step it was scheduled in ran first: the step's batch so far is
handed out before it leaves).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from harness.backends.impl_backend import ImplBackend
from harness.backends.worker_tables import ImplWorkerTables, WorkerLayout
from harness.core.cache_config import CacheConfig
from harness.core.events import AddRequest, Allocate, Event, Free, Preempt, Step
from harness.sources.worker_rows import BatchRows

# vLLM's default max_num_seqs: the rows a worker's tables have.
MAX_NUM_REQS = 256
# Steps whose context-parallel slot mappings are compared: vLLM's kernel runs
# in Triton's interpreter there, some milliseconds a call (the tables are
# compared on every step).
MAX_CP_SLOT_STEPS = 24
# The decode-first reorder of backends that split decodes from prefills
# (vLLM's reorder_batch_threshold; 1 for MLA and FlashInfer): run on every
# case, so that every row operation is exercised.
REORDER_THRESHOLD = 1


@dataclass(slots=True)
class Scheduled:
    req: str
    start: int  # the first scheduled position (num_computed_tokens before)
    num_tokens: int
    held: list[list[int]]
    new: list[list[int]]
    line: int


@dataclass(slots=True)
class SchedulerStep:
    step: int
    line: int
    leaving: list[str]  # freed or preempted since the last step
    scheduled: dict[str, Scheduled]
    first_time: set[str]  # requests scheduled for the first time


@dataclass(slots=True)
class WorkerOutcome:
    label: str
    events: int = 0
    steps: int = 0
    cp_slot_steps: int = 0
    seconds: float = 0.0
    # Seconds spent on the tables alone (the row operations and comparisons).
    table_seconds: float = 0.0
    divergence: str = ""


def scheduler_steps(pairs: Iterable[tuple[Event, dict, int]], backend: ImplBackend,
                    counter: WorkerOutcome,
                    prompt_len: dict[str, int]) -> Iterator[SchedulerStep]:
    """The scheduler outputs of (event, answer, line) triples the backend has
    run; `prompt_len` is filled with each request's prompt length."""
    step, leaving, scheduled, seen = -1, [], {}, set()
    first: set[str] = set()
    last_line = 0
    for ev, answer, line in pairs:
        counter.events += 1
        last_line = line
        if isinstance(ev, Step):
            if scheduled or leaving:
                yield SchedulerStep(step, line, leaving, scheduled, first)
            step, leaving, scheduled, first = step + 1, [], {}, set()
        elif isinstance(ev, AddRequest):
            prompt_len[ev.req] = len(ev.prompt)
        elif isinstance(ev, Allocate):
            if "refused" in answer or not ev.num_new_tokens:
                continue
            after = backend.requests[ev.req].num_computed_tokens
            new = [list(ids) for ids in answer["block_ids"]]
            s = scheduled.get(ev.req)
            if s is None:
                scheduled[ev.req] = Scheduled(ev.req, after - ev.num_new_tokens,
                                              ev.num_new_tokens, backend.block_table(ev.req),
                                              new, line)
                if ev.req not in seen:
                    seen.add(ev.req)
                    first.add(ev.req)
            else:  # a second allocation in the same step: one scheduled run
                s.num_tokens += ev.num_new_tokens
                s.held = backend.block_table(ev.req)
                s.new = [a + b for a, b in zip(s.new, new)]
        elif isinstance(ev, Free) and ev.req in scheduled:
            # It finished after this step's forward pass: the batch ran first.
            yield SchedulerStep(step, line, leaving, scheduled, first)
            leaving, scheduled, first = [ev.req], {}, set()
            seen.discard(ev.req)
        elif isinstance(ev, (Free, Preempt)):
            scheduled.pop(ev.req, None)  # preempted before the forward pass
            leaving.append(ev.req)
            if isinstance(ev, Free):
                seen.discard(ev.req)  # a later request of that name is new
    if scheduled or leaving:
        yield SchedulerStep(step, last_line, leaving, scheduled, first)


def _region(s: Scheduled, prompt_len: int) -> int:
    """The reorder's region: decode, short extend, long extend, prefill."""
    if s.start == 0:
        return 3
    if s.num_tokens > REORDER_THRESHOLD:
        return 2
    return 1 if s.start < prompt_len else 0


@dataclass(slots=True)
class WorkerCheck:
    """Both sides' tables, the batch's rows, and the per-step comparison."""

    layout: WorkerLayout
    sides: list  # [vLLM's, impl's]
    rows: BatchRows = field(init=False)

    def __post_init__(self) -> None:
        self.rows = BatchRows(self.sides)

    def apply(self, s: SchedulerStep, prompt_len: dict[str, int]) -> None:
        rows = self.rows
        for req in s.leaving:
            rows.remove(req)
        for req in [r for r in rows.row_of if r not in s.scheduled]:
            rows.remove(req)  # not scheduled this step: out of the batch
        to_add = []
        for req, sch in s.scheduled.items():
            if req in rows.row_of:
                rows.append(req, sch.new)
            else:
                to_add.append(sch)
        # The scheduler lists new requests before running and resumed ones.
        to_add.sort(key=lambda x: x.req not in s.first_time)
        for sch in to_add:
            rows.add(sch.req, sch.held, self.layout.max_num_reqs)
        rows.condense()
        rows.reorder({r: _region(x, prompt_len.get(r, 0)) for r, x in s.scheduled.items()})

    def compare(self, s: SchedulerStep, with_cp_slots: bool) -> str:
        """'' when both sides agree, else what differs first."""
        ref, other = self.sides
        n, hw = self.rows.num_reqs, self.rows.high_water
        ref_views = ref.views()
        for g, (a, b) in enumerate(zip(ref_views, other.views())):
            if not np.array_equal(a.num_blocks_per_row[:hw], b.num_blocks_per_row[:hw]):
                row = int(np.argmax(a.num_blocks_per_row[:hw] != b.num_blocks_per_row[:hw]))
                return self._say(s, g, row, "blocks in the row", int(a.num_blocks_per_row[row]),
                                 int(b.num_blocks_per_row[row]))
            if not np.array_equal(a.table[:hw], b.table[:hw]):
                row, col = (int(x) for x in np.argwhere(a.table[:hw] != b.table[:hw])[0])
                return self._say(s, g, row, f"block table entry {col}", a.table[row].tolist(),
                                 b.table[row].tolist(), col)
        qsl, positions, token_row = self._batch_tokens(s)
        for g in range(len(self.layout.block_sizes)):
            if not self.layout.slotted[g]:
                continue
            if self.layout.cp_world_size == 1 or with_cp_slots:
                self._check_width(s, g, positions, token_row)
                ranks = self.layout.context_parallel_ranks()
                got = zip(ref.slot_mappings(g, n, qsl, positions),
                          other.slot_mappings(g, n, qsl, positions), ranks)
                for x, y, cp in got:
                    if x.shape != y.shape:
                        return self._say(s, g, 0, "number of slots", x.shape, y.shape)
                    if not np.array_equal(x, y):
                        t = int(np.argmax(x != y))
                        where = ("" if cp.world_size == 1 else
                                 f" (context-parallel rank {cp.rank} of {cp.world_size}, "
                                 f"interleave {cp.interleave})")
                        return self._say(s, g, int(token_row[t]),
                                         f"slot of position {int(positions[t])}{where}",
                                         int(x[t]), int(y[t]))
            if self.layout.kernel_block_sizes[g] is not None and n:
                # The mapping is entry by entry and the whole tables were
                # compared above: the columns some row uses are enough
                # (the rest of a row is thousands of entries wide).
                cols = max(1, int(ref_views[g].num_blocks_per_row[:n].max()))
                x, y = ref.kernel_table(g, n, cols), other.kernel_table(g, n, cols)
                if x.shape != y.shape:
                    return self._say(s, g, 0, "kernel block table shape", x.shape, y.shape)
                if not np.array_equal(x, y):
                    row, col = (int(v) for v in np.argwhere(x != y)[0])
                    return self._say(s, g, row, f"kernel block table entry {col} (kernel "
                                     f"blocks of {self.layout.kernel_block_sizes[g]} tokens)",
                                     x[row].tolist(), y[row].tolist(), col)
        return ""

    def _batch_tokens(self, s: SchedulerStep):
        n = self.rows.num_reqs
        counts = [s.scheduled[self.rows.req_at[i]].num_tokens for i in range(n)]
        qsl = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=qsl[1:])
        starts = [s.scheduled[self.rows.req_at[i]].start for i in range(n)]
        token_row = np.repeat(np.arange(n), counts)
        positions = (np.arange(int(qsl[-1]), dtype=np.int64) - np.repeat(qsl[:-1], counts)
                     + np.repeat(np.asarray(starts, dtype=np.int64), counts))
        return qsl, positions, token_row

    def _check_width(self, s, g, positions, token_row) -> None:
        span = self.layout.block_sizes[g] * self.layout.cp_world_size
        width = self.sides[1].tables[g].width
        if positions.size and int(positions.max()) // span >= width:
            t = int(np.argmax(positions // span >= width))
            req = self.rows.req_at[int(token_row[t])]
            raise ValueError(f"line {s.scheduled[req].line}: request '{req}' schedules "
                             f"position {int(positions[t])}, past its row of {width} blocks "
                             f"in group {g}")

    def _say(self, s: SchedulerStep, group: int, row: int, what: str, ref, other,
             col: int | None = None) -> str:
        req = self.rows.req_at.get(row, "(no request)")
        line = s.scheduled[req].line if req in s.scheduled else s.line
        def short(v):
            if isinstance(v, list) and col is not None:
                lo = max(0, col - 4)
                return f"[...{lo}:] {v[lo:col + 5]}"
            return v
        return (f"worker step {s.step} (line {line}): group {group}, request '{req}' (row "
                f"{row}): {what} differs\n  vLLM: {short(ref)}\n  impl: {short(other)}")


def check_worker(label: str, cache: CacheConfig, pairs: Iterable[tuple[Event, dict, int]],
                 backend: ImplBackend) -> WorkerOutcome:
    """Drive both sides' worker tables from the events; the first difference
    ends the run."""
    import torch

    out = WorkerOutcome(label)
    t0 = time.perf_counter()
    # vLLM's CPU slot-mapping op spreads a batch of a few tokens over every
    # thread: 50 times slower than on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run_steps(out, cache, pairs, backend)
    finally:
        torch.set_num_threads(threads)
    out.seconds = time.perf_counter() - t0
    return out


def _run_steps(out: WorkerOutcome, cache: CacheConfig, pairs, backend: ImplBackend) -> None:
    from harness.backends.vllm_worker import VllmWorkerTables

    layout = WorkerLayout.of(cache, MAX_NUM_REQS, backend.profile)
    check = WorkerCheck(layout, [VllmWorkerTables(layout), ImplWorkerTables(layout)])
    prompt_len: dict[str, int] = {}
    for s in scheduler_steps(pairs, backend, out, prompt_len):
        t = time.perf_counter()
        check.apply(s, prompt_len)
        with_cp = layout.cp_world_size > 1 and out.cp_slot_steps < MAX_CP_SLOT_STEPS
        out.divergence = check.compare(s, with_cp)
        out.cp_slot_steps += with_cp
        out.steps += 1
        out.table_seconds += time.perf_counter() - t
        if out.divergence:
            break

