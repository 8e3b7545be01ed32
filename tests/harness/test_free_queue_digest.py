"""The free queue's digest (harness/backends/free_queue_digest.py): kept up to
date on impl's and vLLM's queues through every operation, equal to the digest
of the queue's list at every step, O(1) per change (no walk of the queue after
the first), and a different order gives a different digest. In lockstep a
digest mismatch reports both queues and the first position they differ."""

import random

import pytest

import harness.backends.free_queue_digest as fqd
from harness.backends.free_queue_digest import digest_of_ids, free_queue_digest
from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import Checkpoint
from harness.sources.workload import SchedulerWorkload, WorkloadSpec
from impl.block import KVCacheBlock
from impl.free_queue import FreeKVCacheBlockQueue
from impl.profiles import get_profile

P = get_profile("0.32")


def _queues():
    out = [("impl", FreeKVCacheBlockQueue, KVCacheBlock)]
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue as VQ
    from vllm.v1.core.kv_cache_utils import KVCacheBlock as VB

    out.append(("vllm", VQ, VB))
    return out


def _random_ops(queue_cls, block_cls, steps: int, seed: int):
    """Yield (queue, ids) after each random operation of every kind."""
    rng = random.Random(seed)
    blocks = [block_cls(i) for i in range(40)]
    q = queue_cls(blocks)
    out: list = []
    yield q, [b.block_id for b in q.get_all_free_blocks()]
    for _ in range(steps):
        r = rng.random()
        n = q.num_free_blocks
        if r < 0.15 and n:
            out.append(q.popleft())
        elif r < 0.35 and n:
            out += q.popleft_n(rng.randint(0, n))
        elif r < 0.55 and n:
            b = rng.choice(q.get_all_free_blocks())
            q.remove(b)
            out.append(b)
        elif out:
            rng.shuffle(out)
            k = rng.randint(1, len(out))
            put, out = out[:k], out[k:]
            how = rng.choice(("append", "append_n", "prepend_n"))
            if how == "append":
                for b in put:
                    q.append(b)
            else:
                getattr(q, how)(put)
        yield q, [b.block_id for b in q.get_all_free_blocks()]


@pytest.mark.vllm
@pytest.mark.parametrize("side", ["impl", "vllm"])
def test_incremental_digest_equals_the_lists_digest_at_every_step(side, monkeypatch):
    name, queue_cls, block_cls = next(x for x in _queues() if x[0] == side)
    walks: list = []
    real = fqd._walk_total
    tracked = False
    for q, ids in _random_ops(queue_cls, block_cls, 2000, seed=7):
        assert free_queue_digest(q) == digest_of_ids(ids)
        if not tracked:
            # Tracked from here on: later reads walk nothing.
            tracked = True
            monkeypatch.setattr(fqd, "_walk_total", lambda *a: walks.append(1) or real(*a))
    assert walks == []


def test_order_matters():
    assert digest_of_ids([1, 2, 3]) != digest_of_ids([2, 1, 3])
    assert digest_of_ids([1, 2, 3]) != digest_of_ids([1, 2])
    assert digest_of_ids([]) != digest_of_ids([0])
    assert len({digest_of_ids(list(p)) for p in __import__("itertools").permutations(range(6))}
               ) == 720


def test_what_the_queue_really_did_is_what_counts(monkeypatch):
    """Negative control: append_n that links the blocks in reverse. The
    digest reads the links the call made, not the list it was given, so it
    matches the (wrong) queue, not the intended one."""
    blocks = [KVCacheBlock(i) for i in range(8)]
    q = FreeKVCacheBlockQueue(blocks[:4])
    free_queue_digest(q)
    real = FreeKVCacheBlockQueue.append_n
    monkeypatch.setattr(FreeKVCacheBlockQueue, "append_n",
                        lambda self, bs: real(self, list(bs)[::-1]))
    q.append_n(blocks[4:])
    assert [b.block_id for b in q.get_all_free_blocks()] == [0, 1, 2, 3, 7, 6, 5, 4]
    assert free_queue_digest(q) == digest_of_ids([0, 1, 2, 3, 7, 6, 5, 4])
    assert free_queue_digest(q) != digest_of_ids([0, 1, 2, 3, 4, 5, 6, 7])


def test_an_unknown_mutator_makes_the_next_read_walk_again():
    class Queue(FreeKVCacheBlockQueue):
        __slots__ = ()

        def rotate(self):  # a method the tracker does not know
            self.append(self.popleft())

    blocks = [KVCacheBlock(i) for i in range(5)]
    q = Queue(blocks)
    free_queue_digest(q)
    q.rotate()
    assert free_queue_digest(q) == digest_of_ids([1, 2, 3, 4, 0])


@pytest.mark.parametrize("num_blocks", [1000, 100_000])
def test_a_workload_never_walks_the_queue_after_start(num_blocks, monkeypatch):
    """Per-event cost independent of the pool: counted, not timed."""
    config = CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(16),))
    backend = ImplBackend(config, P)
    backend.start()
    walks = []
    real = fqd._walk_total
    monkeypatch.setattr(fqd, "_walk_total", lambda *a: walks.append(1) or real(*a))
    spec = WorkloadSpec(seed=3, num_requests=40, max_running=8, max_waiting=8)
    events = SchedulerWorkload(spec, P, 1000).events()
    result = run_lockstep(events, [backend])
    assert result.failure is None and result.num_events > 1000
    assert walks == []


@pytest.mark.vllm
def test_a_digest_mismatch_reports_both_queues(monkeypatch):
    """A wrong free order in impl (0.17's, while vLLM is 0.32): caught at the
    first checkpoint after a free, the report pointing into the queues."""
    import dataclasses

    import impl.block_pool
    from harness.backends.vllm_backend import VllmBackend
    from impl.profiles import FreeOrder, VersionProfile

    real_init = impl.block_pool.BlockPool.__init__

    def as_017(value):
        if isinstance(value, VersionProfile):
            return dataclasses.replace(value, free_order=FreeOrder.APPEND_ALL)
        return value

    monkeypatch.setattr(impl.block_pool.BlockPool, "__init__", lambda self, *a, **k: real_init(
        self, *map(as_017, a), **{key: as_017(v) for key, v in k.items()}))
    config = CacheConfig(num_blocks=24, groups=(GroupConfig(16),))
    spec = WorkloadSpec(seed=1, block_size=16)
    result = run_lockstep(SchedulerWorkload(spec, P, 24).events(),
                          [VllmBackend(config, P), ImplBackend(config, P)])
    f = result.failure
    assert f is not None and isinstance(f.event, Checkpoint)
    assert "free_queue_digest" in f.event.fields
    assert f.field.startswith("free_queue[")
    assert f.answers["vllm"]["free_queue"] != f.answers["impl"]["free_queue"]
