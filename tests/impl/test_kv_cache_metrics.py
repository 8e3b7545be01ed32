"""Block residency metrics in impl (specs/KV_CACHE_MANAGER.md §16.8): the
collector on its own, and the pool hooks that feed it. Times are a patched
`time.monotonic_ns`; every expected figure is worked out by hand from the
clock readings the test sets. vLLM's own tests of the collector run on impl
through `make peer` (tests/v1/core/test_kv_cache_metrics.py)."""

from __future__ import annotations

import math
import random
import time

import pytest

from impl.block import KVCacheBlock
from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.block_pool import BlockPool
from impl.hisparse.host_pool import make_host_pool
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_metrics import (
    BlockMetricsState,
    KVCacheEvictionEvent,
    KVCacheMetricsCollector,
    make_metrics_collector,
)
from impl.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from impl.profiles import get_profile
from impl.request import Request

P = get_profile("0.32")
S = 1_000_000_000  # ns per second
HASHER = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(P, "sha256", "0"), True)


class Clock:
    """`time.monotonic_ns` at a time the test sets (in seconds)."""

    def __init__(self, monkeypatch) -> None:
        self.now = 0
        monkeypatch.setattr(time, "monotonic_ns", lambda: self.now)

    def at(self, seconds: float) -> Clock:
        self.now = int(seconds * S)
        return self


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return Clock(monkeypatch)


def pool(caching=True, n=6, rate=1.0) -> BlockPool:
    return BlockPool(n, caching, 4, profile=P, metrics_collector=KVCacheMetricsCollector(rate))


# -- the collector alone -------------------------------------------------------------------


def test_a_state_measures_from_its_birth_and_last_hit(clock):
    clock.at(1)
    state = BlockMetricsState()
    for t in (2, 3.5, 4, 7, 7.25):
        clock.at(t)
        state.record_access()
    clock.at(10)
    assert (state.birth_time_ns, state.last_access_ns) == (1 * S, int(7.25 * S))
    # Four hits kept (2 s dropped): three gaps.
    assert list(state.access_history) == [int(t * S) for t in (3.5, 4, 7, 7.25)]
    assert state.get_reuse_gaps_seconds() == [0.5, 3.0, 0.25]
    assert state.get_lifetime_seconds() == 9.0
    assert state.get_idle_time_seconds() == 2.75


def test_one_hit_gives_no_gap(clock):
    clock.at(1)
    state = BlockMetricsState()
    assert state.get_reuse_gaps_seconds() == []
    state.record_access()
    assert state.get_reuse_gaps_seconds() == []


@pytest.mark.parametrize("rate", [0.0, -0.5, 1.0001, math.nan, math.inf])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(AssertionError):
        KVCacheMetricsCollector(rate)


def test_sampling_is_a_coin_below_the_rate(monkeypatch):
    c = KVCacheMetricsCollector(0.25)
    monkeypatch.setattr(random, "random", lambda: 0.25)
    assert not c.should_sample_block()  # strictly below the rate
    monkeypatch.setattr(random, "random", lambda: 0.2499)
    assert c.should_sample_block()


def test_an_unsampled_hand_out_keeps_the_older_state(clock, monkeypatch):
    c = KVCacheMetricsCollector(0.5)
    block = KVCacheBlock(3)
    monkeypatch.setattr(random, "random", lambda: 0.1)
    clock.at(1)
    c.on_block_allocated(block)
    monkeypatch.setattr(random, "random", lambda: 0.9)
    clock.at(2)
    c.on_block_allocated(block)
    assert c.block_metrics[3].birth_time_ns == 1 * S


def test_eviction_reports_once_and_drains_in_order(clock):
    c = KVCacheMetricsCollector(1.0)
    a, b = KVCacheBlock(1), KVCacheBlock(2)
    clock.at(1)
    c.on_block_allocated(a)
    clock.at(2)
    c.on_block_allocated(b)
    clock.at(3)
    c.on_block_accessed(a)
    clock.at(6)
    c.on_block_accessed(a)
    c.on_block_accessed(KVCacheBlock(5))  # not followed: nothing happens
    clock.at(8)
    c.on_block_evicted(b)
    c.on_block_evicted(a)
    c.on_block_evicted(a)  # already gone: no second event
    assert c.drain_events() == [KVCacheEvictionEvent(6.0, 6.0, ()),
                                KVCacheEvictionEvent(7.0, 2.0, (3.0,))]
    assert c.drain_events() == [] and c.block_metrics == {}


def test_reset_forgets_states_and_undrained_events(clock):
    c = KVCacheMetricsCollector(1.0)
    c.on_block_allocated(KVCacheBlock(1))
    c.on_block_allocated(KVCacheBlock(2))
    c.on_block_evicted(KVCacheBlock(1))
    c.reset()
    assert (c.block_metrics, c.drain_events()) == ({}, [])


def test_the_switch_builds_a_collector_only_when_on():
    assert make_metrics_collector(False, 0.5) is None
    assert make_metrics_collector(True, 0.5).sample_rate == 0.5
    assert make_metrics_collector(True).sample_rate == 0.01


# -- the pool's hooks ----------------------------------------------------------------------


def reuse_lifecycle(p: BlockPool, clock: Clock) -> list[KVCacheEvictionEvent]:
    """Hand out block 1 at 1 s, free it, hit it at 3 s and 4 s, free it, and
    hand every free block out at 10 s (block 1 is reused)."""
    clock.at(1)
    (block,) = p.get_new_blocks(1)
    assert block.block_id == 1
    p.free_blocks([block])
    clock.at(3)
    p.touch([block])
    p.free_blocks([block])
    clock.at(4)
    p.touch([block])
    p.free_blocks([block])
    clock.at(10)
    p.get_new_blocks(p.get_num_free_blocks())
    return p.metrics_collector.drain_events()


def test_a_caching_pool_ends_a_life_when_it_reuses_the_block(clock):
    assert reuse_lifecycle(pool(), clock) == [KVCacheEvictionEvent(9.0, 6.0, (1.0,))]


def test_negative_control_a_pool_that_skips_the_eviction_hook_is_caught(clock, monkeypatch):
    # The bug: reuse never tells the collector; the lifecycle check must fail.
    monkeypatch.setattr(KVCacheMetricsCollector, "on_block_evicted", lambda self, block: None)
    with pytest.raises(AssertionError):
        assert reuse_lifecycle(pool(), clock) == [KVCacheEvictionEvent(9.0, 6.0, (1.0,))]


def test_without_caching_reuse_ends_no_life(clock):
    p = pool(caching=False)
    clock.at(1)
    (block,) = p.get_new_blocks(1)
    p.free_blocks([block])
    clock.at(5)
    (again,) = p.get_new_blocks(1)
    assert again is block
    # vLLM reports nothing here; the hand-out restarts the block's state.
    assert p.metrics_collector.drain_events() == []
    assert p.metrics_collector.block_metrics[block.block_id].birth_time_ns == 5 * S


def test_evicting_by_id_ends_a_life_keyed_or_not(clock):
    p = pool()
    clock.at(2)
    held = p.get_new_blocks(2)
    clock.at(7)
    p.evict_blocks({held[1].block_id})
    assert p.metrics_collector.drain_events() == [KVCacheEvictionEvent(5.0, 5.0, ())]
    assert set(p.metrics_collector.block_metrics) == {held[0].block_id}
    # The block is still held: eviction only ended what the collector knew.
    assert held[1].ref_cnt == 1
    p.evict_cached_block(held[0])
    assert p.metrics_collector.drain_events() == [KVCacheEvictionEvent(5.0, 5.0, ())]


def test_only_a_successful_prefix_cache_reset_clears_the_collector(clock):
    p = pool()
    held = p.get_new_blocks(2)
    assert not p.reset_prefix_cache()  # refused: blocks are held
    assert len(p.metrics_collector.block_metrics) == 2
    p.free_blocks(held)
    assert p.reset_prefix_cache()
    assert p.metrics_collector.block_metrics == {}


def test_a_pool_without_a_collector_follows_nothing(clock):
    p = BlockPool(4, True, 4, profile=P)
    p.free_blocks(p.get_new_blocks(3))
    p.get_new_blocks(3)
    assert p.metrics_collector is None


def request(rid, tokens) -> Request:
    r = Request(rid, list(tokens), len(tokens))
    HASHER.update(r)
    return r


def test_the_manager_hands_its_collector_to_the_pool(clock):
    collector = KVCacheMetricsCollector(1.0)
    config = KVCacheConfig(6, (KVCacheGroupSpec(("l0",), FullAttentionSpec(4)),))
    m = KVCacheManager(config, 4096, 4, P, metrics_collector=collector)
    assert m.block_pool.metrics_collector is collector
    clock.at(1)
    r = request("r", range(8))
    m.allocate_slots(r, 8)
    assert len(collector.block_metrics) == 2
    m.free(r)
    clock.at(3)
    m.allocate_slots(request("s", range(100, 120)), 20)
    assert collector.drain_events() == [KVCacheEvictionEvent(2.0, 2.0, ())] * 2


def test_the_hisparse_host_pool_samples_apart_at_the_device_rate():
    device = pool(rate=0.3)
    host = make_host_pool(device, 4, True)
    assert host.metrics_collector is not device.metrics_collector
    assert host.metrics_collector.sample_rate == 0.3
    assert make_host_pool(BlockPool(4, True, 4, profile=P), 4, True).metrics_collector is None
