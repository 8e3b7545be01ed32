"""Block residency sampling (vLLM's names: KVCacheMetricsCollector,
BlockMetricsState); specs/KV_CACHE_MANAGER.md §16.8.

A sampled block is followed from the moment the pool hands it out until the
pool takes it back for reuse (or evicts it on request); then one eviction
event says how long it lived, how long it had gone unhit, and the spacing of
its last hits. Which blocks are followed is a coin toss per hand-out, so the
cost stays a small fraction of the pool's traffic.

The clock is `time.monotonic_ns` and the coin `random.random`, both looked up
on their modules at each call: a test that patches either one sees it here.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

_NS_PER_SECOND = 1e9
# Hit times kept per followed block: the newest four, i.e. three gaps.
ACCESS_HISTORY_LEN = 4


class _HasBlockId(Protocol):
    block_id: int


@dataclass(frozen=True, slots=True)
class KVCacheEvictionEvent:
    """One followed block's life, read when the pool took it back."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class BlockMetricsState:
    """What is remembered of one followed block (times in ns, monotonic)."""

    __slots__ = ("birth_time_ns", "last_access_ns", "access_history")

    def __init__(self) -> None:
        self.birth_time_ns = self.last_access_ns = time.monotonic_ns()
        self.access_history: deque[int] = deque((), ACCESS_HISTORY_LEN)

    def record_access(self) -> None:
        """A hit: it is the latest access, and joins the (bounded) history."""
        hit_at = self.last_access_ns = time.monotonic_ns()
        self.access_history.append(hit_at)

    def get_lifetime_seconds(self, now_ns: int | None = None) -> float:
        """Seconds since the block was handed out (to `now_ns`, else the clock)."""
        end = time.monotonic_ns() if now_ns is None else now_ns
        return (end - self.birth_time_ns) / _NS_PER_SECOND

    def get_idle_time_seconds(self, now_ns: int | None = None) -> float:
        """Seconds since the last hit, or since the hand-out if none came."""
        end = time.monotonic_ns() if now_ns is None else now_ns
        return (end - self.last_access_ns) / _NS_PER_SECOND

    def get_reuse_gaps_seconds(self) -> list[float]:
        """Spacing of the remembered hits, oldest first; fewer than two hits
        give no gap."""
        hits = self.access_history
        return [(after - before) / _NS_PER_SECOND
                for before, after in zip(hits, islice(hits, 1, None))]


class KVCacheMetricsCollector:
    """Follows a sample of blocks through the pool's hooks and queues an
    eviction event for each followed block the pool takes back."""

    # block id -> its state, for the followed blocks the pool still has out.
    block_metrics: dict[int, BlockMetricsState]

    def __init__(self, sample_rate: float = 0.01) -> None:
        # Written so that NaN is refused too.
        if not 0.0 < sample_rate <= 1.0:
            raise AssertionError(
                f"block sampling rate {sample_rate!r} is outside (0, 1]")
        self.sample_rate: float = sample_rate
        self.block_metrics = {}
        self._pending: list[KVCacheEvictionEvent] = []

    def should_sample_block(self) -> bool:
        """The coin toss for one hand-out: heads with the sampling rate."""
        return self.sample_rate > random.random()

    def on_block_allocated(self, block: _HasBlockId) -> None:
        if not self.should_sample_block():
            return  # an older state of the id, if any, stays in place
        followed = self.block_metrics
        followed[block.block_id] = BlockMetricsState()

    def on_block_accessed(self, block: _HasBlockId) -> None:
        state = self.block_metrics.get(block.block_id)
        if state is not None:
            state.record_access()

    def on_block_evicted(self, block: _HasBlockId) -> None:
        state = self.block_metrics.pop(block.block_id, None)
        if state is None:
            return
        # One clock reading for both spans, so they agree on "now".
        now = time.monotonic_ns()
        self._pending.append(KVCacheEvictionEvent(
            lifetime_seconds=state.get_lifetime_seconds(now),
            idle_seconds=state.get_idle_time_seconds(now),
            reuse_gaps_seconds=tuple(state.get_reuse_gaps_seconds()),
        ))

    def reset(self) -> None:
        """Forget every followed block and every undrained event (the prefix
        cache was reset: nothing followed so far can be hit again)."""
        self.block_metrics.clear()
        self._pending.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        """The events queued since the last drain, oldest first; the queue
        starts empty again."""
        drained, self._pending = self._pending, []
        return drained


def make_metrics_collector(kv_cache_metrics: bool,
                           kv_cache_metrics_sample: float = 0.01
                           ) -> KVCacheMetricsCollector | None:
    """The collector a scheduler hands its KV cache manager: none unless the
    observability switch is on (vLLM's `--kv-cache-metrics` and
    `--kv-cache-metrics-sample`)."""
    return KVCacheMetricsCollector(kv_cache_metrics_sample) if kv_cache_metrics else None
