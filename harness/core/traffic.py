"""The traffic of a trace run, seen step by step: what `kvconform stats` prints
and `kvconform report` draws.

A `Traffic` watches a run (harness/sources/replay.py calls `observe` after every agreed
event, with the reference backend) and keeps, per scheduler step (the events
from one `step` to the next; per event for traces without steps):

- prefix-cache lookups: the tokens looked up and the tokens hit;
- preemptions, and blocks evicted from the prefix cache (the BlockRemoved
  events the backend queues, read without draining them: counted only for
  traces whose vLLM published KV events, `cache.enable_kv_cache_events`);
- pool usage at the step's end (the backend's own `usage`);

and per request: prompt length, the first lookup's hit, the most blocks held
at once, the steps it lived through, its preemptions. With `pool_samples`, the
block pool itself (Backend.pool_codes) at each step's end, for the picture;
long runs keep a thinned series of at most `MAX_SAMPLES` states.

Pure observation: it never changes a backend's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Pool states kept for the picture at most: beyond, every other one is dropped
# (and later states taken half as often), so memory stays bounded.
MAX_SAMPLES = 2400


@dataclass(slots=True)
class StepStats:
    step: int
    queries: int = 0  # tokens of the requests looked up
    hits: int = 0  # of them, tokens found in the prefix cache
    lookups: int = 0
    preemptions: int = 0
    evicted: int = 0  # blocks whose cached hash was dropped
    usage: float = 0.0  # of the pool, at the step's end


@dataclass(slots=True)
class RequestRow:
    req: str
    prompt: int
    first_step: int
    hit_tokens: int | None = None  # its first lookup's
    blocks: int = 0  # held now
    peak_blocks: int = 0
    last_step: int | None = None  # freed in this step (None: never freed)
    preemptions: int = 0
    tokens: int = 0  # known so far (prompt + appended)


@dataclass(slots=True)
class PoolSample:
    """The pool after some event: for the picture."""

    index: int  # of the event (0-based)
    line: int  # its trace line
    step: int
    codes: list[int]


@dataclass(slots=True)
class Traffic:
    pool_samples: bool = False
    steps: list[StepStats] = field(default_factory=list)
    requests: dict[str, RequestRow] = field(default_factory=dict)
    samples: list[PoolSample] = field(default_factory=list)
    request_index: dict[str, int] = field(default_factory=dict)  # request -> colour
    has_steps: bool = False
    num_events: int = 0
    num_blocks: int = 0
    # Whether evictions are counted: only from a backend that queues KV events.
    counts_evictions: bool = True
    _stride: int = 1
    _queue: object = None
    _seen: int = 0
    _hit_blocks: dict = field(default_factory=dict)  # request -> blocks its lookup hit

    # -- totals --------------------------------------------------------------------------

    @property
    def queries(self) -> int:
        return sum(s.queries for s in self.steps)

    @property
    def hits(self) -> int:
        return sum(s.hits for s in self.steps)

    @property
    def hit_rate(self) -> float | None:
        q = self.queries
        return self.hits / q if q else None

    @property
    def preemptions(self) -> int:
        return sum(s.preemptions for s in self.steps)

    @property
    def evicted(self) -> int | None:
        if not self.counts_evictions:
            return None
        return sum(s.evicted for s in self.steps)

    @property
    def peak_usage(self) -> float:
        return max((s.usage for s in self.steps), default=0.0)

    @property
    def never_freed(self) -> list[str]:
        return [r.req for r in self.requests.values() if r.last_step is None]

    def summary(self) -> dict:
        rate = self.hit_rate
        return {"events": self.num_events, "steps": len(self.steps) if self.has_steps else 0,
                "requests": len(self.requests), "never_freed": len(self.never_freed),
                "lookups": sum(s.lookups for s in self.steps), "queried_tokens": self.queries,
                "hit_tokens": self.hits, "hit_rate": None if rate is None else round(rate, 4),
                "preemptions": self.preemptions, "evicted_blocks": self.evicted,
                "peak_usage": round(self.peak_usage, 4)}

    # -- watching a run ------------------------------------------------------------------

    def observe(self, index: int, line: int, event, answer: dict, backend) -> None:
        """After event `index` (at trace `line`) ran and `answer` was agreed."""
        self.num_events += 1
        kind = event.kind
        if kind == "step":
            if not self.has_steps:
                self._first_step()
            else:
                self._close_step(index - 1, line, backend)
                self.steps.append(StepStats(len(self.steps)))
            return
        if not self.has_steps:
            self.steps.append(StepStats(len(self.steps)))
        now = self.steps[-1]
        step = now.step
        if kind == "add_request":
            n = len(event.prompt)
            self.requests[event.req] = RequestRow(event.req, n, step, tokens=n)
        elif kind == "append_tokens":
            self.requests[event.req].tokens += len(event.tokens)
        elif kind == "lookup":
            row = self.requests[event.req]
            now.lookups += 1
            now.queries += row.tokens
            now.hits += answer["hit_tokens"]
            if row.hit_tokens is None:
                row.hit_tokens = answer["hit_tokens"]
            # Adopted by the request's next allocation (harness/core/events.py).
            self._hit_blocks[event.req] = _count(answer["block_ids"])
        elif kind == "allocate":
            adopted = self._hit_blocks.pop(event.req, 0)
            ids = answer.get("block_ids")
            if ids is not None:
                row = self.requests[event.req]
                row.blocks += _count(ids) + adopted
                row.peak_blocks = max(row.peak_blocks, row.blocks)
        elif kind == "free":
            row = self.requests[event.req]
            row.last_step, row.blocks = step, 0
            self._hit_blocks.pop(event.req, None)
        elif kind == "preempt":
            self._hit_blocks.pop(event.req, None)
            row = self.requests[event.req]
            row.preemptions += 1
            row.blocks = 0
            now.preemptions += 1
        self._count_evictions(now, backend)
        if not self.has_steps:
            now.usage = backend.usage()
            self._sample(index, line, now.step, backend)

    def finish(self, index: int, line: int, backend) -> None:
        """After the last event the run got to (`index`, at trace `line`)."""
        if self.has_steps and self.steps:
            self._close_step(index, line, backend)
        elif self.pool_samples and backend is not None and (
                not self.samples or self.samples[-1].index != index):
            self._take(index, line, self.steps[-1].step if self.steps else 0, backend)

    def _first_step(self) -> None:
        # Events before the first step (if any) are its own step 0.
        self.has_steps = True
        merged = StepStats(0)
        for s in self.steps:
            merged.queries += s.queries
            merged.hits += s.hits
            merged.lookups += s.lookups
            merged.preemptions += s.preemptions
            merged.evicted += s.evicted
            merged.usage = s.usage
        for r in self.requests.values():
            r.first_step = 0
            if r.last_step is not None:
                r.last_step = 0
        self.steps = [merged] if self.steps else [StepStats(0)]
        self.samples.clear()
        self._stride = 1

    def _close_step(self, index: int, line: int, backend) -> None:
        now = self.steps[-1]
        now.usage = backend.usage()
        self._sample(index, line, now.step, backend)

    def _count_evictions(self, now: StepStats, backend) -> None:
        queue = backend.pending_kv_events()
        if queue is None:
            self.counts_evictions = False
            return
        if queue is not self._queue:  # drained by a checkpoint: a new list
            self._queue, self._seen = queue, 0
        for e in queue[self._seen:]:
            if type(e).__name__ == "BlockRemoved":
                now.evicted += len(e.block_hashes)
        self._seen = len(queue)

    def _sample(self, index: int, line: int, step: int, backend) -> None:
        if not self.pool_samples or (step if self.has_steps else index) % self._stride:
            return
        self._take(index, line, step, backend)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2]
            self._stride *= 2

    def _take(self, index: int, line: int, step: int, backend) -> None:
        codes = backend.pool_codes(self.request_index)
        self.num_blocks = len(codes)
        self.samples.append(PoolSample(index, line, step, codes))


def _count(block_ids: list[list[int]]) -> int:
    """Blocks of an answer's per-group ids, the null block (0) left out."""
    return sum(1 for group in block_ids for b in group if b)
