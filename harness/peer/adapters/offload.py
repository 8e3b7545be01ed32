"""vLLM's CPU offload manager and its policies (vllm.v1.kv_offload.cpu) over
impl's (impl.kv_offload). Answers are impl's, handed back in vLLM's types
(LookupResult, CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent,
OffloadingConnectorStats) so vLLM's tests compare them with their own.
vLLM's private names its tests read or patch are mapped onto impl's:
`_policy`, `_num_evictable_cache_chunks`, `_record_request_cache_access`,
`_allocate_chunks`, LRU's `_heap`, the factory's `_registry`. Request
contexts are vLLM's own: impl reads them through the same methods."""

from __future__ import annotations

import contextlib
import dataclasses

from harness.peer import convert
from impl.kv_offload import manager as imanager
from impl.kv_offload.chunk import Chunk
from impl.kv_offload.keys import make_offload_key  # noqa: F401  (rebound name)
from impl.kv_offload.policies import arc as iarc
from impl.kv_offload.policies import base as ibase
from impl.kv_offload.policies import lru as ilru
from impl.kv_offload.policies import request_lru as irlru
from impl.kv_offload.policies.registry import PolicyRegistry

ChunkStatus = Chunk


class CachePolicy(ibase.CachePolicy):
    pass


# The release's LRU (profile.offload_request_ranked_lru): a test builds the
# policy by vLLM's name, and the factory hands out this same class.
_LRU = (irlru.RequestRankedLRUCachePolicy if convert.PROFILE.offload_request_ranked_lru
        else ilru.LRUCachePolicy)


class LRUCachePolicy(_LRU, CachePolicy):
    @property
    def _heap(self):
        return self.queue


class ARCCachePolicy(iarc.ARCCachePolicy, CachePolicy):
    pass


class _FactoryMeta(type):
    @property
    def _registry(cls):
        return cls._loaders

    @_registry.setter
    def _registry(cls, value):
        cls._loaders = value


class CachePolicyFactory(PolicyRegistry, metaclass=_FactoryMeta):
    # The built-in names give the adapters' policy classes (vLLM's tests
    # compare the factory's answer with the names they import); "lru" is
    # the release's LRU already.
    _loaders = {"lru": lambda: LRUCachePolicy, "arc": lambda: ARCCachePolicy}

    @classmethod
    def get_cache_policy_cls(cls, name, module_path=None, request_ranked_lru=False):
        return super().get_cache_policy_cls(name, module_path)


def _alias(impl_name: str) -> property:
    return property(lambda self: getattr(self, impl_name),
                    lambda self, value: setattr(self, impl_name, value))


class CPUOffloadingManager(imanager.CPUOffloadingManager):
    def __init__(self, num_chunks: int, cache_policy: str = "lru",
                 cache_policy_module_path: str | None = None, enable_events: bool = False,
                 store_threshold: int = 1, max_tracker_size: int = 64_000,
                 info=None) -> None:
        from vllm.v1.kv_offload.base import Medium

        profile = convert.PROFILE
        super().__init__(num_chunks, cache_policy, cache_policy_module_path, enable_events,
                         store_threshold, max_tracker_size, policies=CachePolicyFactory,
                         request_ranked_lru=profile.offload_request_ranked_lru,
                         announce_failed_stores=profile.offload_failed_store_events)
        self.medium = Medium.CPU
        # 0.33's CPUOffloadingInfo: configuration, handed back as given.
        self._info = {} if info is None else info.as_config_info()

    def config_info(self):
        return [self._info]

    @property
    def lock(self):
        # 0.33's connector enters the manager's lock around every call; impl's
        # manager is only ever entered from one thread, so it is a no-op (as
        # vLLM's own CPU manager's is).
        return contextlib.nullcontext()

    _policy = _alias("policy")
    _num_evictable_cache_chunks = _alias("num_evictable")
    _record_request_cache_access = _alias("_note_access")
    _allocate_chunks = _alias("_take_slots")
    stores_skipped_in_current_batch = _alias("skipped_stores")

    @property
    def counts(self):
        # The store threshold's offer counts (None without a threshold).
        return None if self.offers is None else self.offers.counts

    def lookup(self, key, req_context):
        from vllm.v1.kv_offload.base import LookupResult

        return LookupResult[super().lookup(key, req_context).name]

    def get_load_source(self, key, req_context):
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        return CacheHitSource[super().get_load_source(key, req_context).upper()]

    def on_new_request(self, req_context):
        from vllm.v1.kv_offload.base import OffloadPolicy, RequestOffloadingContext

        answer = super().on_new_request(req_context)
        return RequestOffloadingContext(policy=OffloadPolicy[answer.policy.name])

    def prepare_load(self, keys, req_context):
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        return CPULoadStoreSpec(super().prepare_load(keys, req_context))

    def prepare_store(self, keys, req_context):
        from vllm.v1.kv_offload.base import PrepareStoreOutput
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        plan = super().prepare_store(keys, req_context)
        if plan is None:
            return None
        return PrepareStoreOutput(keys_to_store=plan.keys_to_store,
                                  store_spec=CPULoadStoreSpec(plan.chunk_ids),
                                  evicted_keys=plan.evicted_keys)

    def take_events(self):
        from vllm.v1.kv_offload.base import OffloadingEvent

        marks = "metadata_only" in {f.name for f in dataclasses.fields(OffloadingEvent)}
        for event in super().take_events():
            extra = {"metadata_only": event.metadata_only} if marks else {}
            yield OffloadingEvent(keys=event.keys, medium=self.medium, removed=event.removed,
                                  **extra)

    def get_stats(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )
        from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M

        snap = super().get_stats()
        stats = OffloadingConnectorStats()
        stats.set_gauge(M.CPU_CACHE_USAGE_PERC, snap.usage)
        for size in snap.allocation_sizes:
            stats.observe_histogram(M.CPU_ALLOCATION_SIZE, size)
        stats.set_gauge(M.CPU_CACHE_WRITE_USAGE_PERC, snap.write_usage)
        stats.set_gauge(M.CPU_CACHE_READ_USAGE_PERC, snap.read_usage)
        if snap.stores_skipped is not None:
            stats.increase_counter(M.STORES_SKIPPED, snap.stores_skipped)
        return stats


def rebound() -> list[tuple[object, object]]:
    """(vLLM object, adapter) pairs for the rebinding table."""
    import vllm.v1.kv_offload.base as vbase
    import vllm.v1.kv_offload.cpu.manager as vman
    import vllm.v1.kv_offload.cpu.policies.arc as varc
    import vllm.v1.kv_offload.cpu.policies.base as vpbase
    import vllm.v1.kv_offload.cpu.policies.factory as vfac
    import vllm.v1.kv_offload.cpu.policies.lru as vlru

    return [(vman.CPUOffloadingManager, CPUOffloadingManager),
            (vlru.LRUCachePolicy, LRUCachePolicy), (varc.ARCCachePolicy, ARCCachePolicy),
            (vpbase.CachePolicy, CachePolicy), (vpbase.ChunkStatus, ChunkStatus),
            (vfac.CachePolicyFactory, CachePolicyFactory),
            (vbase.make_offload_key, make_offload_key)]
