"""Per-step attention batches derived from a trace's allocations.

The trace is replayed on impl's backend (its answers are the block ids vLLM
gave, checked elsewhere by replay/diff). Block tables are kept the way vLLM's
scheduler and worker keep them: when a request is scheduled from waiting (new,
or preempted before) its row is every block the manager holds for it (prefix
hit, blocks for connector-loaded tokens, new blocks: the answer alone lacks the
first two); afterwards each allocation's new block ids are appended.

A successful `allocate` schedules the request's num_new_tokens query tokens,
at positions num_computed - num_new .. num_computed - 1 after the allocation;
tokens loaded by a KV connector (num_external_computed_tokens) sit just before
them and are written to the cache without being queried. Allocations between
two `step` events form one batch. A batch is handed out (and must be used
before the iteration continues) at the next `step`, at the end of the trace,
and before any event that releases blocks (free, preempt, prefix-cache reset,
eviction): blocks freed after a forward pass may be reused by the next one. A
request preempted in the step it was scheduled in leaves the batch, as the
scheduler drops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.attention.seeded import PrefixHasher, request_seed
from harness.backends.impl_backend import ImplBackend
from harness.core.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    EvictBlocks,
    Free,
    Lookup,
    Preempt,
    ResetPrefixCache,
    Step,
)
from harness.trace import Trace
from impl.attention_batch import ScheduledRequest
from impl.block_table import BlockTable

# KV cache group kinds the trace differential runs attention for (see
# differential.py for how each becomes a kinds.AttentionKind); mamba groups
# hold no attention and cross-attention groups need the encoder's tokens,
# which traces do not carry (cross attention is checked at kernel level).
ATTENTION_KINDS = ("full_attention", "sliding_window", "chunked_local_attention",
                   "sink_full_attention", "mla_attention")


@dataclass(slots=True)
class StepBatch:
    # 0-based number of the engine step: how many `step` events came before,
    # minus one (-1 for allocations before the first `step`).
    step: int
    line: int  # trace line of the batch's last allocation
    scheduled: list[ScheduledRequest]
    # Positions a KV connector loaded: written, not queried.
    external: list[ScheduledRequest]
    # One block table per KV cache group, the rows as they stand now.
    tables: list[BlockTable]
    hashers: dict[str, PrefixHasher]
    # Trace line of each scheduled request's allocation.
    lines: dict[str, int] = field(default_factory=dict)
    # Per group, each request's row as the trace's answers give it.
    trace_rows: list[dict[str, list[int]]] = field(default_factory=list)

    def hashes(self, req_id: str, positions: range) -> list[int]:
        """Prefix hashes of a request's tokens at positions."""
        return self.hashers[req_id].get(positions)

    def num_known(self, req_id: str) -> int:
        """How many of a request's tokens the trace has named so far (later
        positions, e.g. speculative ones, hash as unknown tokens)."""
        return len(self.hashers[req_id].hashes)


def _first_row(hit: list[int], held: list[int], new: list[int]) -> list[int]:
    """A request's first row as the trace gives it: its lookup's hit, then
    the blocks of connector-loaded tokens (which no answer names: taken from
    the replay's manager), then its allocation's new blocks."""
    middle = held[len(hit):len(held) - len(new)]
    return list(hit) + list(middle) + list(new)


def _max_blocks(max_model_len: int, block_size: int) -> int:
    # Lookahead slots may run a little past max_model_len.
    return -(-max_model_len // block_size) + 64


def iter_batches(trace: Trace) -> Iterator[StepBatch]:
    """Every non-empty batch of the trace, in order."""
    cache = trace.header.cache
    backend = ImplBackend(cache, trace.profile)
    tables = [BlockTable(g.block_size, _max_blocks(cache.max_model_len, g.block_size))
              for g in cache.groups]
    hashers: dict[str, PrefixHasher] = {}
    trace_rows: list[dict[str, list[int]]] = [{} for _ in cache.groups]
    hits: dict[str, list[list[int]]] = {}  # a lookup's hit, until the allocate adopts it
    step = -1
    batch = StepBatch(step, 0, [], [], tables, hashers, trace_rows=trace_rows)

    def flush():
        nonlocal batch
        done = batch
        batch = StepBatch(step, 0, [], [], tables, hashers, trace_rows=trace_rows)
        return done if done.scheduled or done.external else None

    for record in trace.records:
        ev = record.event
        if isinstance(ev, (Step, Free, ResetPrefixCache, EvictBlocks)):
            done = flush()
            if done is not None:
                yield done
        if isinstance(ev, Preempt):
            batch.scheduled = [s for s in batch.scheduled if s.req_id != ev.req]
            batch.external = [s for s in batch.external if s.req_id != ev.req]
            done = flush()
            if done is not None:
                yield done
        answer = backend.run(ev)
        told = record.answer if record.answer is not None else answer
        if isinstance(ev, Step):
            step += 1
            batch.step = step
        elif isinstance(ev, AddRequest):
            seed = request_seed(ev.cache_salt, ev.lora.name if ev.lora else None)
            if ev.prompt_embeds is not None:
                seed = request_seed(str(seed), f"embeds:{ev.prompt_embeds.seed}")
            hashers[ev.req] = PrefixHasher(seed)
            hashers[ev.req].extend(list(ev.prompt))
        elif isinstance(ev, AppendTokens):
            hashers[ev.req].extend(list(ev.tokens))
        elif isinstance(ev, Lookup):
            hits[ev.req] = [list(ids) for ids in told.get("block_ids", [])]
        elif isinstance(ev, Allocate):
            if "refused" in answer:
                continue
            held = backend.block_table(ev.req)
            hit = hits.pop(ev.req, None) or [[] for _ in tables]
            new = told.get("block_ids", answer["block_ids"])
            for g, table in enumerate(tables):
                if ev.req not in table.rows:
                    table.add_row(ev.req, held[g])
                    trace_rows[g][ev.req] = _first_row(hit[g], held[g], new[g])
                else:
                    table.append_row(ev.req, answer["block_ids"][g])
                    trace_rows[g][ev.req] += new[g]
            after = backend.requests[ev.req].num_computed_tokens
            start_new = after - ev.num_new_tokens
            if ev.num_external_computed_tokens:
                batch.external.append(ScheduledRequest(
                    ev.req, start_new - ev.num_external_computed_tokens,
                    ev.num_external_computed_tokens))
            if ev.num_new_tokens:
                batch.scheduled.append(ScheduledRequest(ev.req, start_new, ev.num_new_tokens))
                batch.lines[ev.req] = record.line
            batch.line = record.line
        elif isinstance(ev, (Free, Preempt)):
            hits.pop(ev.req, None)
            for table, rows in zip(tables, trace_rows):
                table.remove_row(ev.req)
                rows.pop(ev.req, None)
            if isinstance(ev, Free):
                hashers.pop(ev.req, None)
    done = flush()
    if done is not None:
        yield done
