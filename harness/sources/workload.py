"""A seeded, scheduler-like workload: the calls vLLM's scheduler would make.

It emulates the v1 scheduler's loop closely enough to produce realistic call
sequences (FCFS admission, chunked prefill under a token budget, decode one token
a step, preemption of the newest running request when the pool is full, requeue
at the head of the waiting queue), without a model: sampled tokens come from a
seeded RNG. Prompts share system prompts and continue earlier conversations, so
prefix hits, evictions and hash chains happen all the time.

It is a generator that needs the answers: `drive(workload, run)` feeds each
event's answer back, because what a scheduler does next depends on whether an
allocation was refused and how long a prefix hit was.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.core.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    Checkpoint,
    Event,
    EventStream,
    EvictBlocks,
    Free,
    Lookup,
    Preempt,
    RecordStats,
    ResetPrefixCache,
    Step,
    TakeBlockCopies,
)
from harness.sources.mamba_chunks import MambaChunking
from impl.profiles import StatsRecordedAt, VersionProfile


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    seed: int = 0
    num_requests: int = 120
    block_size: int = 16
    vocab: int = 50
    num_system_prompts: int = 4
    system_prompt_blocks: tuple[int, int] = (1, 6)
    user_tokens: tuple[int, int] = (1, 80)
    max_tokens: tuple[int, int] = (1, 60)
    # Probability that a new request continues a finished conversation.
    p_continue: float = 0.35
    token_budget: int = 256
    max_running: int = 16
    # New arrivals per step (at most); arrivals stop after num_requests, and
    # pause while max_waiting requests wait (a bounded queue, as behind a
    # server's admission control, keeps long workloads in constant memory).
    arrivals_per_step: int = 2
    max_waiting: int = 32
    # Rare administrative calls, per step.
    p_reset: float = 0.01
    p_evict: float = 0.01


@dataclass(slots=True)
class _Req:
    req_id: str
    tokens: list[int]
    max_tokens: int
    num_computed: int = 0
    num_output: int = 0
    num_prompt: int = 0


@dataclass(slots=True)
class _Step:
    """What one scheduler step has done so far."""

    budget: int
    scheduled: list[_Req] = field(default_factory=list)
    preempted: bool = False


@dataclass(slots=True)
class SchedulerWorkload:
    spec: WorkloadSpec
    profile: VersionProfile
    num_blocks: int
    rng: random.Random = field(init=False)
    waiting: list[_Req] = field(default_factory=list)
    running: list[_Req] = field(default_factory=list)
    # The most recent finished conversations, for multi-turn continuations;
    # bounded so that arbitrarily long workloads run in constant memory.
    finished_conversations: deque = field(default_factory=lambda: deque(maxlen=64))
    system_prompts: list[list[int]] = field(default_factory=list)
    num_added: int = 0
    # A model with a Mamba "align" group: prefill chunks end where vLLM's
    # scheduler ends them (harness/sources/mamba_chunks.py).
    mamba: MambaChunking | None = None
    # Hits may end inside blocks: the copy-on-write copies allocations queue
    # are drained at the end of every step, as vLLM's scheduler drains them.
    drain_copies: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.spec.seed)
        lo, hi = self.spec.system_prompt_blocks
        self.system_prompts = [
            self._tokens(self.rng.randint(lo, hi) * self.spec.block_size)
            for _ in range(self.spec.num_system_prompts)
        ]

    def _tokens(self, n: int) -> list[int]:
        v = self.spec.vocab
        return [self.rng.randrange(v) for _ in range(n)]

    def _new_prompt(self) -> list[int]:
        s = self.spec
        if self.finished_conversations and self.rng.random() < s.p_continue:
            base = list(self.rng.choice(self.finished_conversations))
        else:
            base = list(self.rng.choice(self.system_prompts))
        prompt = base + self._tokens(self.rng.randint(*s.user_tokens))
        # Keep prompt + output under what the pool can ever hold.
        limit = (self.num_blocks - 2) * s.block_size - s.max_tokens[1]
        return prompt[-limit:] if len(prompt) > limit else prompt

    def events(self) -> EventStream:
        """The calls of one scheduler step after another, phase by phase as
        vLLM's Scheduler.schedule and update_from_output make them."""
        s = self.spec
        record_at_admission = self.profile.stats_recorded_at is StatsRecordedAt.ADMISSION
        while self.num_added < s.num_requests or self.waiting or self.running:
            yield from self._arrivals()
            yield Step()
            step = _Step(s.token_budget)
            yield from self._schedule_running(step)
            yield from self._schedule_waiting(step, record_at_admission)
            yield from self._sample(step)
            if self.drain_copies:
                yield TakeBlockCopies()
            yield from self._admin()
            yield Checkpoint(("num_free", "usage", "events"))
        yield Checkpoint()

    def _arrivals(self) -> EventStream:
        s = self.spec
        for _ in range(self.rng.randint(0, s.arrivals_per_step)):
            if self.num_added >= s.num_requests or len(self.waiting) >= s.max_waiting:
                break
            req = _Req(f"r{self.num_added}", self._new_prompt(), self.rng.randint(*s.max_tokens))
            req.num_prompt = len(req.tokens)
            self.num_added += 1
            yield AddRequest(req.req_id, list(req.tokens))
            self.waiting.append(req)

    def _schedule_running(self, step: _Step) -> EventStream:
        """Running requests first, in admission order; a refused allocation
        preempts the newest running request and retries."""
        i = 0
        while i < len(self.running) and step.budget > 0:
            req = self.running[i]
            num_new = self._chunk(req, req.num_computed,
                                  min(len(req.tokens) - req.num_computed, step.budget))
            if num_new < 1:
                i += 1
                continue
            while True:
                answer = yield Allocate(req.req_id, num_new)
                if "refused" not in answer:
                    req.num_computed += num_new
                    step.budget -= num_new
                    step.scheduled.append(req)
                    i += 1
                    break
                victim = self.running.pop()
                step.preempted = True
                yield Preempt(victim.req_id)
                yield Checkpoint(("free_queue_digest", "num_free"))
                victim.num_computed = 0
                self.waiting.insert(0, victim)
                if victim is req:
                    break

    def _schedule_waiting(self, step: _Step, record_at_admission: bool) -> EventStream:
        """Then waiting requests (FCFS), unless someone was just preempted."""
        while (not step.preempted and self.waiting and step.budget > 0
               and len(self.running) < self.spec.max_running):
            req = self.waiting[0]
            answer = yield Lookup(req.req_id)
            hit = answer["hit_tokens"]
            num_new = self._chunk(req, hit, min(len(req.tokens) - hit, step.budget))
            if num_new < 1:
                break  # not schedulable this step; looked up again next step
            answer = yield Allocate(req.req_id, num_new)
            if "refused" in answer:
                break
            if record_at_admission:
                yield RecordStats(req.req_id, hit)
            req.num_computed = hit + num_new
            step.budget -= num_new
            self.waiting.pop(0)
            self.running.append(req)
            step.scheduled.append(req)

    def _chunk(self, req: _Req, start: int, num_new: int) -> int:
        if self.mamba is None:
            return num_new
        return self.mamba.split(start, num_new, req.num_prompt, len(req.tokens))

    def _sample(self, step: _Step) -> EventStream:
        """Model output: a token for every request whose prefill is done."""
        s = self.spec
        for req in step.scheduled:
            if req.num_computed < len(req.tokens):
                continue  # a prefill chunk; no token sampled
            token = self.rng.randrange(s.vocab)
            req.tokens.append(token)
            req.num_output += 1
            yield AppendTokens(req.req_id, [token])
            if req.num_output >= req.max_tokens:
                self.running.remove(req)
                yield Free(req.req_id)
                yield Checkpoint(("free_queue_digest", "num_free"))
                self.finished_conversations.append(req.tokens)

    def _admin(self) -> EventStream:
        """Rare administrative calls: a KV connector's evictions, a reset."""
        s = self.spec
        if self.rng.random() < s.p_evict:
            yield EvictBlocks(self.rng.sample(range(1, self.num_blocks),
                                              min(3, self.num_blocks - 1)))
        if self.rng.random() < s.p_reset:
            yield ResetPrefixCache()


def drive(stream: EventStream, run: Callable[[Event], dict]) -> Iterator[tuple[Event, dict]]:
    """Run a workload stream, feeding each answer back; yield (event, answer)."""
    try:
        event = next(stream)
        while True:
            answer = run(event)
            yield event, answer
            event = stream.send(answer)
    except StopIteration:
        return
