"""vLLM's single-type manager names over impl's managers (impl.managers)."""

from __future__ import annotations

from harness.peer import convert
from harness.peer import features as F
from harness.peer.adapters import pool as _pool  # noqa: F401  (registers the pool adapters)
from harness.peer.adapters.base import ADAPTER_FOR, Adapter, register, unwrap
from harness.peer.lacks import ImplLacks, MissingImplAPI, require
from impl import managers as imanagers
from impl.managers import base as ibase
from impl.managers import (
    chunked_local,
    cross_attention,
    full_attention,
    mamba,
    sink_full_attention,
    sliding_window,
)


class _Manager(Adapter):
    _impl_cls: type = ibase.SingleTypeKVCacheManager

    def __init__(self, kv_cache_spec, block_pool, enable_caching, kv_cache_group_id,
                 scheduler_block_size=None, dcp_world_size=1, pcp_world_size=1,
                 needs_kv_cache_zeroing=False, max_admission_blocks_per_request=None):
        impl = self._impl_cls(
            convert.to_impl_spec(kv_cache_spec), unwrap(block_pool), enable_caching,
            kv_cache_group_id, scheduler_block_size, dcp_world_size, pcp_world_size,
            max_admission_blocks_per_request, needs_kv_cache_zeroing=needs_kv_cache_zeroing,
        )
        object.__setattr__(self, "_impl", impl)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        blocks, num_tokens = cls._impl_cls.find_longest_cache_hit(
            block_hashes, max_length, list(kv_cache_group_ids), unwrap(block_pool),
            convert.to_impl_spec(kv_cache_spec), alignment_tokens, dcp_world_size,
            pcp_world_size, drop_eagle_block=drop_eagle_block,
        )
        return blocks, num_tokens

    @classmethod
    def reachable_block_mask(cls, *args, **kwargs):
        raise MissingImplAPI(cls.__name__, "reachable_block_mask (classmethod with spec)")

    def cache_blocks(self, request, num_tokens, retention_interval=None, *,
                     replay_boundaries=()):
        require(retention_interval is None, F.RETENTION, f"retention_interval={retention_interval}")
        require(not replay_boundaries, F.REPLAY_BOUNDARIES)
        impl = unwrap(self)
        # Through the class: a test may have replaced the method on the object.
        type(impl).cache_blocks(impl, convert.to_impl_request(request), num_tokens)

    def remove_skipped_blocks(self, request_id, processed_computed_tokens,
                              num_prompt_tokens=None):
        impl = unwrap(self)
        type(impl).remove_skipped_blocks(impl, request_id, processed_computed_tokens,
                                         num_prompt_tokens)

    def allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                          num_external_computed_tokens,
                                          record_for_zeroing=True):
        impl = unwrap(self)
        type(impl).allocate_external_computed_blocks(
            impl, request_id, num_local_computed_tokens, num_external_computed_tokens,
            record_for_zeroing)

    def take_pending_boundary_state_offloads(self):
        raise ImplLacks(F.BOUNDARY_OFFLOADS, "take_pending_boundary_state_offloads")

    def finalize_partial_tail_offload(self, *args, **kwargs):
        raise ImplLacks(F.BOUNDARY_OFFLOADS, "finalize_partial_tail_offload")


def _manager(impl_cls, name):
    adapter = type(name, (_Manager,), {"_impl_cls": impl_cls})
    register(impl_cls)(adapter)
    return adapter


SingleTypeKVCacheManager = _manager(ibase.SingleTypeKVCacheManager, "SingleTypeKVCacheManager")
FullAttentionManager = _manager(full_attention.FullAttentionManager, "FullAttentionManager")
SinkFullAttentionManager = _manager(sink_full_attention.SinkFullAttentionManager,
                                    "SinkFullAttentionManager")
SlidingWindowManager = _manager(sliding_window.SlidingWindowManager, "SlidingWindowManager")
ChunkedLocalAttentionManager = _manager(chunked_local.ChunkedLocalAttentionManager,
                                        "ChunkedLocalAttentionManager")
MambaManager = _manager(mamba.MambaManager, "MambaManager")
CrossAttentionManager = _manager(cross_attention.CrossAttentionManager, "CrossAttentionManager")


class _Unsupported(_Manager):
    _feature = ""

    def __init__(self, *args, **kwargs):
        raise ImplLacks(self._feature, type(self).__name__)


CircularBufferManager = type("CircularBufferManager", (_Unsupported,),
                             {"_feature": F.CIRCULAR_BUFFER})
RSWAManager = type("RSWAManager", (_Unsupported,), {"_feature": F.CIRCULAR_BUFFER})


def get_manager_for_kv_cache_spec(kv_cache_spec, max_in_flight_tokens, max_model_len,
                                  role=None, **kwargs):
    require(role is None, F.HISPARSE, f"manager role {role}")
    spec = convert.to_impl_spec(kv_cache_spec)
    impl_cls = imanagers.manager_class_for(spec)
    kwargs.setdefault("max_admission_blocks_per_request",
                      imanagers.max_admission_blocks_per_request(
                          spec, max_in_flight_tokens, max_model_len))
    return ADAPTER_FOR[impl_cls](spec, **kwargs)
