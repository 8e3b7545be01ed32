"""Version profiles: every behaviour of vLLM's KV cache that differs between releases.

A profile is data, not code. The impl and the vLLM adapter read its fields; nobody
writes `if version == ...` anywhere else. How vLLM is called (constructor
arguments, return arity) is not a behaviour: that is the vLLM adapter's table,
harness/backends/vllm_api.py. Each profile is checked against the followed
releases (impl/releases.py) from its own minor up to the next profile's
(`checked_against`, derived): a vLLM version whose minor release is among them
uses it, any other has no profile (exit 3). specs/PROFILES.md says what each
field means and where in vLLM's source it was read; specs/RELEASES.md is the
catalogue of what changed in which release and has the checklists ("Adding a
release", "Adding a behaviour field").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from impl.releases import RELEASES, minor_of, release_key


class FreeOrder(str, Enum):
    """Where blocks released by `free_blocks` re-enter the free queue.

    Callers pass blocks in eviction-priority order (a request's blocks reversed,
    so its tail is evicted first).
    """

    # 0.17-0.22: every released block is appended to the tail (LRU end).
    APPEND_ALL = "append_all"
    # 0.23: blocks a group drops as they leave its window or state (and a
    # sliding-window group's blocks when its request is freed) go to the head
    # when they carry no hash, to the tail otherwise; every other release of
    # blocks appends them all.
    UNHASHED_FIRST_ON_SKIP = "unhashed_first_on_skip"
    # 0.24-0.26, 0.28+: released blocks without a hash (or all, with caching
    # off) are prepended to the head so they are reused first (LIFO, GPU
    # locality); hashed blocks are appended (FIFO: the cache evicts in LRU order).
    UNHASHED_FIRST = "unhashed_first"
    # 0.27: as UNHASHED_FIRST with caching on; with caching off every released
    # block is appended.
    UNHASHED_FIRST_IF_CACHING = "unhashed_first_if_caching"


class NoneHashSeed(str, Enum):
    """How the parent hash of a request's first block (NONE_HASH) is seeded."""

    # 0.17-0.28: hash_fn(PYTHONHASHSEED) if set, else 32 random bytes.
    SEED_OR_RANDOM = "seed_or_random"
    # 0.29+: hash_fn(PYTHONHASHSEED) if set, else hash_fn("vllm-none-hash") for
    # the cryptographic algorithms and a random seed for xxhash ones.
    SEED_OR_FIXED_FOR_CRYPTO = "seed_or_fixed_for_crypto"


class MMExtraKey(str, Enum):
    """A multimodal item's extra key in the hash of a block it overlaps."""

    # 0.17-0.18: the item's identifier; an item ending exactly where the block
    # starts still counts as overlapping it.
    IDENTIFIER = "identifier"
    # 0.19+: (identifier, item offset - block start); an item ending at the
    # block's start no longer overlaps it. Tagged ("mm", ...) with
    # tagged_extra_keys (0.31+).
    IDENTIFIER_OFFSET = "identifier_offset"


class StatsRecordedAt(str, Enum):
    """When a prefix-cache lookup is counted in PrefixCacheStats."""

    # 0.17-0.26: inside get_computed_blocks, so a lookup whose allocation fails counts.
    LOOKUP = "lookup"
    # 0.27+: the scheduler calls record_prefix_cache_stats once the request is
    # admitted (allocation succeeded); get_computed_blocks records nothing.
    ADMISSION = "admission"


class CachedTokensEstimate(str, Enum):
    """The groups estimate_cached_tokens takes the least keyed prefix over."""

    # 0.26-0.29: every group but cross-attention / encoder-only ones, so a
    # group that is never prefix cached (0.29's circular buffer) makes it 0.
    ALL_BUT_ENCODER = "all_but_encoder"
    # 0.30+: only the prefix-cacheable groups among those.
    PREFIX_CACHEABLE = "prefix_cacheable"


class KVEventFields(str, Enum):
    """Which optional fields KV events carry. Each value has the previous
    one's fields and more."""

    # 0.17-0.19: none of them.
    NONE = "none"
    # 0.20-0.21: BlockStored and BlockRemoved carry group_idx.
    GROUP = "group"
    # 0.22-0.29: BlockStored also carries kv_cache_spec_kind and
    # kv_cache_spec_sliding_window.
    GROUP_SPEC = "group_spec"
    # 0.30-0.32: BlockStored also carries the request's session_id.
    GROUP_SPEC_SESSION = "group_spec_session"
    # 0.33: BlockStored also carries lookahead_token_ids (lookahead hashing).
    GROUP_SPEC_SESSION_LOOKAHEAD = "group_spec_session_lookahead"

    @property
    def level(self) -> int:
        return _EVENT_FIELD_LEVELS.index(self)

    @property
    def carries_group(self) -> bool:
        return self.level >= 1

    @property
    def carries_spec(self) -> bool:
        return self.level >= 2

    @property
    def carries_session(self) -> bool:
        return self.level >= 3


_EVENT_FIELD_LEVELS = tuple(KVEventFields)


class CoarseBlockHash(str, Enum):
    """How a group whose block size is a multiple of the hash block size derives
    its per-block hash from the request's hash-block-size hashes."""

    # 0.17-0.23: the concatenation of the block's hash-size hashes.
    CONCAT = "concat"
    # 0.24+: the last hash-size hash inside the block (it already chains over
    # the whole prefix).
    LAST = "last"


class ContextParallelBlockSize(str, Enum):
    """The block size a manager sees under decode/prefill context parallelism."""

    # 0.17-0.25: block_size * dcp * pcp, for every kind.
    DCP_TIMES_PCP = "dcp_times_pcp"
    # 0.26-0.28: block_size * dcp, for every kind (Mamba included); pcp no
    # longer scales blocks.
    DCP_ALL_KINDS = "dcp_all_kinds"
    # 0.29-0.30: block_size * dcp for full-attention specs (MLA and the other
    # kinds built on full attention, which vLLM shards across DCP ranks);
    # every other kind keeps its block size (replicated state and windows).
    DCP_FULL_ATTENTION = "dcp_full_attention"
    # 0.31+: block_size * dcp, only for specs whose KV is sharded across DCP
    # ranks (attention); Mamba state is replicated and keeps its block size.
    DCP_IF_SHARDED = "dcp_if_sharded"

    @property
    def spec_says_sharding(self) -> bool:
        """Whether a spec says itself if DCP shards it (`dcp_sharded`, 0.31+):
        before, the kind decides, and a replicated attention spec cannot be
        built."""
        return self is ContextParallelBlockSize.DCP_IF_SHARDED


class ExternalBlocksOrder(str, Enum):
    """When blocks for connector-loaded (external) tokens are allocated."""

    # 0.17-0.23: each group touches its hit and then allocates its external
    # blocks before the next group touches its own hit.
    PER_GROUP = "per_group"
    # 0.24+: every group touches its hit first, then every group allocates.
    AFTER_ALL_HITS = "after_all_hits"


class BlockSizesRule(str, Enum):
    """Which block sizes the scheduler works in and requests are hashed at."""

    # 0.17-0.19: hashes every cache block size x dcp x pcp tokens, whatever the
    # groups; a hybrid's hits align to the LCM of the group block sizes.
    CACHE_BLOCK_SIZE = "cache_block_size"
    # 0.20-0.25: one group: its block size x dcp x pcp for both; several: the
    # LCM for the scheduler, hashes every GCD of all groups' block sizes (or
    # prefix_match_unit); several under context parallelism: refused.
    CACHE_BLOCK_SIZE_FOR_ONE_GROUP = "cache_block_size_for_one_group"
    # 0.26-0.28: one group: block size x dcp; several: attention groups scaled
    # by dcp, the LCM for the scheduler, the GCD over every group for hashes.
    LCM_GCD_ALL_GROUPS = "lcm_gcd_all_groups"
    # 0.29+: as LCM_GCD_ALL_GROUPS, the GCD over the prefix-cacheable groups
    # only; one group scales by dcp only where its spec is DCP-sharded, and a
    # prefix_match_unit other than its block size is refused.
    LCM_GCD = "lcm_gcd"


class AdmissionControls(str, Enum):
    """Which admission arguments `allocate_slots` honours. Each value has the
    previous one's and more."""

    # 0.17-0.20: none.
    NONE = "none"
    # 0.21-0.22: full_sequence_must_fit (with the per-request cap of the
    # recycling kinds).
    FULL_SEQUENCE = "full_sequence"
    # 0.23: and reserved_blocks.
    RESERVED_BLOCKS = "reserved_blocks"
    # 0.24+: and has_scheduled_reqs with the manager's watermark.
    WATERMARK = "watermark"

    @property
    def args(self) -> tuple[str, ...]:
        """The allocate_slots keywords honoured."""
        return _ADMISSION_ARGS[: tuple(AdmissionControls).index(self)]


_ADMISSION_ARGS = ("full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs")


class SlidingWindowSparseCaching(str, Enum):
    """Which blocks a sliding-window group keys."""

    # 0.17-0.21: every full block.
    NONE = "none"
    # 0.22: in a hybrid model, only the blocks at the end of each scheduler
    # block that a hit there needs; a lone sliding-window group keys all.
    HYBRID_ONLY = "hybrid_only"
    # 0.23+: the reachable-block mask for every sliding-window group (a lone
    # window-1 group keys nothing).
    ALL = "all"


class PartialHitGating(str, Enum):
    """When a hybrid model's hits may end inside blocks (with partial_block_hits)."""

    # 0.26-0.27: some Mamba "align" group is larger than the hash block, and
    # no decode context parallelism.
    ANY_MAMBA_ALIGN = "any_mamba_align"
    # 0.28+: and every other prefix-cacheable group supports fine-grained
    # lookup or has blocks of the hash block size (0.29+: under DCP, a Mamba
    # block not smaller than the hash block will do).
    EVERY_GROUP_FINE = "every_group_fine"


class PromptTailBoundary(str, Enum):
    """Where a prompt's tail is registered as a partial entry (partial_block_hits),
    and where the scheduler ends a Mamba "align" prefill chunk."""

    # 0.26-0.31: the prompt's end rounded down to the hash block; a Mamba
    # group registers it only when it falls inside a block.
    PROMPT_END = "prompt_end"
    # 0.32+: a resend recomputes the prompt's last token, so the boundary is
    # (prompt - 1) rounded down to the hash block; a Mamba group registers it
    # at a block's end too (copying the block only when it falls inside).
    BEFORE_LAST_TOKEN = "before_last_token"

    def position(self, num_tokens: int, unit: int) -> int:
        """The boundary of a prompt (or sequence) of `num_tokens` on a grid of
        `unit` tokens."""
        if self is PromptTailBoundary.PROMPT_END:
            return num_tokens // unit * unit
        return max(num_tokens - 1, 0) // unit * unit


class MambaPartialTailRekey(str, Enum):
    """Registering a Mamba "align" prompt tail inside a block (partial_block_hits)."""

    # 0.26-0.32: the tail is registered (and marked cached this step, which
    # defers a sibling's hit on it) even when the block already holds that key.
    ALWAYS = "always"
    # 0.33: a block already keyed at that token count is left alone.
    UNLESS_KEYED = "unless_keyed"


class KVCacheTensorPlan(str, Enum):
    """How the per-layer KV cache tensors of a KV cache config are described."""

    # 0.17-0.23: KVCacheTensor(size, shared_by): one tensor per layer slot,
    # shared by one layer of every group; each layer views it as
    # (2, num_blocks, block_size, num_kv_heads, head_size).
    SHARED_BY = "shared_by"
    # 0.24-0.28: the same tensors, each with an offset and a block stride
    # (KVCacheTensor(size, shared_by, offset, block_stride)).
    SHARED_BY_WITH_OFFSETS = "shared_by_with_offsets"
    # 0.29+: KVCacheTensor(size, layers, layer_stride, block_stride, offset)
    # over one allocation; each layer a logical [num_blocks, heads, block, bytes] view.
    STRIDED = "strided"


class UnifyPadsPages(str, Enum):
    """How a hybrid model's page sizes are made uniform."""

    # 0.17-0.23: only by growing block sizes; a page that does not divide the
    # largest is refused.
    NEVER = "never"
    # 0.24-0.25: an attention page that does not divide the largest is padded
    # to it; Mamba pages are not.
    ATTENTION_ONLY = "attention_only"
    # 0.26+: a Mamba page, or an attention page that does not divide, is padded.
    ALWAYS = "always"

    def __bool__(self) -> bool:
        return self is not UnifyPadsPages.NEVER


class PrefixCacheRetention(str, Enum):
    """How a release takes a prefix-cache retention interval (sparse
    checkpoints of the groups that need few blocks for a hit, §9.2.1)."""

    # 0.17-0.22: none.
    NONE = "none"
    # 0.23-0.27 (where vLLM reads the interval from its environment, the
    # adapter's table says): only sliding-window groups thin out, any
    # interval (0 too) is refused for a model without one, and the only
    # reachable boundary kept is the prompt's (its last token recomputed).
    SLIDING_WINDOW_ONLY = "sliding_window_only"
    # 0.28: as 0.23-0.27, but Mamba groups thin out too (a model needs one of
    # the two kinds for any interval).
    ENVIRONMENT_WITH_MAMBA = "environment_with_mamba"
    # 0.29: KVCacheConfig.prefix_cache_retention_interval; sliding-window and
    # Mamba groups thin out, 0 is accepted for a model without either, but
    # the one reachable boundary kept is still the prompt's resend, under
    # EAGLE too (the coordinator has no get_replay_boundaries yet).
    KV_CACHE_CONFIG_RESEND_ONLY = "kv_cache_config_resend_only"
    # 0.30+: as 0.29, with both EAGLE replay boundaries kept.
    KV_CACHE_CONFIG = "kv_cache_config"

    def __bool__(self) -> bool:
        return self is not PrefixCacheRetention.NONE

    @property
    def thins_mamba(self) -> bool:
        return self not in (PrefixCacheRetention.NONE, PrefixCacheRetention.SLIDING_WINDOW_ONLY)

    @property
    def in_kv_cache_config(self) -> bool:
        """The interval is KVCacheConfig's (0.29+), where 0 passes for a model
        with nothing to thin; before, the engine's environment."""
        return self in (PrefixCacheRetention.KV_CACHE_CONFIG_RESEND_ONLY,
                        PrefixCacheRetention.KV_CACHE_CONFIG)

    @property
    def keeps_eagle_replay_boundaries(self) -> bool:
        return self is PrefixCacheRetention.KV_CACHE_CONFIG


class MambaPrefillCheckpoints(str, Enum):
    """Mamba "align" groups with prefill checkpoint blocks (a state exported
    inside a prefill chunk into the block before the running one, §9.4.2)."""

    # 0.17-0.29 (0.29 reserves blocks without exporting a position: an
    # older shape, not modelled): none.
    NONE = "none"
    # 0.30: 0.31's shape, except that every chunk whose checkpoint is valid
    # reserves its block (0.31 skips the chunks before the prefill end it is
    # given), retention 0 drops a chunk's checkpoint before the prompt is
    # cached even at the prompt's own boundary, and (with mamba_blocks_capped
    # false) a started request's checkpoint step asks for all it lacks.
    HASH_GRID_EVERY_CHUNK = "hash_grid_every_chunk"
    # 0.31: the checkpoint lies on the hash-block grid, (chunk end - 1)
    # rounded down, one unit lower under EAGLE; a checkpoint step takes its
    # scratch blocks anew and moves none; a chunk's checkpoint is dropped
    # only under retention 0 before the prompt's end.
    HASH_GRID = "hash_grid"
    # 0.32+: on the cache-hit alignment grid, under EAGLE the chunk end rounded
    # down less one unit; a checkpoint step moves its scratch blocks along
    # but the one in the checkpoint column; a checkpoint no retention mask
    # keeps is dropped.
    ALIGNMENT_GRID = "alignment_grid"

    def __bool__(self) -> bool:
        return self is not MambaPrefillCheckpoints.NONE

    @property
    def on_hash_grid(self) -> bool:
        return self in (MambaPrefillCheckpoints.HASH_GRID_EVERY_CHUNK,
                        MambaPrefillCheckpoints.HASH_GRID)


class EagleDropGroups(str, Enum):
    """Which KV cache groups drop the last matched unit of a prefix hit for
    an EAGLE / MTP drafter (specs/KV_CACHE_MANAGER.md section 15).

    `eagle_group_ids` is the same in both: the groups flagged as draft
    groups, or all of them when none is flagged and `use_eagle` is set."""

    # 0.28-0.32: every group of eagle_group_ids drops, use_eagle or not.
    FLAGGED_OR_ALL = "flagged_or_all"
    # 0.33: those groups drop only when use_eagle is set.
    FLAGGED_IF_USE_EAGLE = "flagged_if_use_eagle"


class BoundaryStateOffloads(str, Enum):
    """Which Mamba "align" boundary states a KV connector is handed
    (specs/KV_CACHE_MANAGER.md §9.4.3)."""

    # 0.17-0.27 (0.26-0.27 unread): none.
    NONE = "none"
    # 0.28: only each prompt-tail copy (take_partial_tail_offloads), which
    # the take pins (touches) until its request is freed: the copy is off
    # the request's table, nothing else keeps it.
    PINNED_PARTIAL_TAILS = "pinned_partial_tails"
    # 0.29: the blocks each cache step keys and each prompt-tail copy
    # (take_boundary_state_offloads, unpinned); a producer finishing before
    # its prompt-tail copy hands nothing (no finalize_partial_tail_offloads).
    OFFERS = "offers"
    # 0.30+: and that producer's table block itself, once.
    OFFERS_AND_FINALIZE = "offers_and_finalize"

    def __bool__(self) -> bool:
        return self is not BoundaryStateOffloads.NONE

    @property
    def pins_partial_tails(self) -> bool:
        return self is BoundaryStateOffloads.PINNED_PARTIAL_TAILS

    @property
    def offers_keyed_states(self) -> bool:
        return self in (BoundaryStateOffloads.OFFERS, BoundaryStateOffloads.OFFERS_AND_FINALIZE)

    @property
    def finalizes(self) -> bool:
        return self is BoundaryStateOffloads.OFFERS_AND_FINALIZE


class MambaEagleTailShift(str, Enum):
    """When a Mamba "align" group registers the prompt's tail state one hash
    unit lower under EAGLE (whose lookups match one unit past a boundary and
    drop it, §9.4)."""

    # 0.17-0.29: never; the tail sits at the prompt's boundary.
    NONE = "none"
    # 0.30: when the group is itself a dropping group (its use_eagle).
    DRAFT_GROUP = "draft_group"
    # 0.31+: whenever the manager is built with use_eagle
    # (drop_eagle_checkpoint_block), flagged or not.
    USE_EAGLE = "use_eagle"


class HiSparseResidency(str, Enum):
    """Where HiSparse records which GPU block a resident page is read from,
    when each step's residency work runs, and how the worker hears of it
    (specs/KV_CACHE_MANAGER.md section 14.6). Read only when a manager is
    built with HiSparse groups (releases before 0.30 have none)."""

    # 0.17-0.31 (read in 0.31; 0.30 has this shape, but its admission window
    # and adoption differ and are not modelled): a residency change is written
    # into the resident group's own table (a page moved to the host becomes
    # the null block, an adopted copy its block); the work of a step (write-
    # backs, then residency) runs in the resident group's cache step of every
    # allocation, prefix caching on or off; a request that lost a page is
    # reported with all its table rows (`take_block_table_updates`).
    TABLE_ROWS = "table_rows"
    # 0.32+: tables stay append-only and residency is an overlay on them; the
    # connector runs a step's work (`advance_scheduled`) and reads page-level
    # updates (`take_residency_updates`).
    OVERLAY = "overlay"


class HiSparseHostCapacity(str, Enum):
    """What HiSparse's source group does when its host pool cannot back a
    page (specs/KV_CACHE_MANAGER.md section 14.2). Read only with HiSparse
    groups (none before 0.30)."""

    # 0.17-0.30 (read in 0.30): best effort. Only pages a connector loads,
    # and a partial hit's private copy, need host blocks for the allocation
    # to go ahead; any other page that finds no free host block keeps a null
    # host entry (never written back, its GPU copy stays pinned), the copy
    # first.
    BEST_EFFORT = "best_effort"
    # 0.31+: every page takes a host block; an allocation the host pool
    # cannot back is refused.
    EVERY_PAGE = "every_page"


class TrailingDraftLayers(str, Enum):
    """When grouping takes a drafter's KV layers to be the last ones
    registered and flags the group of the last one (a drafter whose specs
    carry no marker; specs/KV_CACHE_MANAGER.md section 15). Read only with
    a drafter that drops hit tails."""

    # 0.17-0.30 (read in 0.30 and 0.29, which knows deepseek_v4 alone, not
    # deepseek_v41; 0.20-0.28 unread): only for a DeepSeek V4 model type,
    # whatever the speculative method, and only where the packed grouping
    # made the groups.
    DEEPSEEK_V4_PACKED = "deepseek_v4_packed"
    # 0.31+ (read in 0.31-0.32; 0.33 flags the groups of layers whose specs
    # say is_draft instead, which is not modelled): for any "mtp" method or
    # a DeepSeek V4 model type, on the packed and uniform-page paths, when
    # the groups cover the layers exactly.
    MTP_OR_DEEPSEEK_V4 = "mtp_or_deepseek_v4"


class HiSparseLayoutStage(str, Enum):
    """When sizing derives HiSparse's groups (source, indexer, resident, hot)
    from the model's MLA layers, and so what the groups between grouping and
    planning are (specs/KV_CACHE_MANAGER.md section 14.5). Read only with
    HiSparse on (no HiSparse before 0.30)."""

    # 0.17-0.30 (read in 0.30): grouping only puts the MLA layers in one
    # group ahead of the others' usual groups (and only when the model has
    # other layers); planning derives the groups from that first one. A
    # request's device bytes are then the indexer layers' and the other
    # groups' own usage (not whole pool blocks), the host pool is not checked
    # against max_model_len, auto-fit asks for a concurrency of one and every
    # worker plans with the smallest worker's memory.
    PLANNING = "planning"
    # 0.31+: grouping derives them; planning sizes the host pool for groups
    # already laid out.
    GROUPING = "grouping"


@dataclass(frozen=True, slots=True)
class VersionProfile:
    name: str
    # Exact releases whose source this profile was read from and checked
    # against (make matrix); every minor release among them uses it.
    checked_against: tuple[str, ...]
    free_order: FreeOrder
    none_hash_seed: NoneHashSeed
    # Extra hash keys as ("lora", name, path), ("mm", id, offset),
    # ("cache_salt", salt), ("prompt_embeds", digest) (0.31+) instead of the
    # bare lora name, mm key, salt and digest.
    tagged_extra_keys: bool
    mm_extra_key: MMExtraKey
    stats_recorded_at: StatsRecordedAt
    kv_event_fields: KVEventFields
    # allocate_slots takes num_new_tokens == 0 when only prefix-hit tokens are
    # adopted (0.31+); before, it raises unless external tokens are adopted.
    allocate_adopts_hit_without_new_tokens: bool
    admission_controls: AdmissionControls
    # --- hybrid models and the other attention kinds ---
    block_sizes_rule: BlockSizesRule
    coarse_block_hash: CoarseBlockHash
    context_parallel_block_size: ContextParallelBlockSize
    external_blocks_order: ExternalBlocksOrder
    # When blocks for connector (external) tokens are trimmed by the window:
    # whenever any token is skipped (0.24+), or only when a whole block is
    # (before, which then allocates blocks for skipped external tokens).
    external_trim_on_skipped_tokens: bool
    # Prefix-cache entries for prompt boundaries inside a block, hits ending
    # inside a block (fine-grained lookup when hash_block_size < block_size,
    # with Mamba "align"), and copy-on-write of the shared tail block (0.26+).
    partial_block_hits: bool
    partial_hit_gating: PartialHitGating
    prompt_tail_boundary: PromptTailBoundary
    mamba_partial_tail_rekey: MambaPartialTailRekey
    # A Mamba "align" group's count of the blocks an allocation takes when it
    # needs any: exactly its state block plus a partial hit's copy (up to
    # 0.30), or what is missing, at most that (0.31+).
    mamba_blocks_capped: bool
    # A Mamba "align" group giving back the blocks before its state steps over
    # the null entries prefill leaves between states (0.30+); before, the walk
    # stops at the first null, as for the other kinds.
    mamba_skip_steps_over_nulls: bool
    # A hybrid model caches only up to a multiple of the scheduler block size
    # (the LCM of the group block sizes) unless fine-grained hits are on
    # (0.22+); before, every full block of every group.
    hybrid_caches_scheduler_aligned: bool
    # After a hybrid lookup every full-attention spec batch (a drafter's
    # too) is cut to the agreed hit (0.29+); before, only the first batch,
    # the others keep what their one lookup found.
    hybrid_trims_every_full_attention_batch: bool
    sliding_window_sparse_caching: SlidingWindowSparseCaching
    # The sink-attention manager takes sink_len / block_size blocks out of the
    # free queue for good when it is built (0.17-0.29).
    sink_blocks_reserved: bool
    # vLLM can build a sink-attention group at all (0.23-0.25 cannot: their
    # coordinator passes an argument the sink manager does not take).
    sink_groups_buildable: bool
    # Several KV cache groups that all have one spec form a hybrid model
    # (0.29+); before, the hybrid coordinator refuses to be built.
    single_spec_hybrid: bool
    # A Mamba group in "none" mode with prefix caching on can be built (up to
    # 0.32; 0.33 refuses it).
    mamba_none_with_caching: bool
    # touch and free_blocks keep the null block's ref count (up to 0.32: a
    # Mamba table's null entries, never touched, drive it below zero when
    # freed); 0.33 leaves it alone and drops a table's leading nulls on free.
    # Seen in divergence reports' block states only.
    null_block_refcount: bool
    # KVCacheManager(num_hash_lookahead_tokens=L): a block's hash also covers
    # the L tokens after it (0.33).
    hash_lookahead_tokens: bool
    # get_computed_blocks(request, max_cache_hit_length) bounds the hit (0.33).
    max_cache_hit_length: bool
    # A scheduler with a KV connector looks a request up with
    # get_computed_blocks_for_connector and may cut the local hit back with
    # truncate_computed_blocks (0.27+); before, the plain lookup.
    connector_lookup: bool
    kv_cache_tensor_plan: KVCacheTensorPlan
    unify_pads_pages: UnifyPadsPages
    # Hybrid layer grouping: when the largest per-kind layer count is below
    # this times the smallest, every group takes the largest count (padding).
    uniform_group_pad_ratio: float
    # Mamba "align" groups with prefill checkpoint blocks, in which shape.
    mamba_prefill_checkpoints: MambaPrefillCheckpoints
    # How a prefix-cache retention interval is taken and what it thins out.
    prefix_cache_retention: PrefixCacheRetention
    # Which Mamba boundary states a connector is told of (which block holds
    # which state).
    boundary_state_offloads: BoundaryStateOffloads
    # Mamba releases blocks as if num_speculative_blocks fewer tokens were
    # computed (0.17: drafts of the last step may still be rejected).
    mamba_release_lags_speculative_blocks: bool
    # Which groups drop a unit of each hit for EAGLE / MTP; None: this
    # release's hybrid EAGLE lookups are not modelled (0.17-0.19 drop on every
    # pass of the hybrid loop; 0.20-0.27 are unread), so a hybrid manager
    # with EAGLE is refused.
    eagle_drop_groups: EagleDropGroups | None
    # How far a dropping hybrid lookup may look past its candidate (by the
    # drop unit, so that the drop lands back on it): up to the hashed tokens
    # (0.32+), or only up to the lookup's max_cache_hit_length (before), so a
    # candidate at that bound, a connector's per-group lookup's always,
    # drops below it.
    eagle_margin_to_hashed_tokens: bool = True
    # When a Mamba group registers its prompt tail one hash unit lower under
    # EAGLE.
    mamba_eagle_tail_shift: MambaEagleTailShift = MambaEagleTailShift.USE_EAGLE
    # Attention kinds the release has (0.17 none of them): R-SWA groups that
    # give back the gap between prompt and window (0.25+); circular-buffer
    # groups, one ring block a request (0.29+); sliding-window MLA and MLA
    # cache roles of sparse attention (0.30+).
    rswa_groups: bool = False
    circular_buffer_groups: bool = False
    sparse_mla_groups: bool = False
    # HiSparse groups (a host pool, resident and hot pages, the coordinator
    # its connector drives; specs/KV_CACHE_MANAGER.md §14): 0.32, not 0.17.
    hisparse: bool = False
    # Cascade attention's shared prefix (`get_num_common_prefix_blocks`):
    # counted per group by holder counts, with prefix caching on (0.17-0.31),
    # or zeros (0.32+: cascade attention removed).
    common_prefix_blocks: bool = False
    # How impl's HiSparse keeps residency (a model of 0.31's older shape, for
    # its own tests; the harness's traces and fuzz drive only `hisparse`).
    hisparse_residency: HiSparseResidency = HiSparseResidency.OVERLAY
    # Whether every HiSparse page needs a host block (0.31+) or host capacity
    # is best effort (0.30).
    hisparse_host_capacity: HiSparseHostCapacity = HiSparseHostCapacity.EVERY_PAGE
    # Whether HiSparse's groups are derived when the model is grouped
    # (0.31+) or only when its KV cache config is planned (0.30).
    hisparse_layout_stage: HiSparseLayoutStage = HiSparseLayoutStage.GROUPING
    # Which drafters grouping finds by position (the last registered layer),
    # and on which grouping path.
    trailing_draft_layers: TrailingDraftLayers = TrailingDraftLayers.MTP_OR_DEEPSEEK_V4
    # How the ZMQ publisher encodes each KV event on the wire: msgpack arrays
    # led by the type name up to 0.23, maps with a "type" key from 0.24
    # (vllm/distributed/kv_events.py drops array_like from KVCacheEvent).
    kv_events_map_layout: bool = False
    # A hashing call that begins after the prompt's first block (blocks
    # filled by generated tokens) looks at the last multimodal item only
    # (0.17-0.30: `curr_mm_idx = -1`); 0.31+ find the items by position.
    mm_resumed_walk_last_item: bool = True
    # Under sparse retention an EAGLE group also keeps the window one block
    # below a request's shared-prefix junction: a sibling diverging right
    # after the junction lacks the EAGLE peek there, so its hit lands a
    # block lower (0.33).
    eagle_junction_block_below: bool = False
    # The new model runner's forward-pass block tables hold the null block
    # in a sliding-window group's entries wholly below the window of the
    # request's first scheduled token (0.33: those blocks may be freed and
    # reused, and a kernel tile straddling the window start still loads them).
    worker_nulls_below_window: bool = False
    # BlockRemoved goes out for every physical copy of a hash evicted, also
    # while another copy stays cached (vLLM does not merge equal blocks), so a
    # consumer that indexes hashes forgets one the engine still holds: a
    # known bug of every followed release (vllm #55092, #48933, both open).
    # impl sends the same events; the harness's event reconciliation reads it.
    kv_events_removed_per_copy: bool = True
    # A hit of a request whose kv_cache_report_mode is full is announced
    # again with the hash of every block it spans, its null (skipped) blocks'
    # too, which no block caches and no BlockRemoved will ever retract (0.26+,
    # read through 0.33: emit_cached_block_events counts the hit's blocks,
    # nulls included; a known bug). impl does the same; the event
    # reconciliation reads it.
    full_report_announces_skipped_blocks: bool = False
    # --- the scheduler's queries of the manager ---
    # get_block_ids_for_computed_tokens exists (0.25+: a finishing request's
    # ids for its KV connector).
    block_ids_for_computed_tokens: bool = False
    # Which groups estimate_cached_tokens reads (None: the release has no such
    # method, before 0.26).
    estimate_cached_tokens: CachedTokensEstimate | None = None
    # --- the CPU offload tier (vllm/v1/kv_offload/cpu, specs/KV_OFFLOAD.md) ---
    # The tier as impl models it: chunk slots, policies by name, per-request
    # access records handed to the policy when a request finishes (0.32+;
    # before, other managers: the tier is not modelled, and refused).
    offload_cpu_tier: bool = False
    # LRU ranks a running request's keys together, by end-token position, and
    # the manager tells the policy of each key a request first sees (0.33).
    offload_request_ranked_lru: bool = False
    # A failed store is announced as a metadata-only removal, dropped at drain
    # time for keys held again by then (0.33); before, it is silent.
    offload_failed_store_events: bool = False

    @property
    def releases(self) -> str:
        """The release range, for tables: '0.24.0-0.25.1'."""
        first, last = self.checked_against[0], self.checked_against[-1]
        return first if first == last else f"{first}-{last}"

    def covers(self, version: str) -> bool:
        key = profile_key(version)
        return any(profile_key(r) == key for r in self.checked_against)


def _profiles() -> dict[str, VersionProfile]:
    """Each profile is the previous one plus the fields that change
    (specs/RELEASES.md, 'Profiles to write')."""
    chain = [VersionProfile(
        name="0.17",
        checked_against=(),
        free_order=FreeOrder.APPEND_ALL,
        none_hash_seed=NoneHashSeed.SEED_OR_RANDOM,
        tagged_extra_keys=False,
        mm_extra_key=MMExtraKey.IDENTIFIER,
        stats_recorded_at=StatsRecordedAt.LOOKUP,
        kv_event_fields=KVEventFields.NONE,
        allocate_adopts_hit_without_new_tokens=False,
        admission_controls=AdmissionControls.NONE,
        block_sizes_rule=BlockSizesRule.CACHE_BLOCK_SIZE,
        coarse_block_hash=CoarseBlockHash.CONCAT,
        context_parallel_block_size=ContextParallelBlockSize.DCP_TIMES_PCP,
        external_blocks_order=ExternalBlocksOrder.PER_GROUP,
        external_trim_on_skipped_tokens=False,
        partial_block_hits=False,
        partial_hit_gating=PartialHitGating.ANY_MAMBA_ALIGN,
        prompt_tail_boundary=PromptTailBoundary.PROMPT_END,
        mamba_partial_tail_rekey=MambaPartialTailRekey.ALWAYS,
        mamba_skip_steps_over_nulls=False,
        mamba_blocks_capped=False,
        hybrid_caches_scheduler_aligned=False,
        hybrid_trims_every_full_attention_batch=False,
        sliding_window_sparse_caching=SlidingWindowSparseCaching.NONE,
        sink_blocks_reserved=True,
        sink_groups_buildable=True,
        single_spec_hybrid=False,
        mamba_none_with_caching=True,
        null_block_refcount=True,
        hash_lookahead_tokens=False,
        max_cache_hit_length=False,
        connector_lookup=False,
        kv_cache_tensor_plan=KVCacheTensorPlan.SHARED_BY,
        unify_pads_pages=UnifyPadsPages.NEVER,
        uniform_group_pad_ratio=1.25,
        mamba_prefill_checkpoints=MambaPrefillCheckpoints.NONE,
        prefix_cache_retention=PrefixCacheRetention.NONE,
        boundary_state_offloads=BoundaryStateOffloads.NONE,
        mamba_release_lags_speculative_blocks=True,
        rswa_groups=False,
        circular_buffer_groups=False,
        sparse_mla_groups=False,
        hisparse=False,
        hisparse_residency=HiSparseResidency.TABLE_ROWS,
        hisparse_host_capacity=HiSparseHostCapacity.BEST_EFFORT,
        hisparse_layout_stage=HiSparseLayoutStage.PLANNING,
        trailing_draft_layers=TrailingDraftLayers.DEEPSEEK_V4_PACKED,
        common_prefix_blocks=True,
        eagle_drop_groups=None,
        eagle_margin_to_hashed_tokens=False,
        mamba_eagle_tail_shift=MambaEagleTailShift.NONE,
    )]

    def then(name: str, **changes) -> None:
        # The next minor release with a behaviour of its own: the previous
        # profile plus the fields that change. Its order here is its order.
        chain.append(replace(chain[-1], name=name, **changes))

    then("0.18",
         uniform_group_pad_ratio=1.5)
    then("0.19",
         mm_extra_key=MMExtraKey.IDENTIFIER_OFFSET)
    then("0.20",
         kv_event_fields=KVEventFields.GROUP,
         block_sizes_rule=BlockSizesRule.CACHE_BLOCK_SIZE_FOR_ONE_GROUP)
    then("0.21",
         admission_controls=AdmissionControls.FULL_SEQUENCE)
    then("0.22",
         kv_event_fields=KVEventFields.GROUP_SPEC,
         hybrid_caches_scheduler_aligned=True,
         sliding_window_sparse_caching=SlidingWindowSparseCaching.HYBRID_ONLY)
    then("0.23",
         free_order=FreeOrder.UNHASHED_FIRST_ON_SKIP,
         sliding_window_sparse_caching=SlidingWindowSparseCaching.ALL,
         admission_controls=AdmissionControls.RESERVED_BLOCKS,
         sink_groups_buildable=False,
         prefix_cache_retention=PrefixCacheRetention.SLIDING_WINDOW_ONLY)
    then("0.24",
         kv_events_map_layout=True,
         free_order=FreeOrder.UNHASHED_FIRST,
         coarse_block_hash=CoarseBlockHash.LAST,
         external_blocks_order=ExternalBlocksOrder.AFTER_ALL_HITS,
         external_trim_on_skipped_tokens=True,
         admission_controls=AdmissionControls.WATERMARK,
         kv_cache_tensor_plan=KVCacheTensorPlan.SHARED_BY_WITH_OFFSETS,
         unify_pads_pages=UnifyPadsPages.ATTENTION_ONLY)
    then("0.25",
         block_ids_for_computed_tokens=True)
    then("0.26",
         context_parallel_block_size=ContextParallelBlockSize.DCP_ALL_KINDS,
         partial_block_hits=True,
         block_sizes_rule=BlockSizesRule.LCM_GCD_ALL_GROUPS,
         sink_groups_buildable=True,
         unify_pads_pages=UnifyPadsPages.ALWAYS,
         mamba_release_lags_speculative_blocks=False,
         rswa_groups=True,
         full_report_announces_skipped_blocks=True,
         estimate_cached_tokens=CachedTokensEstimate.ALL_BUT_ENCODER)
    then("0.27",
         stats_recorded_at=StatsRecordedAt.ADMISSION,
         free_order=FreeOrder.UNHASHED_FIRST_IF_CACHING,
         connector_lookup=True)
    then("0.28",
         free_order=FreeOrder.UNHASHED_FIRST,
         partial_hit_gating=PartialHitGating.EVERY_GROUP_FINE,
         prefix_cache_retention=PrefixCacheRetention.ENVIRONMENT_WITH_MAMBA,
         boundary_state_offloads=BoundaryStateOffloads.PINNED_PARTIAL_TAILS,
         eagle_drop_groups=EagleDropGroups.FLAGGED_OR_ALL)
    then("0.29",
         single_spec_hybrid=True,
         hybrid_trims_every_full_attention_batch=True,
         none_hash_seed=NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO,
         block_sizes_rule=BlockSizesRule.LCM_GCD,
         kv_cache_tensor_plan=KVCacheTensorPlan.STRIDED,
         circular_buffer_groups=True,
         prefix_cache_retention=PrefixCacheRetention.KV_CACHE_CONFIG_RESEND_ONLY,
         context_parallel_block_size=ContextParallelBlockSize.DCP_FULL_ATTENTION,
         boundary_state_offloads=BoundaryStateOffloads.OFFERS)
    then("0.30",
         sink_blocks_reserved=False,
         mamba_skip_steps_over_nulls=True,
         kv_event_fields=KVEventFields.GROUP_SPEC_SESSION,
         sparse_mla_groups=True,
         prefix_cache_retention=PrefixCacheRetention.KV_CACHE_CONFIG,
         boundary_state_offloads=BoundaryStateOffloads.OFFERS_AND_FINALIZE,
         estimate_cached_tokens=CachedTokensEstimate.PREFIX_CACHEABLE,
         mamba_eagle_tail_shift=MambaEagleTailShift.DRAFT_GROUP,
         mamba_prefill_checkpoints=MambaPrefillCheckpoints.HASH_GRID_EVERY_CHUNK)
    then("0.31",
         hisparse_host_capacity=HiSparseHostCapacity.EVERY_PAGE,
         hisparse_layout_stage=HiSparseLayoutStage.GROUPING,
         trailing_draft_layers=TrailingDraftLayers.MTP_OR_DEEPSEEK_V4,
         mamba_eagle_tail_shift=MambaEagleTailShift.USE_EAGLE,
         tagged_extra_keys=True,
         mm_resumed_walk_last_item=False,
         context_parallel_block_size=ContextParallelBlockSize.DCP_IF_SHARDED,
         allocate_adopts_hit_without_new_tokens=True,
         mamba_blocks_capped=True,
         mamba_prefill_checkpoints=MambaPrefillCheckpoints.HASH_GRID)
    then("0.32",
         prompt_tail_boundary=PromptTailBoundary.BEFORE_LAST_TOKEN,
         mamba_prefill_checkpoints=MambaPrefillCheckpoints.ALIGNMENT_GRID,
         hisparse=True,
         hisparse_residency=HiSparseResidency.OVERLAY,
         common_prefix_blocks=False,
         eagle_margin_to_hashed_tokens=True,
         offload_cpu_tier=True)
    then("0.33",
         mamba_partial_tail_rekey=MambaPartialTailRekey.UNLESS_KEYED,
         mamba_none_with_caching=False,
         null_block_refcount=False,
         hash_lookahead_tokens=True,
         max_cache_hit_length=True,
         kv_event_fields=KVEventFields.GROUP_SPEC_SESSION_LOOKAHEAD,
         eagle_drop_groups=EagleDropGroups.FLAGGED_IF_USE_EAGLE,
         eagle_junction_block_below=True,
         worker_nulls_below_window=True,
         offload_request_ranked_lru=True,
         offload_failed_store_events=True)
    return {p.name: replace(p, checked_against=_checked_against(p, nxt))
            for p, nxt in zip(chain, [*chain[1:], None])}


def _checked_against(profile: VersionProfile, nxt: VersionProfile | None) -> tuple[str, ...]:
    """The followed releases (impl/releases.py) from this profile's minor up to
    the next profile's: a release with no behaviour of its own joins the
    profile before it by being listed there, and nowhere else."""
    start = release_key(profile.name)
    stop = release_key(nxt.name) if nxt else None
    found = tuple(r for r in RELEASES
                  if start[:2] <= release_key(r)[:2] and (stop is None or release_key(r) < stop))
    if not found:
        raise AssertionError(f"profile {profile.name}: no followed release (impl/releases.py)")
    return found


class UnsupportedVersion(ValueError):
    """A vLLM version with no profile."""


def profile_key(version: str) -> str:
    """'0.32.0', '0.32.0+cpu', 'v0.32' -> '0.32': the minor release."""
    return minor_of(version, UnsupportedVersion)


PROFILES: dict[str, VersionProfile] = _profiles()


# Minor release -> its profile's name ('0.25' -> '0.24').
_BY_MINOR = {profile_key(r): p.name for p in PROFILES.values() for r in p.checked_against}


def get_profile(version: str) -> VersionProfile:
    """The profile of a vLLM version (patch releases share their minor's), or
    of a profile name ('0.24')."""
    key = profile_key(version)
    try:
        return PROFILES[_BY_MINOR[key]]
    except KeyError:
        raise UnsupportedVersion(
            f"vLLM {version} has no profile (supported: {supported_versions()})"
        ) from None


def supported_versions() -> str:
    """The minor releases with a profile, runs of consecutive ones as ranges:
    '0.17-0.33'."""
    minors = sorted(tuple(map(int, k.split("."))) for k in _BY_MINOR)
    runs: list[list[tuple[int, int]]] = []
    for m in minors:
        if runs and runs[-1][-1][0] == m[0] and runs[-1][-1][1] + 1 == m[1]:
            runs[-1].append(m)
        else:
            runs.append([m])
    name = "{0[0]}.{0[1]}".format
    return ", ".join(name(r[0]) if len(r) == 1 else f"{name(r[0])}-{name(r[-1])}"
                     for r in runs)


def profiled_releases() -> list[str]:
    """The followed releases (impl/releases.py) that have a profile, oldest
    first: what `make matrix` and `make peer-matrix` run."""
    out = []
    for release in RELEASES:
        try:
            get_profile(release)
        except UnsupportedVersion:
            continue
        out.append(release)
    return out
