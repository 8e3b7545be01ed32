"""Version profiles: every behaviour of vLLM's KV cache that differs between releases.

A profile is data, not code. The impl and the vLLM adapter read its fields; nobody
writes `if version == ...` anywhere else. To support a new vLLM release, add a
profile here (and its row in specs/PROFILES.md) after checking each field against
that release's source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FreeOrder(str, Enum):
    """Where blocks released by `free_blocks` re-enter the free queue.

    Callers pass blocks in eviction-priority order (a request's blocks reversed,
    so its tail is evicted first).
    """

    # 0.17: every released block is appended to the tail (LRU end).
    APPEND_ALL = "append_all"
    # 0.32: released blocks without a hash (or all, with caching off) are
    # prepended to the head so they are reused first (LIFO, GPU locality);
    # hashed blocks are appended (FIFO, so the cache evicts in LRU order).
    UNHASHED_FIRST = "unhashed_first"


class NoneHashSeed(str, Enum):
    """How the parent hash of a request's first block (NONE_HASH) is seeded."""

    # 0.17: hash_fn(PYTHONHASHSEED) if set, else 32 random bytes.
    SEED_OR_RANDOM = "seed_or_random"
    # 0.32: hash_fn(PYTHONHASHSEED) if set, else hash_fn("vllm-none-hash") for the
    # cryptographic algorithms and a random seed for xxhash ones.
    SEED_OR_FIXED_FOR_CRYPTO = "seed_or_fixed_for_crypto"


class StatsRecordedAt(str, Enum):
    """When a prefix-cache lookup is counted in PrefixCacheStats."""

    # 0.17: inside get_computed_blocks, so a lookup whose allocation fails counts.
    LOOKUP = "lookup"
    # 0.32: the scheduler calls record_prefix_cache_stats once the request is
    # admitted (allocation succeeded); get_computed_blocks records nothing.
    ADMISSION = "admission"


class CoarseBlockHash(str, Enum):
    """How a group whose block size is a multiple of the hash block size derives
    its per-block hash from the request's hash-block-size hashes."""

    # 0.17: the concatenation of the block's hash-size hashes.
    CONCAT = "concat"
    # 0.32: the last hash-size hash inside the block (it already chains over the
    # whole prefix).
    LAST = "last"


class ContextParallelBlockSize(str, Enum):
    """The block size a manager sees under decode/prefill context parallelism."""

    # 0.17: block_size * dcp * pcp, for every kind.
    DCP_TIMES_PCP = "dcp_times_pcp"
    # 0.32: block_size * dcp, only for specs whose KV is sharded across DCP ranks
    # (attention); Mamba state is replicated and keeps its block size.
    DCP_IF_SHARDED = "dcp_if_sharded"


class ExternalBlocksOrder(str, Enum):
    """When blocks for connector-loaded (external) tokens are allocated."""

    # 0.17: each group touches its hit and then allocates its external blocks
    # before the next group touches its own hit.
    PER_GROUP = "per_group"
    # 0.32: every group touches its hit first, then every group allocates.
    AFTER_ALL_HITS = "after_all_hits"


class BlockSizesRule(str, Enum):
    """Which block sizes the scheduler works in and requests are hashed at."""

    # 0.17: both are the cache block size times dcp * pcp, whatever the groups.
    CACHE_BLOCK_SIZE = "cache_block_size"
    # 0.32: one group: its block size (times dcp where sharded); several: the
    # LCM of the group block sizes for the scheduler, their GCD (or
    # prefix_match_unit) for hashes, unless nothing reads hashes.
    LCM_GCD = "lcm_gcd"


class KVCacheTensorPlan(str, Enum):
    """How the per-layer KV cache tensors of a KV cache config are described."""

    # 0.17: KVCacheTensor(size, shared_by): one tensor per layer slot, shared by
    # one layer of every group; each layer views it as
    # (2, num_blocks, block_size, num_kv_heads, head_size).
    SHARED_BY = "shared_by"
    # 0.32: KVCacheTensor(size, layers, layer_stride, block_stride, offset) over
    # one allocation; each layer a logical [num_blocks, heads, block, bytes] view.
    STRIDED = "strided"


class EagleDropGroups(str, Enum):
    """Which KV cache groups drop the last matched unit of a prefix hit for
    an EAGLE / MTP drafter (specs/KV_CACHE_MANAGER.md section 15).

    `eagle_group_ids` is the same in both: the groups flagged as draft
    groups, or all of them when none is flagged and `use_eagle` is set."""

    # 0.32: every group of eagle_group_ids drops, use_eagle or not.
    FLAGGED_OR_ALL = "flagged_or_all"
    # 0.33: those groups drop only when use_eagle is set.
    FLAGGED_IF_USE_EAGLE = "flagged_if_use_eagle"


@dataclass(frozen=True, slots=True)
class VersionProfile:
    name: str
    # Exact releases whose source this profile was checked against.
    checked_against: tuple[str, ...]
    free_order: FreeOrder
    none_hash_seed: NoneHashSeed
    # Extra hash keys as ("lora", name, path), ("mm", id, offset),
    # ("cache_salt", salt), ("prompt_embeds", digest) (0.32) instead of the bare
    # lora name, mm identifier, salt and digest (0.17).
    tagged_extra_keys: bool
    stats_recorded_at: StatsRecordedAt
    # BlockStored carries group_idx, kv_cache_spec_kind, sliding window and
    # session_id; BlockRemoved carries group_idx (0.32, not 0.17).
    kv_events_carry_group: bool
    # allocate_slots takes num_new_tokens == 0 when only prefix-hit tokens are
    # adopted (0.32); 0.17 raises unless external tokens are adopted.
    allocate_adopts_hit_without_new_tokens: bool
    # allocate_slots' admission controls: full_sequence_must_fit, reserved_blocks
    # and the watermark (0.32; 0.17 has none of them).
    has_admission_controls: bool
    # vLLM API shape, read only by the vLLM adapter.
    get_computed_blocks_arity: int
    manager_takes_scheduler_block_size: bool
    # --- hybrid models and the other attention kinds ---
    block_sizes_rule: BlockSizesRule
    coarse_block_hash: CoarseBlockHash
    context_parallel_block_size: ContextParallelBlockSize
    external_blocks_order: ExternalBlocksOrder
    # When blocks for connector (external) tokens are trimmed by the window:
    # whenever any token is skipped (0.32), or only when a whole block is
    # (0.17, which then allocates blocks for skipped external tokens).
    external_trim_on_skipped_tokens: bool
    # Prefix-cache entries for prompt boundaries inside a block, hits ending
    # inside a block (fine-grained lookup when hash_block_size < block_size,
    # with Mamba "align"), and copy-on-write of the shared tail block (0.32).
    partial_block_hits: bool
    # A hybrid model caches only up to a multiple of the scheduler block size
    # (the LCM of the group block sizes) unless fine-grained hits are on (0.32);
    # 0.17 caches every full block of every group.
    hybrid_caches_scheduler_aligned: bool
    # Sliding-window groups of a hybrid model cache only the blocks a hit at an
    # aligned boundary can use (0.32's reachable_block_mask); 0.17 caches all.
    sliding_window_sparse_caching: bool
    # The sink-attention manager takes sink_len / block_size blocks out of the
    # free queue for good when it is built (0.17; 0.32 does not).
    sink_blocks_reserved: bool
    kv_cache_tensor_plan: KVCacheTensorPlan
    # Unifying the page sizes of a hybrid model pads a Mamba page, or an
    # attention page that does not divide the largest one (0.32); 0.17 only
    # grows block sizes and refuses such a model (NotImplementedError).
    unify_pads_pages: bool
    # vLLM 0.32.0's SinkFullAttentionManager.__init__ rejects the
    # `needs_kv_cache_zeroing` argument its own coordinator passes, so a sink
    # group cannot be built; the vLLM adapter drops the argument (API shape).
    sink_manager_rejects_zeroing_arg: bool
    # Mamba "align" groups with prefill checkpoint blocks (a state exported
    # inside a prefill chunk); 0.17's MambaSpec has no such field.
    mamba_prefill_checkpoints: bool
    # KVCacheConfig.prefix_cache_retention_interval, replay boundaries and
    # sparse sliding-window / Mamba checkpoints; absent in 0.17.
    prefix_cache_retention: bool
    # take_boundary_state_offloads / finalize_partial_tail_offloads (a
    # connector told which Mamba block holds which boundary state).
    boundary_state_offloads: bool
    # Mamba releases blocks as if num_speculative_blocks fewer tokens were
    # computed (0.17: drafts of the last step may still be rejected).
    mamba_release_lags_speculative_blocks: bool
    # Which groups drop a unit of each hit for EAGLE / MTP; None: this
    # release's EAGLE lookups are not modelled (0.17 drops on every pass of
    # the hybrid loop), so a manager with EAGLE is refused.
    eagle_drop_groups: EagleDropGroups | None
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


PROFILES: dict[str, VersionProfile] = {
    "0.17": VersionProfile(
        name="0.17",
        checked_against=("0.17.1",),
        free_order=FreeOrder.APPEND_ALL,
        none_hash_seed=NoneHashSeed.SEED_OR_RANDOM,
        tagged_extra_keys=False,
        stats_recorded_at=StatsRecordedAt.LOOKUP,
        kv_events_carry_group=False,
        allocate_adopts_hit_without_new_tokens=False,
        has_admission_controls=False,
        get_computed_blocks_arity=2,
        manager_takes_scheduler_block_size=False,
        block_sizes_rule=BlockSizesRule.CACHE_BLOCK_SIZE,
        coarse_block_hash=CoarseBlockHash.CONCAT,
        context_parallel_block_size=ContextParallelBlockSize.DCP_TIMES_PCP,
        external_blocks_order=ExternalBlocksOrder.PER_GROUP,
        external_trim_on_skipped_tokens=False,
        partial_block_hits=False,
        hybrid_caches_scheduler_aligned=False,
        sliding_window_sparse_caching=False,
        sink_blocks_reserved=True,
        kv_cache_tensor_plan=KVCacheTensorPlan.SHARED_BY,
        unify_pads_pages=False,
        sink_manager_rejects_zeroing_arg=False,
        mamba_prefill_checkpoints=False,
        prefix_cache_retention=False,
        boundary_state_offloads=False,
        mamba_release_lags_speculative_blocks=True,
        rswa_groups=False,
        circular_buffer_groups=False,
        sparse_mla_groups=False,
        hisparse=False,
        eagle_drop_groups=None,
    ),
    "0.32": VersionProfile(
        name="0.32",
        checked_against=("0.32.0",),
        free_order=FreeOrder.UNHASHED_FIRST,
        none_hash_seed=NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO,
        tagged_extra_keys=True,
        stats_recorded_at=StatsRecordedAt.ADMISSION,
        kv_events_carry_group=True,
        allocate_adopts_hit_without_new_tokens=True,
        has_admission_controls=True,
        get_computed_blocks_arity=3,
        manager_takes_scheduler_block_size=True,
        block_sizes_rule=BlockSizesRule.LCM_GCD,
        coarse_block_hash=CoarseBlockHash.LAST,
        context_parallel_block_size=ContextParallelBlockSize.DCP_IF_SHARDED,
        external_blocks_order=ExternalBlocksOrder.AFTER_ALL_HITS,
        external_trim_on_skipped_tokens=True,
        partial_block_hits=True,
        hybrid_caches_scheduler_aligned=True,
        sliding_window_sparse_caching=True,
        sink_blocks_reserved=False,
        kv_cache_tensor_plan=KVCacheTensorPlan.STRIDED,
        unify_pads_pages=True,
        sink_manager_rejects_zeroing_arg=True,
        mamba_prefill_checkpoints=True,
        prefix_cache_retention=True,
        boundary_state_offloads=True,
        mamba_release_lags_speculative_blocks=False,
        rswa_groups=True,
        circular_buffer_groups=True,
        sparse_mla_groups=True,
        hisparse=True,
        eagle_drop_groups=EagleDropGroups.FLAGGED_OR_ALL,
    ),
}


class UnsupportedVersion(ValueError):
    """A vLLM version with no profile."""


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:[.+\-].*)?$")


def profile_key(version: str) -> str:
    """'0.32.0', '0.32.0+cpu', 'v0.32' -> '0.32'. Patch releases share a profile."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise UnsupportedVersion(f"'{version}' is not a vLLM version")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def get_profile(version: str) -> VersionProfile:
    key = profile_key(version)
    try:
        return PROFILES[key]
    except KeyError:
        supported = ", ".join(sorted(PROFILES))
        raise UnsupportedVersion(
            f"vLLM {version} has no profile (supported: {supported})"
        ) from None
