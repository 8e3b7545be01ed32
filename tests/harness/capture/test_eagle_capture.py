"""A server running speculative decoding with an EAGLE / MTP drafter is
capturable: the trace header records use_eagle, the prefill lookahead and the
draft groups, and the captured trace replays on impl and diffs clean against
vLLM (whose lookups then drop the draft group's last block)."""

from __future__ import annotations

import pytest

from harness.capture.presets import load_preset
from harness.capture.recorder import Recorder, instrument
from harness.capture.sinks import JsonlSink
from harness.sources.replay import check_trace
from harness.trace import open_trace

pytestmark = pytest.mark.vllm


def _eagle_scheduler(tmp_path):
    """A real Scheduler whose KV cache manager is the one an EAGLE server
    builds: a target and a draft group, use_eagle, multi-module lookahead."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from harness.capture.scheduler_capture import _Requests, build_scheduler
    from harness.capture.tiny_model import TinyModel

    preset = load_preset("few-shot")
    scheduler = build_scheduler(preset, TinyModel().write(str(tmp_path / "model")))
    bs = preset.engine.block_size
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=preset.engine.num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["target"], spec),
                                            KVCacheGroupSpec(["draft"], spec,
                                                             is_eagle_group=True)])
    scheduler.kv_cache_config = config
    scheduler.kv_cache_manager = KVCacheManager(
        config, max_model_len=scheduler.max_model_len, scheduler_block_size=bs,
        hash_block_size=bs, enable_caching=True, use_eagle=True, num_prefill_lookahead=2,
        log_stats=scheduler.log_stats, enable_kv_cache_events=scheduler.enable_kv_cache_events)
    scheduler.num_prefill_lookahead = 2
    return scheduler, _Requests(preset), bs


def test_a_server_with_eagle_is_captured_and_replays(tmp_path):
    from vllm.v1.request import RequestStatus

    from harness.capture.header import header_of
    from harness.capture.scheduler_capture import hash_seed_env
    from harness.capture.synth import NewRequest

    with hash_seed_env("0"):
        scheduler, requests, bs = _eagle_scheduler(tmp_path)
        header = header_of(scheduler, "production")
        cache = header.cache
        assert cache.use_eagle and cache.num_prefill_lookahead == 2
        assert [g.is_eagle_group for g in cache.groups] == [False, True]
        path = tmp_path / "eagle.jsonl"
        sink = JsonlSink(str(path), header)
        manager = scheduler.kv_cache_manager
        instrument(manager, Recorder(sink, cache.hash_block_size))
        hits = []
        for rid, tail in (("a", []), ("b", [7])):
            request = requests.make(NewRequest(rid, list(range(4 * bs)) + tail, 4))
            blocks, hit, *_ = manager.get_computed_blocks(request)
            assert manager.allocate_slots(request, request.num_tokens - hit, hit, blocks)
            request.num_computed_tokens = request.num_tokens
            request.status = RequestStatus.RUNNING
            hits.append(hit)
            request.status = RequestStatus.FINISHED_STOPPED  # as the scheduler finishes it
            manager.free(request)
        sink.close()
    # a's 64 computed tokens minus the 1 a lookahead of 2 rewrites leave 3
    # full blocks cached; b matches them and, its group looked up with the
    # draft group, drops the last: 2 blocks.
    assert hits == [0, 2 * bs]
    trace = open_trace(str(path))
    assert trace.header.cache.use_eagle
    assert check_trace(str(path), ["vllm", "impl"]).exit_code == 0
