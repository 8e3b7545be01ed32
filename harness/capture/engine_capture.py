"""Engine capture: a real vLLM engine on this CPU, a tiny random model, a preset's traffic.

The engine is vLLM's own `LLM` (model runner, CPU attention, scheduler, output
processing), built from a locally written tiny Qwen2 config with seeded
weights that make its attention tensors O(1) (seeded_weights.py) and no
tokenizer (or, with a sliding window, a tiny Llama whose layers
alternate sliding-window and full attention: two KV cache groups); prompts
are token ids. The preset's synthetic traffic is fed through
`LLMEngine.add_request` / `step()` so that turns continue the model's real
answers. The scheduler's KV cache manager is recorded:

- in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): instrumented directly, and
  optionally one layer's attention tensors go to a safetensors sidecar;
- engine core in its own process: the kvconform vLLM plugin records there
  (into a session folder), and the parts are joined into the trace.

vLLM 0.32's CPU attention needs block sizes that are multiples of 32, so the
preset's pool is re-cut into 32-token (or larger) blocks of the same capacity
(for a hybrid model, that capacity for each of its two groups).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from harness.capture.errors import CaptureGap
from harness.capture.presets import Preset
from harness.capture.scheduler_capture import CaptureResult, hash_seed_env
from harness.capture.synth import SyntheticWorkload
from harness.capture.tiny_model import TinyModel
from harness.core.progress import Progress


class EngineEnvironmentError(RuntimeError):
    """The engine cannot be run here as asked (exit code 3)."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    multiprocess: bool = False
    tensors: bool = False
    tensor_layer: int = 0
    tensor_steps: int = 16
    block_size: int = 32
    free_queue_checkpoints: bool = True
    # A hybrid model: sliding-window layers with this window mixed with full
    # attention layers (two KV cache groups); None: full attention only.
    sliding_window: int | None = None
    # vLLM's prefix_cache_retention_interval for the engine; "default": the
    # engine's own (0 in 0.32: sparse sliding-window checkpoints). The
    # header records what the engine ran with.
    prefix_cache_retention_interval: int | None | str = "default"


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def engine_preset(preset: Preset, block_size: int,
                  sliding_window: int | None = None) -> Preset:
    """The preset with its pool re-cut into `block_size`-token blocks.

    With `sliding_window` (a hybrid model: a full-attention and a
    sliding-window group sharing the pool), the pool holds the preset's
    capacity once per group, and max_model_len is capped at what vLLM's
    startup check admits: one request of max_model_len needs
    cdiv(max_model_len, bs) full-attention blocks plus its sliding-window
    admission cap, cdiv(min(window - 1 + in_flight, max_model_len), bs) + 1,
    out of the pool less the null block (in_flight: one max_num_batched_tokens
    per concurrent batch, at most 2 on one CPU worker).
    """
    if block_size % 32:
        raise EngineEnvironmentError(f"block size {block_size}: vLLM's CPU attention needs "
                                     "a multiple of 32")
    e = preset.engine
    capacity = (e.num_blocks - 1) * e.block_size
    usable = math.ceil(capacity / block_size)
    if sliding_window is None:
        num_blocks = usable + 1
        # The engine refuses a max_model_len its pool cannot hold once.
        max_model_len = min(e.max_model_len, usable * block_size)
    else:
        if sliding_window < 1:
            raise EngineEnvironmentError(f"sliding window {sliding_window}: must be >= 1")
        num_blocks = 2 * usable + 1
        in_flight = 2 * e.max_num_batched_tokens
        max_model_len = min(e.max_model_len, usable * block_size)
        while max_model_len > block_size and (
                math.ceil(max_model_len / block_size)
                + math.ceil(min(sliding_window - 1 + in_flight, max_model_len) / block_size)
                + 1 > num_blocks - 1):
            max_model_len -= block_size
    return replace(preset, engine=replace(e, block_size=block_size, num_blocks=num_blocks,
                                          max_model_len=max_model_len))


def _plugin_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("harness.capture.plugin")
               for ep in entry_points(group="vllm.general_plugins"))


def build_llm(preset: Preset, model_dir: str, retention: int | None | str = "default"):
    from vllm import LLM
    from vllm.config import KVEventsConfig

    e = preset.engine
    from harness.capture.seeded_weights import WEIGHTS_FILE

    load_format = "safetensors" if (Path(model_dir) / WEIGHTS_FILE).exists() else "dummy"
    extra = {} if retention == "default" else {"prefix_cache_retention_interval": retention}
    return LLM(
        model=model_dir,
        load_format=load_format,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        seed=preset.seed,
        block_size=e.block_size,
        num_gpu_blocks_override=e.num_blocks,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        enable_chunked_prefill=e.enable_chunked_prefill,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        enable_prefix_caching=e.enable_prefix_caching,
        prefix_caching_hash_algo=e.hash_algo,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=e.kv_events, publisher="null"),
        disable_log_stats=not e.log_stats,
        **extra,
    )


def drive(engine, preset: Preset, progress: bool = True) -> int:
    """Feed the preset's traffic to an LLMEngine step by step; return requests sent."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    if preset.requests.lora.fraction:
        raise CaptureGap("the tiny engine has no LoRA adapters to load; use a preset "
                         "without `requests.lora` (scheduler capture records LoRA)")
    workload = SyntheticWorkload(preset)
    rng = random.Random(preset.seed ^ 0xAB0)
    resets = {r.step: r for r in preset.resets}
    prompts: dict[str, list[int]] = {}
    bar = Progress(preset.requests.count, f"engine {preset.name}", enabled=progress)
    step = 0
    try:
        while (not workload.exhausted or prompts) and step < preset.max_steps:
            for r in workload.arrivals():
                prompt = TokensPrompt(prompt_token_ids=list(r.prompt))
                if r.cache_salt is not None:
                    prompt["cache_salt"] = r.cache_salt
                # Greedy: reproducible answers from the seeded dummy weights
                # (vLLM 0.32's CPU sampler fails on per-request seeds under
                # chunked prefill).
                params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True,
                                        temperature=0.0,
                                        output_kind=RequestOutputKind.FINAL_ONLY)
                engine.add_request(r.req_id, prompt, params)
                prompts[r.req_id] = list(r.prompt)
            if prompts and rng.random() < preset.requests.abort_probability:
                victim = rng.choice(sorted(prompts))
                engine.abort_request([victim])
                workload.finished(victim, prompts.pop(victim))
                bar.update()
            if step in resets:
                engine.reset_prefix_cache(resets[step].reset_running_requests)
            if engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in prompts:
                        tokens = prompts.pop(out.request_id) + list(out.outputs[0].token_ids)
                        workload.finished(out.request_id, tokens)
                        bar.update()
            step += 1
    finally:
        bar.close()
    return workload.num_issued


def capture_engine(preset: Preset, out: str, options: EngineOptions = EngineOptions(),
                   progress: bool = True) -> CaptureResult:
    """Run the preset's traffic through a tiny real engine; write the trace to `out`.
    What it puts in the temp folder (the model, the plugin's session, vLLM's
    engine-core sockets) is removed when it returns or fails."""
    made: list[str] = []
    try:
        return _capture_engine(preset, out, options, progress, made)
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _capture_engine(preset: Preset, out: str, options: EngineOptions, progress: bool,
                    made: list[str]) -> CaptureResult:
    import logging

    preset = engine_preset(preset, options.block_size, options.sliding_window)
    if options.tensors and options.multiprocess:
        raise EngineEnvironmentError("attention tensors need the engine core in this "
                                     "process (leave out --multiprocess)")
    if options.multiprocess and not _plugin_registered():
        raise EngineEnvironmentError(
            "the kvconform vLLM plugin is not registered (pip install -e . registers the "
            "vllm.general_plugins entry point); the engine core process records through it")
    model = _tiny_model(preset, options)
    model_dir = model.write(weights_seed=preset.seed)
    session_root = tempfile.mkdtemp(prefix="kvconform-engine-")
    rpc_dir = tempfile.mkdtemp(prefix="kvconform-rpc-")
    made += [model_dir, session_root, rpc_dir]
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if options.multiprocess else "0",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "HF_HUB_OFFLINE": "1",
        # The engine core's IPC sockets, otherwise left in the temp folder.
        "VLLM_RPC_BASE_PATH": rpc_dir,
    }
    if options.multiprocess:
        from harness.capture import plugin

        env.update({plugin.ENV_DIR: session_root, plugin.ENV_SOURCE: "engine",
                    plugin.ENV_FREE_QUEUE: "1" if options.free_queue_checkpoints else "0",
                    plugin.ENV_DESCRIPTION: _description(preset, model) + ", engine core in "
                    "its own process, recorded by the kvconform plugin"})
    logging.getLogger("vllm").setLevel(logging.ERROR)
    with ExitStack() as stack:
        stack.enter_context(_env(**env))
        stack.enter_context(hash_seed_env(preset.engine.hash_seed))
        llm = build_llm(preset, model_dir, options.prefix_cache_retention_interval)
        try:
            if options.multiprocess:
                num_requests = drive(llm.llm_engine, preset, progress)
                recorder = None
            else:
                recorder, writer, tensors = _record_in_process(llm, preset, model, out,
                                                               options)
                try:
                    num_requests = drive(llm.llm_engine, preset, progress)
                    recorder.final_checkpoint()
                except CaptureGap:
                    writer.close()
                    raise
                except BaseException:
                    writer.abort()
                    raise
                finally:
                    if tensors is not None:
                        tensors.uninstall()
                writer.close()
                if tensors is not None:
                    from harness.capture.header import model_shape_of
                    from harness.capture.seeded_weights import describe

                    shape = asdict(model_shape_of(llm.llm_engine.vllm_config))
                    shape["weights"] = describe(preset.seed)
                    tensors.save(str(Path(out).parent / _sidecar_name(out)), shape)
        finally:
            llm.llm_engine.engine_core.shutdown()
    if recorder is not None:
        return CaptureResult(out, writer.num_events, recorder.num_steps, num_requests)
    from harness.capture.join import join
    from harness.capture.segments import sessions

    found = sessions(session_root)
    if len(found) != 1:
        raise EngineEnvironmentError(f"expected one capture session under {session_root}, "
                                     f"found {len(found)} (did the plugin load in the engine "
                                     "core process?)")
    n = join(found[0], out, include_partial=True).num_events
    return CaptureResult(out, n, -1, num_requests)


def _tiny_model(preset: Preset, options: EngineOptions) -> TinyModel:
    vocab = max(preset.requests.vocab, 16)
    if options.sliding_window is None:
        return TinyModel(vocab_size=vocab)
    return TinyModel.hybrid(options.sliding_window, vocab_size=vocab)


def _description(preset: Preset, model: TinyModel) -> str:
    from harness.capture.seeded_weights import describe

    return (f"tiny vLLM engine on CPU ({model.describe()}, {describe(preset.seed)}, "
            f"{preset.engine.num_blocks} "
            f"blocks of {preset.engine.block_size}), traffic of workload preset '{preset.name}' "
            f"({preset.kind})")


def _sidecar_name(out: str) -> str:
    name = Path(out).name
    for suffix in (".jsonl", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return f"{name}.safetensors"


def _record_in_process(llm, preset: Preset, model: TinyModel, out: str,
                       options: EngineOptions):
    from harness.capture.attention_tensors import AttentionTensorCapture
    from harness.capture.header import header_of
    from harness.capture.recorder import Recorder, instrument
    from harness.capture.sinks import JsonlSink

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    tensors = None
    if options.tensors:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
            .model_runner
        tensors = AttentionTensorCapture(
            options.tensor_layer, options.tensor_steps,
            req_ids=lambda: list(runner.input_batch.req_ids))
        tensors.install()
    header = header_of(scheduler, "engine", _description(preset, model), with_model=True,
                       tensors=_sidecar_name(out) if tensors is not None else None)
    writer = JsonlSink(out, header)
    recorder = Recorder(writer, header.cache.hash_block_size,
                        free_queue_checkpoints=options.free_queue_checkpoints,
                        step_callback=tensors.on_step if tensors is not None else None,
                        report_shared_prefix_boundary=header.cache.reports_shared_prefix_boundary)
    instrument(scheduler.kv_cache_manager, recorder)
    return recorder, writer, tensors
