"""vLLM's KVCacheManager (and its coordinator as tests read it) over impl's."""

from __future__ import annotations

from harness.peer import convert
from harness.peer.adapters import pool as _pool  # noqa: F401  (registers the pool adapters)
from harness.peer.adapters.base import Adapter, register, unwrap, wrap
from harness.peer.adapters.metrics import impl_collector
from harness.peer.lacks import Checks
from impl import coordinator as icoord
from impl import kv_cache_manager as ikvm

KVCacheBlocks = ikvm.KVCacheBlocks


def _block_copy(src_id: int, dst_id: int):
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

    return KVCacheBlockCopy(src_block_id=src_id, dst_block_id=dst_id)


def _vllm_manager_signature():
    import inspect

    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    return inspect.signature(VllmManager.__init__)


def _computed_blocks_arity() -> int:
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    method = getattr(VllmManager.get_computed_blocks, "__wrapped__",
                     VllmManager.get_computed_blocks)
    returned = str(method.__annotations__.get("return", ""))
    return returned.count(",") + 1 if returned.startswith("tuple[") else 3


@register(ikvm.KVCacheManager)
class KVCacheManager(Adapter):
    def __init__(self, *args, **kwargs):
        # Bound to the running release's own signature: its tests pass its
        # positional order (0.17.1-0.22.1 have no scheduler_block_size).
        bound = _vllm_manager_signature().bind(None, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(arguments)))  # self
        # The same bound under its older name (0.25.1's signature, say).
        if "max_num_batched_tokens" in arguments:
            arguments["max_in_flight_tokens"] = arguments.pop("max_num_batched_tokens")
        # 0.30's name of the Mamba junction checkpoints (its predicate is
        # the same: EAGLE groups, hits inside blocks, no prefill lookahead).
        if "enable_mamba_fine_grained_prefix_cache" in arguments:
            arguments["enable_mamba_shared_prefix_checkpoint"] = arguments.pop(
                "enable_mamba_fine_grained_prefix_cache")
        self._init(**arguments)

    def _init(self, kv_cache_config, max_model_len, hash_block_size,
              scheduler_block_size=None, max_in_flight_tokens=None, enable_caching=True,
              use_eagle=False, num_hash_lookahead_tokens=0, num_prefill_lookahead=0,
              log_stats=False,
              enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1,
              metrics_collector=None, watermark=0.0, enable_mamba_shared_prefix_checkpoint=False):
        with Checks() as checks:
            collector = checks.run(impl_collector, metrics_collector)
            config = checks.run(convert.to_impl_config, kv_cache_config)
        if watermark < 0:
            raise AssertionError("watermark must be non-negative")
        impl = ikvm.KVCacheManager(
            config,
            max_model_len,
            hash_block_size,
            convert.PROFILE,
            enable_caching=enable_caching,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            events_use_int_hashes=_pool.events_use_int_hashes(),
            watermark=watermark,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            scheduler_block_size=scheduler_block_size,
            max_in_flight_tokens=max_in_flight_tokens,
            enable_mamba_shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint,
            use_eagle=use_eagle,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
            num_prefill_lookahead=num_prefill_lookahead,
            metrics_collector=collector,
        )
        object.__setattr__(self, "_impl", impl)
        # The test's own input, as vLLM keeps it (impl keeps its converted copy).
        object.__setattr__(self, "kv_cache_config", kv_cache_config)

    kv_cache_config = None
    # vLLM's older names for what impl keeps under its own.
    _PRIVATE = {"mamba_fine_grained_prefix_cache": "mamba_shared_prefix_checkpoint"}

    def get_computed_blocks(self, request, max_cache_hit_length=None):
        # (The bound is 0.33's; impl refuses it for a release without it.)
        extra = {} if max_cache_hit_length is None else {
            "max_cache_hit_length": max_cache_hit_length}
        answer = unwrap(self).get_computed_blocks(convert.to_impl_request(request), **extra)
        # The running release's own shape: (blocks, hits) before 0.26, then
        # (blocks, hits, a third count), as its method's return annotation says.
        return answer[:_computed_blocks_arity()]

    def get_computed_blocks_for_connector(self, request, max_cache_hit_length=None):
        extra = {} if max_cache_hit_length is None else {
            "max_cache_hit_length": max_cache_hit_length}
        return unwrap(self).get_computed_blocks_for_connector(
            convert.to_impl_request(request), **extra)

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False,
                       reserved_blocks=0, has_scheduled_reqs=True,
                       skip_zeroing_group_ids=()):
        return unwrap(self).allocate_slots(
            convert.to_impl_request(request), num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=has_scheduled_reqs,
            skip_zeroing_group_ids=skip_zeroing_group_ids,
        )

    def remove_skipped_blocks(self, request_id, processed_computed_tokens,
                              num_prompt_tokens=None):
        unwrap(self).remove_skipped_blocks(request_id, processed_computed_tokens,
                                           num_prompt_tokens)

    def pop_blocks_for_free(self, request):
        return wrap(unwrap(self).pop_blocks_for_free(convert.to_impl_request(request)))

    def finalize_partial_tail_offloads(self, request):
        return unwrap(self).finalize_partial_tail_offloads(convert.to_impl_request(request))

    def take_kv_cache_block_copies(self):
        copies, retained = unwrap(self).take_kv_cache_block_copies()
        return [_block_copy(src, dst) for src, dst in copies], retained


@register(icoord.KVCacheCoordinator)
class KVCacheCoordinator(Adapter):
    """The coordinator as tests read it through `manager.coordinator`."""

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return unwrap(self).find_longest_cache_hit(block_hashes, max_cache_hit_length)

    # vLLM's private names for what impl keeps under its own (tests read them).
    _PRIVATE = {"_cache_hit_alignment_tokens": "alignment_tokens"}

# One adapter class per coordinator kind, under vLLM's class names (tests
# check which kind a config gets).
for _kind in (icoord.KVCacheCoordinatorNoPrefixCache, icoord.UnitaryKVCacheCoordinator):
    register(_kind)(type(_kind.__name__, (KVCacheCoordinator,), {}))


def _hybrid_coordinator_adapter():
    """The hybrid coordinator's adapter, which vLLM code that checks for its
    hybrid coordinator class (isinstance) takes for one."""
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator as VllmHybrid

    adapter = register(icoord.HybridKVCacheCoordinator)(
        type("HybridKVCacheCoordinator", (KVCacheCoordinator,), {}))
    VllmHybrid.register(adapter)
    return adapter


HybridKVCacheCoordinator = _hybrid_coordinator_adapter()
