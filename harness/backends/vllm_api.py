"""How each vLLM release is called: the API shapes of its KV cache manager,
one row per range of releases (specs/RELEASES.md reads them from the source).

A shape is about calling vLLM (constructor arguments, return arity, which
methods exist, where a helper lives), not about what its answers are: answers
are the version profiles' business (impl/profiles.py). The vLLM adapter
(vllm_backend.py) reads these fields and nothing else about the release, so it
drives every followed release, profiled or not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.core.vllm_releases import UnknownRelease, newest, release_key
from impl.profiles import AdmissionControls, BlockSizesRule


@dataclass(frozen=True, slots=True)
class VllmApi:
    # The first release of the range this shape holds for.
    since: str
    # KVCacheManager.__init__ takes scheduler_block_size (required) next to
    # hash_block_size.
    manager_takes_scheduler_block_size: bool
    # The KVCacheManager.__init__ keyword bounding the tokens scheduled in one
    # step (None: no such argument).
    in_flight_tokens_arg: str | None
    # KVCacheManager.__init__ takes watermark.
    manager_takes_watermark: bool
    # allocate_slots' admission keywords, as far as the release has them
    # (the keywords are impl/profiles.py's AdmissionControls.args).
    admission_args: tuple[str, ...]
    # get_computed_blocks returns (blocks, hits) or (blocks, hits,
    # shared_prefix_boundary).
    get_computed_blocks_arity: int
    # record_prefix_cache_stats exists (the scheduler records a lookup on admission).
    has_record_prefix_cache_stats: bool
    # take_kv_cache_block_copies exists (copy-on-write of shared partial blocks).
    has_block_copies: bool
    # Request takes session_id.
    request_takes_session_id: bool
    # HiSparse groups with the coordinator calls the hisparse_* events make
    # (advance_scheduled, take_residency_updates: 0.32; 0.30 and 0.31 have
    # HiSparse with another coordinator API, which the adapter does not drive).
    has_hisparse: bool
    # The coordinator passes needs_kv_cache_zeroing to every manager but
    # SinkFullAttentionManager.__init__ does not take it (no sink group can be
    # built); the adapter drops the argument.
    sink_manager_rejects_zeroing_arg: bool
    # The module holding the KV cache sizing functions (get_kv_cache_groups,
    # get_kv_cache_config_from_groups, unify_kv_cache_spec_page_size, ...).
    sizing_module: str
    # How the engine derives the (scheduler, hash) block sizes it passes the
    # manager (impl/kv_cache_sizing.resolve_kv_cache_block_sizes reads the rule).
    block_sizes_rule: BlockSizesRule
    # KVCacheManager and get_request_block_hasher take num_hash_lookahead_tokens.
    takes_hash_lookahead_tokens: bool
    # get_computed_blocks takes max_cache_hit_length.
    lookup_takes_max_cache_hit_length: bool
    # KVCacheManager.get_computed_blocks_for_connector and
    # truncate_computed_blocks (the scheduler's connector lookups).
    has_connector_lookup: bool
    # Where the prefix-cache retention interval is read: "kv_cache_config"
    # (KVCacheConfig.prefix_cache_retention_interval), "env"
    # (VLLM_PREFIX_CACHE_RETENTION_INTERVAL), None (no such knob).
    retention_interval_from: str | None
    # MambaSpec takes num_prefill_checkpoint_blocks / prefill_checkpoint_alignment.
    mamba_spec_takes_checkpoints: bool
    # KVCacheManager.take_boundary_state_offloads / finalize_partial_tail_offloads.
    has_boundary_state_offloads: bool
    has_finalize_partial_tail_offloads: bool
    # The KVCacheManager.__init__ argument that turns on Mamba shared-prefix
    # (junction) checkpoints: 0.30 names it enable_mamba_fine_grained_prefix_cache
    # (the same predicate); None: the release has none.
    shared_prefix_checkpoint_kwarg: str | None
    # KVCacheGroupSpec takes is_eagle_group (groups holding draft layers).
    group_takes_is_eagle_group: bool = False
    # KVCacheManager.__init__ takes num_prefill_lookahead (multi-module MTP).
    manager_takes_num_prefill_lookahead: bool = False
    # Attention specs take dcp_sharded (a replicated draft under DCP).
    spec_takes_dcp_sharded: bool = False
    # Requests read kv_cache_report_mode from the sampling params' extra args.
    request_reads_report_mode: bool = False
    # get_kv_cache_configs takes the whole model's groups, made first by
    # get_global_kv_cache_groups (0.33: planning through KVCacheConfigBuilder).
    sizing_groups_model_first: bool = False
    # kv_cache_utils has get_kv_cache_capacity (0.24+): the sizing compares
    # the scheduler's capacity only where the release computes one.
    sizing_has_capacity: bool = False
    # Whether impl's sizing is held to the release's: from 0.31 on (checked
    # by the gate). Before, vLLM's auto-fitted max_model_len and its specs'
    # max_tp_shards differ from impl's (0.17.1 and 0.26.0 measured: 11 and 12
    # of 12 workload shapes), which the profiles do not model yet.
    sizing_compared: bool = False
    # The private state the oracles on vLLM's pool read
    # (harness/backends/vllm_invariants.py): the hash map's dict of entries
    # (key -> block, or block id -> block for several copies), the pool's map
    # of a block's extra keys (None before 0.24), a manager's pending
    # copy-on-write pairs (None before 0.26) and the blocks a sink group
    # sets aside for good (None from 0.30).
    hash_map_entries_attr: str = "_cache"
    pool_extra_keys_attr: str | None = None
    pending_copies_attr: str | None = None
    sink_blocks_attr: str | None = "sink_blocks"


# Oldest first, each row the previous one plus the fields that change; a
# release takes the last row whose `since` it has reached. A release that
# calls vLLM as the one before it needs no row.
_SHAPES: list[VllmApi] = [VllmApi(
    since="0.17.1",
    manager_takes_scheduler_block_size=False,
    in_flight_tokens_arg=None,
    manager_takes_watermark=False,
    admission_args=(),
    get_computed_blocks_arity=2,
    has_record_prefix_cache_stats=False,
    has_block_copies=False,
    request_takes_session_id=False,
    has_hisparse=False,
    sink_manager_rejects_zeroing_arg=False,
    sizing_module="vllm.v1.core.kv_cache_utils",
    block_sizes_rule=BlockSizesRule.CACHE_BLOCK_SIZE,
    takes_hash_lookahead_tokens=False,
    lookup_takes_max_cache_hit_length=False,
    has_connector_lookup=False,
    retention_interval_from=None,
    mamba_spec_takes_checkpoints=False,
    has_boundary_state_offloads=False,
    has_finalize_partial_tail_offloads=False,
    shared_prefix_checkpoint_kwarg=None,
)]


def _then(since: str, **changes) -> None:
    _SHAPES.append(replace(_SHAPES[-1], since=since, **changes))


_then("0.20.0", in_flight_tokens_arg="max_num_batched_tokens",
      block_sizes_rule=BlockSizesRule.CACHE_BLOCK_SIZE_FOR_ONE_GROUP,
      group_takes_is_eagle_group=True)
_then("0.21.0", admission_args=AdmissionControls.FULL_SEQUENCE.args)
_then("0.23.0", manager_takes_scheduler_block_size=True,
      admission_args=AdmissionControls.RESERVED_BLOCKS.args, retention_interval_from="env")
_then("0.24.0", manager_takes_watermark=True, admission_args=AdmissionControls.WATERMARK.args,
      pool_extra_keys_attr="cached_block_hashes_by_block", sizing_has_capacity=True)
_then("0.26.0", in_flight_tokens_arg="max_in_flight_tokens",
      block_sizes_rule=BlockSizesRule.LCM_GCD_ALL_GROUPS,
      get_computed_blocks_arity=3, has_block_copies=True,
      sink_manager_rejects_zeroing_arg=True, request_reads_report_mode=True,
      pending_copies_attr="_pending_cow_copies")
_then("0.27.0", has_record_prefix_cache_stats=True, has_connector_lookup=True)
_then("0.28.0", request_takes_session_id=True,
      manager_takes_num_prefill_lookahead=True)
_then("0.29.0", block_sizes_rule=BlockSizesRule.LCM_GCD,
      retention_interval_from="kv_cache_config",
      mamba_spec_takes_checkpoints=True, has_boundary_state_offloads=True)
_then("0.30.0", has_finalize_partial_tail_offloads=True, sink_blocks_attr=None,
      shared_prefix_checkpoint_kwarg="enable_mamba_fine_grained_prefix_cache")
_then("0.31.0", sizing_compared=True,
      shared_prefix_checkpoint_kwarg="enable_mamba_shared_prefix_checkpoint",
      spec_takes_dcp_sharded=True)
_then("0.32.0", has_hisparse=True)
_then("0.33.0", sizing_module="vllm.v1.core.kv_cache_planning",
      sizing_groups_model_first=True,
      takes_hash_lookahead_tokens=True, lookup_takes_max_cache_hit_length=True)

SHAPES: tuple[VllmApi, ...] = tuple(_SHAPES)


def api_for(version: str) -> VllmApi:
    """The API shape of a vLLM release ('0.25.1', '0.32.0+cpu', ...)."""
    key = release_key(version)
    if key < release_key(SHAPES[0].since) or key[:2] > release_key(newest())[:2]:
        raise UnknownRelease(
            f"vLLM {version} is outside the releases whose API the adapter knows "
            f"({SHAPES[0].since} to {newest()}; specs/RELEASES.md)"
        )
    return [s for s in SHAPES if release_key(s.since) <= key][-1]
