"""Engine capture of a hybrid model: a tiny real vLLM engine whose layers mix
sliding-window and full attention (two KV cache groups), recorded and replayed
conformant on impl and vLLM; and the header's mapping of vLLM's KV cache groups."""

from types import SimpleNamespace

import pytest

from harness.capture.errors import CaptureGap
from harness.report.text import format_failure
from harness.sources.replay import check_trace
from harness.trace import open_trace

pytestmark = pytest.mark.vllm


def test_hybrid_engine_trace_replays_conformant(tmp_path, small_preset):
    from harness.capture.engine_capture import EngineOptions, capture_engine
    from harness.capture.presets import load_preset

    preset = load_preset(small_preset("tight-memory-preemption", requests={
        "count": 6, "output_tokens": [24, 48]}))
    out = tmp_path / "hybrid.jsonl"
    r = capture_engine(preset, str(out), EngineOptions(
        sliding_window=64, prefix_cache_retention_interval=None), progress=False)
    assert r.num_requests == 6

    h = open_trace(str(out)).header
    assert [(g.kind, g.block_size, g.sliding_window) for g in h.cache.groups] == [
        ("sliding_window", 32, 64), ("full_attention", 32, None)]
    assert h.cache.max_in_flight_tokens is not None
    assert h.cache.prefix_cache_retention_interval is None  # dense, as asked
    assert h.model.num_layers == 4 and "sliding window 64" in h.description

    # The sliding-window group drops blocks out of the window: some lookup hits
    # with null blocks (id 0) in group 0 and real ones in group 1.
    lookups = [rec.answer for rec in open_trace(str(out)).records
               if rec.event.kind == "lookup" and rec.answer["hit_tokens"] > 64]
    assert any(0 in a["block_ids"][0] and 0 not in a["block_ids"][1] for a in lookups)

    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0, o.divergence and format_failure(o.divergence)


def test_hybrid_engine_with_default_sparse_retention_replays_conformant(tmp_path,
                                                                      small_preset):
    """vLLM's engine default (retention 0): the header records it, lookups
    carry the shared-prefix boundary, and the trace replays on both backends."""
    from harness.capture.engine_capture import EngineOptions, capture_engine
    from harness.capture.presets import load_preset

    preset = load_preset(small_preset("rag-shared-documents", requests={
        "count": 8, "output_tokens": [8, 16]}))
    out = tmp_path / "hybrid-sparse.jsonl"
    capture_engine(preset, str(out), EngineOptions(sliding_window=64), progress=False)
    trace = open_trace(str(out))
    assert trace.header.cache.prefix_cache_retention_interval == 0
    assert trace.header.cache.reports_shared_prefix_boundary
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0, o.divergence and format_failure(o.divergence)


def _scheduler(groups, retention=None, **kv_extra):
    """A stand-in with just what header.cache_config_of reads."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    kv = KVCacheConfig(num_blocks=17, kv_cache_tensors=[], kv_cache_groups=groups,
                       prefix_cache_retention_interval=retention, **kv_extra)
    return SimpleNamespace(
        kv_cache_config=kv,
        cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256",
                                     enable_prefix_caching=True),
        max_model_len=1024, log_stats=True, enable_kv_cache_events=True,
        scheduler_config=SimpleNamespace(watermark=0.0),
        vllm_config=SimpleNamespace(max_in_flight_tokens=256),
        block_size=32, hash_block_size=32)


def _spec(kind, **kw):
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    return getattr(kvi, kind)(block_size=32, num_kv_heads=1, head_size=32,
                              dtype=torch.float32, **kw)


def test_header_maps_attention_groups_and_refuses_what_traces_cannot_say():
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from harness.capture.header import cache_config_of

    groups = [KVCacheGroupSpec(["a"], _spec("SlidingWindowSpec", sliding_window=48)),
              KVCacheGroupSpec(["b"], _spec("FullAttentionSpec")),
              KVCacheGroupSpec(["c"], _spec("ChunkedLocalAttentionSpec",
                                            attention_chunk_size=64))]
    config = cache_config_of(_scheduler(groups))
    assert [(g.kind, g.sliding_window, g.attention_chunk_size) for g in config.groups] == [
        ("sliding_window", 48, None), ("full_attention", None, None),
        ("chunked_local_attention", None, 64)]
    assert config.max_in_flight_tokens == 256

    # Full attention only: no admission cap in the header (traces stay as before).
    only_full = cache_config_of(_scheduler([groups[1]], retention=0))
    assert only_full.max_in_flight_tokens is None

    # 0.32's default sparse retention of sliding-window blocks is recorded
    # (full attention alone ignores it: the header stays as before).
    assert cache_config_of(_scheduler(groups, retention=0)).prefix_cache_retention_interval == 0
    assert cache_config_of(_scheduler(groups)).prefix_cache_retention_interval is None
    assert only_full.prefix_cache_retention_interval is None
    # Neither has the window's extra retained tokens (multi-module MTP).
    extra = [KVCacheGroupSpec(["a"], _spec("SlidingWindowSpec", sliding_window=48,
                                           extra_retained_tokens=2))]
    with pytest.raises(CaptureGap, match="extra_retained_tokens"):
        cache_config_of(_scheduler(extra))


def test_recorder_records_block_copies_as_take_block_copies():
    """take_kv_cache_block_copies (0.32 hybrids whose hits end inside a block) is
    recorded with vLLM's answer, as the backends answer `take_block_copies`."""
    from harness.backends.vllm_backend import VllmBackend
    from harness.capture.recorder import Recorder, instrument, uninstrument
    from harness.fuzz.campaign import case_rng, run_case
    from harness.fuzz.generate import FuzzConfig, draw_case
    from impl.profiles import get_profile

    profile = get_profile("0.32")
    for i in range(150):  # the first fuzz case of a Mamba hybrid that copies a block
        config, actions = draw_case(case_rng(11, i), FuzzConfig(kinds=("hybrid_mamba",)), 40)
        run = run_case(config, actions, profile)
        copying = [n for n, (e, a) in enumerate(run.events)
                   if e.kind == "take_block_copies" and a["copies"]]
        if copying:
            break
    else:
        pytest.fail("no fuzz case copied a block")
    events = [e for e, _ in run.events]
    backend = VllmBackend(config, profile)
    for e in events[:copying[0]]:
        backend.run(e)

    lines = []
    sink = SimpleNamespace(write=lines.append, close=lambda: None)
    instrument(backend.manager, Recorder(sink, config.hash_block_size))
    try:
        answer = backend.run(events[copying[0]])
    finally:
        uninstrument(backend.manager)
    assert answer["copies"]
    assert lines == [{"op": "take_block_copies", "answer": answer}]
