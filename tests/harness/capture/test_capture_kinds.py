"""Capture of the circular-buffer, R-SWA and sparse MLA kinds: a real vLLM
Scheduler built over such groups, driven with requests while its KV cache
manager is recorded; the header states the groups (checked against the
managers vLLM built), and the trace replays conformant on impl and vLLM."""

from __future__ import annotations

import pytest

from harness.capture.errors import CaptureGap
from harness.report.text import format_failure
from harness.sources.replay import check_trace

pytestmark = pytest.mark.vllm


def _spec(kind, block_size=16, **kw):
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    kw.setdefault("head_size", 8)
    return getattr(kvi, kind)(block_size=block_size, num_kv_heads=1, dtype=torch.float32, **kw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model folder (config and tokenizer-free weights' shape), as the
    scheduler capture writes one: no model hub."""
    from harness.capture.tiny_model import TinyModel

    folder = tmp_path_factory.mktemp("tiny-model")
    TinyModel(vocab_size=64).write(str(folder))
    return str(folder)


def _scheduler(specs, model_dir, num_blocks=64, max_model_len=512):
    """vLLM's own Scheduler over these groups (one layer each)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=model_dir, skip_tokenizer_init=True,
                        max_model_len=max_model_len, dtype="float32", seed=0)
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64,
                            max_model_len=max_model_len, enable_chunked_prefill=True,
                            is_encoder_decoder=False)
    cache = CacheConfig(block_size=specs[0].block_size, enable_prefix_caching=True,
                        prefix_caching_hash_algo="sha256")
    vllm_config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)])
    cache.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv, vllm_config)
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=scheduler_block, hash_block_size=hash_block, log_stats=True)


MODELS = {
    "rswa": lambda: [_spec("FullAttentionSpec"), _spec("RSWASpec", rswa_window=8)],
    "circular_buffer": lambda: [_spec("FullAttentionSpec"),
                                _spec("CircularBufferSpec", block_size=8)],
    "sparse_mla": lambda: [
        _spec("MLAAttentionSpec"),
        _spec("MLAAttentionSpec", head_size=4, cache_role=_role("indexer")),
        _spec("SlidingWindowMLASpec", sliding_window=40)],
}


def _role(name):
    from vllm.v1.kv_cache_interface import SparseCacheRole

    return SparseCacheRole(name)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_header_states_the_groups_vllm_built(model, model_dir):
    from harness.capture.header import cache_config_of

    config = cache_config_of(_scheduler(MODELS[model](), model_dir))
    got = [(g.kind, g.block_size, g.rswa_window, g.sliding_window, g.cache_role)
           for g in config.groups]
    assert got == {
        "rswa": [("full_attention", 16, None, None, "sparse"), ("rswa", 16, 8, None, "sparse")],
        "circular_buffer": [("full_attention", 16, None, None, "sparse"),
                            ("circular_buffer", 8, None, None, "sparse")],
        "sparse_mla": [("mla_attention", 16, None, None, "sparse"),
                       ("mla_attention", 16, None, None, "indexer"),
                       ("sliding_window_mla", 16, None, 40, "sparse")],
    }[model]


def test_a_replayed_window_of_bounded_replay_is_a_gap():
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from harness.capture.header import group_config_of

    group = KVCacheGroupSpec(["w"], _spec("SlidingWindowMLASpec", sliding_window=40,
                                          bounded_replay=True))
    with pytest.raises(CaptureGap, match="bounded_replay"):
        group_config_of(group)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_scheduler_traffic_records_and_replays_conformant(tmp_path, model, model_dir):
    """Requests through vLLM's Scheduler, its manager recorded; the trace
    replays on impl and vLLM with every answer equal to the recorded one."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from harness.capture.fake_model import FakeModel
    from harness.capture.header import header_of
    from harness.capture.recorder import Recorder, instrument
    from harness.capture.sinks import JsonlSink
    from harness.trace import open_trace

    scheduler = _scheduler(MODELS[model](), model_dir)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(scheduler.hash_block_size, sha256)
    out = str(tmp_path / f"{model}.jsonl")
    header = header_of(scheduler, "scheduler", f"a {model} model through vLLM's Scheduler")
    sink = JsonlSink(out, header)
    recorder = Recorder(sink, header.cache.hash_block_size)
    instrument(scheduler.kv_cache_manager, recorder)
    fake = FakeModel(16, seed=3)
    shared = [i % 13 for i in range(60)]
    for i in range(5):
        scheduler.add_request(Request(
            request_id=f"r{i}", prompt_token_ids=shared[: 20 + 9 * i] + [14 + i % 2],
            sampling_params=SamplingParams(max_tokens=60, ignore_eos=True),
            pooling_params=None, block_hasher=hasher))
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    nulls = 0  # table entries vLLM gave back (the R-SWA gap), seen along the way
    for _ in range(200):
        if not scheduler.get_num_unfinished_requests():
            break
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake.execute(scheduler, output))
        nulls = max(nulls, sum(b.is_null for m in managers for t in m.req_to_blocks.values()
                               for b in t))
    if model != "circular_buffer":
        assert nulls, "the traffic never reached a window: nothing was given back"
    recorder.final_checkpoint()
    sink.close()
    scheduler.shutdown()
    events = [rec.event.kind for rec in open_trace(out).records]
    assert events.count("allocate") > 30 and "free" in events
    outcome = check_trace(out, ["vllm", "impl"])
    assert outcome.exit_code == 0, outcome.divergence and format_failure(outcome.divergence)
