"""The offload adapters (harness/peer/adapters/offload.py): vLLM's names are
rebound to them, they answer in vLLM's types with impl's answers, and vLLM's
private names its tests patch reach impl. Negative control: a bug planted in
impl shows in the adapter's answer. Cost: well under 1 s."""

from __future__ import annotations

import vllm.v1.kv_offload.cpu.manager as vman
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics

from harness.peer import rebind
from harness.peer.adapters import offload
from impl.kv_offload.policies.lru import LRUCachePolicy as ImplLRU


def _keys(*hashes):
    return [make_offload_key(str(h).encode(), 0) for h in hashes]


def _scenario(manager):
    ctx = ReqContext(req_id="r")
    out = []
    out.append(manager.prepare_store(_keys(1, 2, 3), ctx).evicted_keys)
    manager.complete_store(_keys(1, 2, 3), ctx)
    manager.touch(_keys(1), ctx)
    out.append(manager.lookup(_keys(2)[0], ctx))
    spec = manager.prepare_load(_keys(3), ctx)
    out.append([int(x) for x in spec.block_ids])
    manager.complete_load(_keys(3), ctx)
    plan = manager.prepare_store(_keys(4), ctx)
    out.append((plan.keys_to_store, [int(x) for x in plan.store_spec.block_ids],
                plan.evicted_keys))
    out.append([(e.keys, e.medium, e.removed) for e in manager.take_events()])
    out.append(manager.get_stats().reduce()[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC])
    return out


def test_vllms_names_are_rebound_to_the_adapters():
    table = rebind.table()
    assert table[id(vman.CPUOffloadingManager)][1] is offload.CPUOffloadingManager


def test_adapter_answers_as_vllm_does_in_vllms_types():
    adapter = offload.CPUOffloadingManager(num_chunks=3, enable_events=True)
    theirs = _scenario(vman.CPUOffloadingManager(num_chunks=3, enable_events=True))
    assert _scenario(adapter) == theirs
    assert adapter.lookup(_keys(9)[0], ReqContext("x")) is LookupResult.MISS
    assert isinstance(adapter.prepare_load(_keys(3), ReqContext("x")), CPULoadStoreSpec)
    assert adapter.medium is Medium.CPU
    assert isinstance(adapter._policy, offload.LRUCachePolicy)
    assert isinstance(offload.CPUOffloadingManager(2, "arc")._policy, offload.ARCCachePolicy)


def test_a_planted_impl_bug_shows_through_the_adapter(monkeypatch):
    theirs = _scenario(vman.CPUOffloadingManager(num_chunks=3, enable_events=True))
    monkeypatch.setattr(ImplLRU, "touch", lambda self, keys, ctx: None)  # touch forgets
    assert _scenario(offload.CPUOffloadingManager(num_chunks=3, enable_events=True)) != theirs
