"""vLLM's single-type manager names over impl's managers (impl.managers)."""

from __future__ import annotations

import inspect

from harness.peer import convert
from harness.peer import features as F
from harness.peer.adapters import pool as _pool  # noqa: F401  (registers the pool adapters)
from harness.peer.adapters.base import ADAPTER_FOR, Adapter, UnwrappingDict, register, unwrap
from harness.peer.lacks import ImplLacks
from impl import mamba_checkpoint
from impl import managers as imanagers
from impl.managers import base as ibase
from impl.managers import (
    chunked_local,
    circular_buffer,
    cross_attention,
    full_attention,
    hisparse,
    mamba,
    rswa,
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
                               kv_cache_spec, drop_eagle_block=False, alignment_tokens=None,
                               dcp_world_size=1, pcp_world_size=1, use_eagle=None):
        # (use_eagle: the flag's name before 0.24.)
        if use_eagle is not None:
            drop_eagle_block = use_eagle
        spec = convert.to_impl_spec(kv_cache_spec)
        blocks, num_tokens = cls._impl_cls.find_longest_cache_hit(
            block_hashes, max_length, list(kv_cache_group_ids), unwrap(block_pool), spec,
            alignment_tokens, dcp_world_size, pcp_world_size, drop_eagle_block=drop_eagle_block,
        )
        # The running release's shape: the blocks alone before 0.28, then
        # (blocks, hit tokens), as its method's return annotation says.
        return (blocks, num_tokens) if _hit_reports_tokens() else blocks

    @classmethod
    def reachable_block_mask(cls, start_block, end_block, alignment_tokens, kv_cache_spec,
                             use_eagle, retention_interval=None, reachable_boundaries=(),
                             dcp_world_size=1, final_segment_end_block=None):
        return cls._impl_cls.reachable_block_mask(
            start_block, end_block, alignment_tokens, convert.to_impl_spec(kv_cache_spec),
            use_eagle, retention_interval, tuple(reachable_boundaries), dcp_world_size,
            final_segment_end_block)

    def cache_blocks(self, request, num_tokens, retention_interval=None,
                     replay_boundaries=()):
        # (vLLM's replay_boundaries is keyword-only; impl's coordinator passes
        # it by position, which a test's spy on this method passes on.)
        impl = unwrap(self)
        # Through the class: a test may have replaced the method on the object.
        if convert.is_vllm_request(request):
            # (A kind that keys nothing may be handed anything, e.g. an id.)
            request = convert.to_impl_request(request)
        type(impl).cache_blocks(impl, request, num_tokens, retention_interval,
                                tuple(replay_boundaries))

    def remove_skipped_blocks(self, request_id, processed_computed_tokens,
                              num_prompt_tokens=None):
        impl = unwrap(self)
        type(impl).remove_skipped_blocks(impl, request_id, processed_computed_tokens,
                                         num_prompt_tokens)

    def allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                          num_external_computed_tokens,
                                          record_for_zeroing=True):
        impl = unwrap(self)
        method = type(impl).allocate_external_computed_blocks
        # The flag only matters when blocks are recorded for zeroing (refused
        # at construction where impl does not record them).
        extra = {}
        if _takes(method, "record_for_zeroing"):
            extra["record_for_zeroing"] = record_for_zeroing
        method(impl, request_id, num_local_computed_tokens, num_external_computed_tokens, **extra)

    def allocate_new_computed_blocks(self, request_id, new_computed_blocks,
                                     num_local_computed_tokens, num_external_computed_tokens):
        # The one call before 0.24 for what impl (and later vLLM) does in two:
        # take the prefix hit, then slots for a connector's tokens. A running
        # request brings no hit and needs neither.
        impl = unwrap(self)
        if request_id in impl.num_cached_block:
            assert not new_computed_blocks, "a running request took a prefix hit"
            return
        impl.add_local_computed_blocks(request_id, unwrap(list(new_computed_blocks)),
                                       num_local_computed_tokens, num_external_computed_tokens)
        self.allocate_external_computed_blocks(request_id, num_local_computed_tokens,
                                               num_external_computed_tokens)

    def take_new_block_ids(self):
        impl = unwrap(self)
        if not hasattr(impl, "take_new_block_ids"):
            raise ImplLacks(F.ZEROING, "take_new_block_ids")
        return impl.take_new_block_ids()

    @property
    def req_to_blocks(self):
        return UnwrappingDict(unwrap(self).req_to_blocks)

    @property
    def _partial_hit_reqs(self):
        # vLLM's name for the hits ending inside a block that still owe their
        # request a private copy (impl: _copy_due, the same (index, block)).
        return UnwrappingDict(unwrap(self)._copy_due)

    @property
    def records_new_block_ids(self):
        impl = unwrap(self)
        if not hasattr(impl, "records_new_block_ids"):
            raise ImplLacks(F.ZEROING, "records_new_block_ids")
        return impl.records_new_block_ids

    # vLLM's private names for state impl keeps under its own names: the
    # tests read them (checkpoint reservations, first allocations, moving a
    # scratch block).
    _PRIVATE = {
        "_checkpoints": "prefill_checkpoints",
        "_allocated_block_reqs": "allocated_requests",
        "_relocate_speculative_block": "relocate_speculative_block",
        # (0.30's name of the Mamba junction checkpoints.)
        "fine_grained_prefix_cache": "shared_prefix_checkpoint",
    }


def _manager(impl_cls, name):
    # The class-level facts vLLM's connectors read off a manager class.
    facts = {"supports_fine_grained_hash_lookup": impl_cls.supports_fine_grained_hash_lookup}
    adapter = type(name, (_Manager,), {"_impl_cls": impl_cls, **facts})
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
HiSparseSourceManager = _manager(hisparse.HiSparseSourceManager, "HiSparseSourceManager")
HiSparseHotManager = _manager(hisparse.HiSparseHotManager, "HiSparseHotManager")
HiSparseResidentManager = _manager(hisparse.HiSparseResidentManager, "HiSparseResidentManager")


CircularBufferManager = _manager(circular_buffer.CircularBufferManager, "CircularBufferManager")
RSWAManager = _manager(rswa.RSWAManager, "RSWAManager")


_EAGLE_HOLDS_LAST_TOKEN = convert.PROFILE.mamba_prefill_checkpoints.on_hash_grid


def get_mamba_prefill_checkpoint_position(num_tokens, hash_block_size, drop_eagle_block,
                                          *args, **kwargs):
    """vLLM's helper as the running release computes it (0.31 keeps the last
    token back under EAGLE too): impl's, with the profile's shape."""
    return mamba_checkpoint.get_mamba_prefill_checkpoint_position(
        num_tokens, hash_block_size, drop_eagle_block, *args,
        eagle_holds_last_token=_EAGLE_HOLDS_LAST_TOKEN, **kwargs)


def _hit_reports_tokens() -> bool:
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager as Vllm

    method = inspect.unwrap(Vllm.find_longest_cache_hit)
    returned = str(method.__annotations__.get("return", ""))
    return returned.replace(" ", "").endswith("...],int]")


def _takes(fn, name: str) -> bool:
    """Whether impl's callable has a parameter `name`."""
    return name in inspect.signature(fn).parameters


def get_manager_for_kv_cache_spec(kv_cache_spec, max_in_flight_tokens, max_model_len,
                                  role=None, **kwargs):
    spec = convert.to_impl_spec(kv_cache_spec)
    impl_cls = imanagers.manager_class_for(spec, convert.to_impl_role(role))
    kwargs.setdefault("max_admission_blocks_per_request",
                      spec.max_admission_blocks_per_request(max_in_flight_tokens,
                                                            max_model_len))
    return ADAPTER_FOR[impl_cls](spec, **kwargs)
