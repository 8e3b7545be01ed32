"""Block residency metrics, impl against the installed vLLM: one seeded
sequence of pool operations (hand-outs, frees, hits, evictions by id, prefix
cache resets) under one scripted clock and one coin, played on vLLM's
BlockPool with vLLM's collector and on impl's through the peer adapters;
the drained eviction events and the followed block ids must agree after
every step."""

from __future__ import annotations

import random
import time

import pytest

pytestmark = pytest.mark.vllm

NUM_BLOCKS = 8


def script(seed: int, steps: int) -> list[tuple[int, str, int]]:
    """(clock in ns, operation, argument): the argument is a count for
    'alloc', else a pick resolved against the run's own blocks."""
    rng = random.Random(seed)
    now, ops = 1_000, []
    for _ in range(steps):
        now += rng.randrange(1, 5_000_000_000)
        op = rng.choices(["alloc", "free", "touch", "evict", "reset"], [5, 7, 3, 1, 1])[0]
        ops.append((now, op, rng.randrange(1, 4) if op == "alloc" else rng.randrange(1 << 30)))
    return ops


def play(pool, ops, coin_seed: int, monkeypatch) -> list[tuple]:
    """What the collector says after each step: (events drained, followed ids)."""
    clock = [0]
    monkeypatch.setattr(time, "monotonic_ns", lambda: clock[0])
    random.seed(coin_seed)
    held: list = []  # one entry per reference the script holds
    collector = pool.metrics_collector
    seen = []
    for now, op, arg in ops:
        clock[0] = now
        if op == "alloc" and arg <= pool.get_num_free_blocks():
            held += pool.get_new_blocks(arg)
        elif op == "free" and held:
            pool.free_blocks([held.pop(arg % len(held))])
        elif op == "touch":
            block = pool.blocks[1 + arg % (NUM_BLOCKS - 1)]
            pool.touch([block])
            held.append(block)
        elif op == "evict":
            pool.evict_blocks({1 + arg % (NUM_BLOCKS - 1)})
        elif op == "reset":
            pool.reset_prefix_cache()
        events = [(e.lifetime_seconds, e.idle_seconds, e.reuse_gaps_seconds)
                  for e in collector.drain_events()]
        seen.append((events, sorted(collector.block_metrics)))
    return seen


def first_divergence(seed: int, rate: float, monkeypatch) -> tuple[int, object, object] | None:
    from vllm.v1.core.block_pool import BlockPool as VllmPool
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector

    from harness.peer.adapters.metrics import KVCacheMetricsCollector
    from harness.peer.adapters.pool import BlockPool

    ops = script(seed, 300)
    theirs = play(VllmPool(NUM_BLOCKS, True, 4, metrics_collector=VllmCollector(rate)),
                  ops, seed, monkeypatch)
    mine = play(BlockPool(NUM_BLOCKS, True, 4, metrics_collector=KVCacheMetricsCollector(rate)),
                ops, seed, monkeypatch)
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if a != b:
            return i, a, b
    return None


@pytest.mark.parametrize("seed, rate", [(1, 1.0), (2, 0.5), (3, 0.3)])
def test_impl_follows_and_reports_the_blocks_vllm_does(seed, rate, monkeypatch):
    assert first_divergence(seed, rate, monkeypatch) is None


def test_the_script_reaches_every_kind_of_report(monkeypatch):
    from vllm.v1.core.block_pool import BlockPool as VllmPool
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector

    seen = play(VllmPool(NUM_BLOCKS, True, 4, metrics_collector=VllmCollector(1.0)),
                script(1, 300), 1, monkeypatch)
    events = [e for step, _ in seen for e in step]
    assert len(events) > 20
    assert any(len(gaps) == 3 for _, _, gaps in events)  # the history wrapped
    assert any(not gaps for _, _, gaps in events)
    assert any(lifetime > idle for lifetime, idle, _ in events)


def test_negative_control_a_shorter_hit_history_is_caught(monkeypatch):
    import impl.kv_cache_metrics as imetrics

    monkeypatch.setattr(imetrics, "ACCESS_HISTORY_LEN", 3)
    assert first_divergence(1, 1.0, monkeypatch) is not None


def test_a_collector_vllm_built_is_refused_by_name():
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector

    from harness.peer import features as F
    from harness.peer.adapters.pool import BlockPool
    from harness.peer.lacks import ImplLacks

    with pytest.raises(ImplLacks, match=F.METRICS_COLLECTOR.split(" (")[0]):
        BlockPool(NUM_BLOCKS, True, 4, metrics_collector=VllmCollector(1.0))


def test_drained_events_are_vllms_type():
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.metrics.stats import KVCacheEvictionEvent

    from harness.peer.adapters.metrics import KVCacheMetricsCollector

    collector = KVCacheMetricsCollector(1.0)
    collector.on_block_allocated(KVCacheBlock(3))
    collector.on_block_evicted(KVCacheBlock(3))
    (event,) = collector.drain_events()
    assert type(event) is KVCacheEvictionEvent
