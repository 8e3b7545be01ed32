"""Scheduler-driven capture: vLLM's real Scheduler, a workload preset, no model.

The Scheduler is built the way vLLM's own scheduler tests build it (configs
from a local tiny model folder, a KV cache config with the preset's pool),
its KVCacheManager is instrumented, and the loop an engine core runs is run
here: arrivals, aborts and prefix-cache resets from the preset, `schedule()`,
a fake model's sampled tokens, `update_from_output()`. Every call the
scheduler makes on the KV cache manager lands in the trace with vLLM's answer.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from harness.capture.errors import CaptureGap, PresetError
from harness.capture.fake_model import FakeModel
from harness.capture.header import header_of
from harness.capture.presets import Preset
from harness.capture.recorder import Recorder, instrument
from harness.capture.sinks import JsonlSink
from harness.capture.synth import NewRequest, SyntheticWorkload
from harness.capture.tiny_model import TinyModel
from harness.core.progress import Progress


@dataclass(slots=True)
class CaptureResult:
    path: str
    num_events: int
    num_steps: int
    num_requests: int


@contextmanager
def hash_seed_env(seed: str | None):
    """vLLM seeds NONE_HASH (and a trace header records the seed) from
    PYTHONHASHSEED; set it for the capture only."""
    old = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = old


def _has_field(cls, name: str) -> bool:
    return name in getattr(cls, "__dataclass_fields__", {})


def build_scheduler(preset: Preset, model_dir: str, publish: dict | None = None):
    """A real vLLM Scheduler over a pool of `preset.engine.num_blocks` blocks."""
    import inspect

    import torch
    from vllm.config import (
        CacheConfig,
        KVEventsConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    e = preset.engine
    try:
        model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                   max_model_len=e.max_model_len, dtype="float32",
                                   seed=preset.seed)
        sched_kwargs = dict(
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            max_model_len=e.max_model_len,
            enable_chunked_prefill=e.enable_chunked_prefill,
            long_prefill_token_threshold=e.long_prefill_token_threshold,
            is_encoder_decoder=False,
        )
        if _has_field(SchedulerConfig, "watermark"):
            sched_kwargs["watermark"] = e.watermark
        elif e.watermark:
            raise PresetError(preset.path, preset.engine_line, "engine.watermark",
                              "this vLLM has no admission watermark")
        scheduler_config = SchedulerConfig(**sched_kwargs)
        cache_config = CacheConfig(block_size=e.block_size,
                                   enable_prefix_caching=e.enable_prefix_caching,
                                   prefix_caching_hash_algo=e.hash_algo)
        # `publish`: ZMQ publisher settings (endpoint, replay_endpoint, ...) to
        # publish the KV events as a server would; else they are only recorded.
        events = KVEventsConfig(enable_kv_cache_events=e.kv_events,
                                publisher="zmq" if publish else "null", **(publish or {}))
        vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                                 cache_config=cache_config, kv_events_config=events)
    except (ValueError, TypeError) as e_:
        # vLLM's own config validation (pydantic) rejects the combination.
        message = " ".join(str(e_).split())
        if "Value error, " in message:
            message = message.split("Value error, ", 1)[1].split(" [type=", 1)[0]
        raise PresetError(preset.path, preset.engine_line, "engine", message[:300]) from None
    spec = FullAttentionSpec(block_size=e.block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=e.num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cache_config.num_gpu_blocks = e.num_blocks
    try:
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    except ImportError:  # vLLM 0.17 maps specs to managers statically
        pass
    else:
        register_all_kvcache_specs(vllm_config)
    kwargs = dict(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                  structured_output_manager=StructuredOutputManager(vllm_config),
                  block_size=e.block_size, log_stats=e.log_stats)
    if "hash_block_size" in inspect.signature(Scheduler.__init__).parameters:
        kwargs["hash_block_size"] = e.block_size
    return Scheduler(**kwargs)


class _Requests:
    """Builds vLLM Requests the way the engine core does (hashed at creation)."""

    def __init__(self, preset: Preset) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(preset.engine.hash_algo)
        init_none_hash(hash_fn)
        self.hasher = (get_request_block_hasher(preset.engine.block_size, hash_fn)
                       if preset.engine.enable_prefix_caching else None)

    def make(self, r: NewRequest):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        kwargs = {}
        if r.lora is not None:
            from vllm.lora.request import LoRARequest

            kwargs["lora_request"] = LoRARequest(r.lora[0], r.lora[1], f"/loras/{r.lora[0]}")
        if r.cache_salt is not None:
            kwargs["cache_salt"] = r.cache_salt
        params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
        return Request(request_id=r.req_id, prompt_token_ids=list(r.prompt),
                       sampling_params=params, pooling_params=None,
                       block_hasher=self.hasher, **kwargs)


def capture_preset(preset: Preset, out: str, progress: bool = True,
                   free_queue_checkpoints: bool = True,
                   publish: dict | None = None,
                   before_shutdown: Callable[[], None] | None = None) -> CaptureResult:
    """Run `preset` through vLLM's Scheduler and write the trace to `out`.

    `before_shutdown` runs once the traffic is done, while the scheduler (and
    its KV event publisher, with `publish`) still lives."""
    import logging

    from vllm.v1.request import RequestStatus

    # vLLM logs each refused prefix-cache reset; the trace records them.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    # The model folder is read once, while the scheduler's config is built.
    with tempfile.TemporaryDirectory(prefix="kvconform-tiny-") as model_dir, \
            hash_seed_env(preset.engine.hash_seed):
        TinyModel(vocab_size=max(preset.requests.vocab, 16)).write(model_dir)
        scheduler = build_scheduler(preset, model_dir, publish)
        requests = _Requests(preset)
        description = f"workload preset '{preset.name}' ({preset.kind})"
        if preset.description:
            description += f": {preset.description.strip()}"
        header = header_of(scheduler, "scheduler", description)
    writer = JsonlSink(out, header)
    recorder = Recorder(writer, header.cache.hash_block_size,
                        free_queue_checkpoints=free_queue_checkpoints,
                        report_shared_prefix_boundary=header.cache.reports_shared_prefix_boundary)
    instrument(scheduler.kv_cache_manager, recorder)
    workload = SyntheticWorkload(preset)
    model = FakeModel(preset.requests.vocab, preset.seed)
    admin_rng = random.Random(preset.seed ^ 0xAB0)
    resets = {r.step: r for r in preset.resets}
    live: dict[str, object] = {}
    bar = Progress(preset.requests.count, f"capture {preset.name}", enabled=progress)
    step = 0
    try:
        while (not workload.exhausted or live) and step < preset.max_steps:
            for new in workload.arrivals():
                request = requests.make(new)
                live[new.req_id] = request
                scheduler.add_request(request)
            if live and admin_rng.random() < preset.requests.abort_probability:
                victim = admin_rng.choice(sorted(live))
                scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            if step in resets:
                scheduler.reset_prefix_cache(
                    reset_running_requests=resets[step].reset_running_requests)
            if scheduler.get_num_unfinished_requests() > 0:
                output = scheduler.schedule()
                scheduler.update_from_output(output, model.execute(scheduler, output))
            for rid in [rid for rid, r in live.items() if r.is_finished()]:
                workload.finished(rid, list(live.pop(rid).all_token_ids))
                bar.update()
            step += 1
        recorder.final_checkpoint()
        if before_shutdown is not None:
            before_shutdown()
    except CaptureGap:
        writer.close()  # what was recorded up to the gap is a valid trace
        raise
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        scheduler.shutdown()
    writer.close()
    return CaptureResult(out, writer.num_events, recorder.num_steps, workload.num_issued)
