"""The HiSparse host tier's pool (vLLM publishes it as medium "CPU"); spec §14.1.

A pool of its own (own ids, null block, free queue, cache map) whose KV
events land in the device pool's queue, so one drain hands out both in the
order they happened. Its blocks carry the pool, so a caller that frees a
request's blocks of both tiers through the device pool frees each in its own.
"""

from dataclasses import dataclass

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_metrics import KVCacheMetricsCollector
from impl.kv_events import MEDIUM_CPU, KVCacheEvent


class HostKVCacheBlock(KVCacheBlock):
    """A block of the host pool; knows the pool it belongs to."""

    __slots__ = ("pool",)


@dataclass(eq=False)
class HostBlockPool(BlockPool):
    # The device pool whose event queue this pool's events join.
    event_owner: BlockPool | None = None

    _block_type = HostKVCacheBlock

    def __post_init__(self) -> None:
        super().__post_init__()
        for block in self.blocks:
            block.pool = self
        if self.event_owner is not None:
            self.event_owner._routes_foreign = True

    @property
    def kv_event_queue(self) -> list[KVCacheEvent]:
        owner = self.event_owner
        return self._own_events if owner is None else owner.kv_event_queue

    @kv_event_queue.setter
    def kv_event_queue(self, events: list[KVCacheEvent]) -> None:
        # Set by the base pool when built and when drained: the owner's
        # queue is the one that counts, so only a pool of its own keeps one.
        self._own_events = events


def make_host_pool(device_pool: BlockPool, num_blocks: int, enable_caching: bool) -> HostBlockPool:
    """The host pool of a manager whose blocks live on the host, built like
    the device pool it sits next to (its residency sampled apart, at the
    device pool's rate)."""
    device_metrics = device_pool.metrics_collector
    return HostBlockPool(
        num_blocks, enable_caching, device_pool.hash_block_size,
        device_pool.enable_kv_cache_events, profile=device_pool.profile,
        events_use_int_hashes=device_pool.events_use_int_hashes, medium=MEDIUM_CPU,
        event_owner=device_pool,
        metrics_collector=(None if device_metrics is None
                           else KVCacheMetricsCollector(device_metrics.sample_rate)),
    )
