"""Events: the calls a scheduler makes on the KV cache manager, one per object.

This is the input side of the driver protocol (specs/ARCHITECTURE.md): every
backend executes these and answers each with a plain JSON-able dict, so that the
answers of impl, of vLLM and of a recorded trace compare with `==`.

Request state that the scheduler owns (num_computed_tokens, status, preemption
count) is advanced by the backend the way vLLM's scheduler advances it:
- `Allocate` that succeeds: num_computed_tokens += hit + external + new tokens,
  status RUNNING (WAITING_FOR_REMOTE_KVS when caching is delayed for a KV load);
- `Preempt`: blocks freed, num_computed_tokens = 0, num_preemptions += 1.
A `Lookup` is consumed by the request's next `Allocate`, which adopts its hit.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import ClassVar

# A request's LoRA adapter and multimodal placeholders are plain data shared
# with impl's request; events are built with them.
from impl.request import LoRA, MMFeature  # noqa: F401


@dataclass(frozen=True, slots=True)
class PromptEmbeds:
    """Seeded float32 prompt embeddings, `dim` values a token.

    Real embeddings would bloat traces; these are reproducible from the seed, and
    both backends hash the very same bytes.
    """

    dim: int
    seed: int

    def to_bytes(self, num_tokens: int) -> bytes:
        n = num_tokens * self.dim
        # A small LCG: deterministic, platform independent, no numpy needed.
        x = self.seed & 0xFFFFFFFF
        vals = []
        for _ in range(n):
            x = (1103515245 * x + 12345) & 0x7FFFFFFF
            vals.append(x / 0x7FFFFFFF - 0.5)
        return struct.pack(f"<{n}f", *vals)


@dataclass(slots=True)
class Event:
    kind: ClassVar[str] = ""


@dataclass(slots=True)
class AddRequest(Event):
    """A request arrives; its prompt's full blocks are hashed.
    Answer: {"block_hashes": [hex, ...]}."""

    kind: ClassVar[str] = "add_request"
    req: str
    prompt: list[int]
    lora: LoRA | None = None
    cache_salt: str | None = None
    mm: tuple[MMFeature, ...] = ()
    # With embeddings the prompt's token ids are zeros, as in vLLM.
    prompt_embeds: PromptEmbeds | None = None
    skip_reading_prefix_cache: bool = False
    session_id: str | None = None
    # "full": hits are announced again as KV events (vLLM: the sampling
    # params' extra argument kv_cache_report_mode).
    kv_cache_report_mode: str = "incremental"


@dataclass(slots=True)
class Lookup(Event):
    """get_computed_blocks. Answer: {"hit_tokens": n, "block_ids": [[...], ...]},
    plus "shared_prefix_boundary" (when not 0) in traces whose cache config
    reads it (CacheConfig.reports_shared_prefix_boundary). The request keeps
    the boundary, as the scheduler stores it. `max_cache_hit_length` bounds
    the hit (0.33; None: the request's tokens - 1). `for_connector`: the
    lookup a scheduler with a KV connector makes instead
    (get_computed_blocks_for_connector, 0.27+), whose answer adds
    "hit_diverged" (full attention's hit ran deeper than another group's)."""

    kind: ClassVar[str] = "lookup"
    req: str
    max_cache_hit_length: int | None = None
    for_connector: bool = False


@dataclass(slots=True)
class TruncateComputedBlocks(Event):
    """truncate_computed_blocks on the request's pending lookup hit (the
    scheduler cuts a local hit back to a block boundary when a connector's
    external hit covers more, 0.27+): the hit the next allocate adopts
    becomes its first `num_computed_tokens` tokens. Answer: {"block_ids":
    [[...], ...]}, the cut hit."""

    kind: ClassVar[str] = "truncate_computed_blocks"
    req: str
    num_computed_tokens: int


@dataclass(slots=True)
class Allocate(Event):
    """allocate_slots. Answer: {"block_ids": [[new ids per group]]} or
    {"refused": true}. `num_encoder_tokens` sizes the cross-attention groups
    (encoder-decoder models; the scheduler passes it at admission)."""

    kind: ClassVar[str] = "allocate"
    req: str
    num_new_tokens: int
    num_lookahead_tokens: int = 0
    num_external_computed_tokens: int = 0
    delay_cache_blocks: bool = False
    num_encoder_tokens: int = 0
    full_sequence_must_fit: bool = False
    reserved_blocks: int = 0
    has_scheduled_reqs: bool = True


@dataclass(slots=True)
class AppendTokens(Event):
    """Output tokens appended (update_from_output).
    Answer: {"block_hashes": [hex of newly full blocks]}."""

    kind: ClassVar[str] = "append_tokens"
    req: str
    tokens: list[int]


@dataclass(slots=True)
class CacheBlocks(Event):
    """cache_blocks, e.g. once a delayed KV load finished (a request waiting for
    that load is then waiting to be scheduled again). Answer: {}."""

    kind: ClassVar[str] = "cache_blocks"
    req: str
    num_computed_tokens: int


@dataclass(slots=True)
class RecordStats(Event):
    """record_prefix_cache_stats at admission (0.32+). Answer: {}."""

    kind: ClassVar[str] = "record_stats"
    req: str
    num_hits: int


@dataclass(slots=True)
class EstimateCachedTokens(Event):
    """estimate_cached_tokens: how much of the request's prefix its blocks
    hold keyed in every group that counts (the scheduler's prefill stats at
    the request's first output; 0.26+). Answer: {"num_tokens": n}."""

    kind: ClassVar[str] = "estimate_cached_tokens"
    req: str


@dataclass(slots=True)
class GetBlockIdsForComputedTokens(Event):
    """get_block_ids_for_computed_tokens: the request's block ids, the
    groups whose tables follow its tokens cut to `num_computed_tokens` (what
    a finishing request hands its KV connector; 0.25+).
    Answer: {"block_ids": [[ids per group]]}."""

    kind: ClassVar[str] = "get_block_ids_for_computed_tokens"
    req: str
    num_computed_tokens: int


@dataclass(slots=True)
class GetNumCommonPrefixBlocks(Event):
    """get_num_common_prefix_blocks of a running request: per group, the
    leading blocks every request with blocks there shares (cascade
    attention; zeros from 0.32, which removed it).
    Answer: {"blocks": [n per group]}."""

    kind: ClassVar[str] = "get_num_common_prefix_blocks"
    req: str


@dataclass(slots=True)
class Free(Event):
    """The request finished: free its blocks and forget it. Answer: {}."""

    kind: ClassVar[str] = "free"
    req: str


@dataclass(slots=True)
class Preempt(Event):
    """The scheduler preempts the request: free its blocks, keep it waiting with
    num_computed_tokens = 0. Answer: {}."""

    kind: ClassVar[str] = "preempt"
    req: str


@dataclass(slots=True)
class ResetPrefixCache(Event):
    """Answer: {"ok": bool} (refused while blocks are held)."""

    kind: ClassVar[str] = "reset_prefix_cache"


@dataclass(slots=True)
class EvictBlocks(Event):
    """Drop blocks from the prefix cache (a KV connector's report). Answer: {}."""

    kind: ClassVar[str] = "evict_blocks"
    block_ids: list[int]


@dataclass(slots=True)
class Step(Event):
    """new_step_starts: a scheduler step boundary. Answer: {}."""

    kind: ClassVar[str] = "step"


@dataclass(slots=True)
class TakeBlockCopies(Event):
    """The scheduler drains the copy-on-write copies its allocations queued
    (take_kv_cache_block_copies, end of every schedule pass) and releases the
    blocks they kept referenced. Answer: {"copies": [[source, copy], ...]}.
    Copies exist only after hits ending inside a block (0.32 hybrid models with
    hash_block_size < block_size); otherwise the answer is empty."""

    kind: ClassVar[str] = "take_block_copies"


@dataclass(slots=True)
class TakeBoundaryStateOffloads(Event):
    """The scheduler drains the Mamba "align" boundary states offered to a KV
    connector (take_boundary_state_offloads, end of every schedule pass).
    Answer: {"offloads": {req: [[group, block_id, boundary_tokens], ...]}}."""

    kind: ClassVar[str] = "take_boundary_state_offloads"


@dataclass(slots=True)
class FinalizePartialTailOffloads(Event):
    """A producer request finishes with a KV connector: its prompt-tail
    states still in its own blocks (finalize_partial_tail_offloads).
    Answer: {"offloads": [[group, block_id, boundary_tokens], ...]}."""

    kind: ClassVar[str] = "finalize_partial_tail_offloads"
    req: str


@dataclass(slots=True)
class HiSparseStep(Event):
    """What HiSparse's connector asks of the coordinator when a step is
    scheduled (its build_connector_meta), for the scheduled requests given as
    [req, tokens computed before the step, tokens scheduled]: the residency
    work (advance_scheduled, to min(computed + scheduled, request tokens)),
    then the step's transfers, host copies, row mirrors, whether every page is
    on the GPU, and the residency updates. Answer: {"transfers": [{transfer_id,
    host_block_id, resident_block_ids, after_forward, restore}], "host_copies":
    [[source, copy]], "mirrors": {req: [[[source rows], host row, rows]]},
    "all_resident": bool, "residency": {req: {"pages": [...], "block_ids":
    [[ids per resident group]]}}}."""

    kind: ClassVar[str] = "hisparse_step"
    scheduled: tuple[tuple[str, int, int], ...] = ()


@dataclass(slots=True)
class HiSparseAck(Event):
    """What the workers report back (HiSparse's update_connector_output), in
    its order: host imports finished (`failed` ones too: they make nothing
    readable), host copies done (by copy block id), then per transfer id how
    many workers run it and how many more finished it ([id, count] pairs).
    Answer: {}."""

    kind: ClassVar[str] = "hisparse_ack"
    finished_imports: tuple[str, ...] = ()
    failed_imports: tuple[str, ...] = ()
    copies_done: tuple[int, ...] = ()
    enqueued: tuple[tuple[int, int], ...] = ()
    completed: tuple[tuple[int, int], ...] = ()


# What a checkpoint observes when it names no fields.
DEFAULT_CHECKPOINT_FIELDS = ("free_queue", "num_free", "usage", "stats", "events")
CHECKPOINT_FIELDS = (*DEFAULT_CHECKPOINT_FIELDS, "free_queue_digest")
# Asked for by name only (a default checkpoint leaves them out): HiSparse's
# host pool and pending work.
OPTIONAL_CHECKPOINT_FIELDS = ("hisparse",)


@dataclass(slots=True)
class Checkpoint(Event):
    """Observe state. Answer: one key per requested field:
    free_queue (block ids, head first), num_free, usage, stats (snapshot, resets
    them), events (drained KV events), free_queue_digest (the free queue's
    order as 16 hex digits, kept up to date as it changes: O(1) at any pool
    size; harness/backends/free_queue_digest.py), and, named only, hisparse
    ({"host_free_queue", "pending_work", "pending_reclamation"})."""

    kind: ClassVar[str] = "checkpoint"
    fields: tuple[str, ...] = DEFAULT_CHECKPOINT_FIELDS

    def __post_init__(self) -> None:
        unknown = [f for f in self.fields
                   if f not in CHECKPOINT_FIELDS and f not in OPTIONAL_CHECKPOINT_FIELDS]
        if unknown:
            raise ValueError(f"unknown checkpoint field(s) {unknown}")


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        AddRequest, Lookup, TruncateComputedBlocks, Allocate, AppendTokens, CacheBlocks,
        RecordStats, EstimateCachedTokens, GetBlockIdsForComputedTokens, GetNumCommonPrefixBlocks,
        Free, Preempt, ResetPrefixCache, EvictBlocks, Step, TakeBlockCopies, Checkpoint,
        TakeBoundaryStateOffloads, FinalizePartialTailOffloads,
        HiSparseStep, HiSparseAck,
    )
}


# A generator of events that is sent each event's agreed answer (a seeded
# workload decides its next call from the last answer).
EventStream = Generator[Event, dict, None]
