"""The trace header of a live vLLM scheduler: its KV cache config as a trace states it."""

from __future__ import annotations

import dataclasses
import os

from harness.cache_config import CacheConfig, GroupConfig
from harness.capture.errors import CaptureGap
from harness.trace.codec import ModelShape, TraceHeader

# vLLM KV cache spec class -> (the trace's attention kind, the manager vLLM must
# have built for it, the spec field the group carries). Only kinds impl
# implements can be replayed; anything else is a gap, not a guess.
_KINDS = {
    "FullAttentionSpec": ("full_attention", "FullAttentionManager", None),
    "MLAAttentionSpec": ("mla_attention", "FullAttentionManager", None),
    "SinkFullAttentionSpec": ("sink_full_attention", "SinkFullAttentionManager", "sink_len"),
    "SlidingWindowSpec": ("sliding_window", "SlidingWindowManager", "sliding_window"),
    "ChunkedLocalAttentionSpec": ("chunked_local_attention", "ChunkedLocalAttentionManager",
                                  "attention_chunk_size"),
    "CrossAttentionSpec": ("cross_attention", "CrossAttentionManager", None),
    "MambaSpec": ("mamba", "MambaManager", None),
}
# Spec fields a manager reads that a trace's group cannot state: the capture
# is refused unless they hold their default.
_MUST_BE_DEFAULT = ("extra_retained_tokens", "num_speculative_blocks",
                    "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment")
# Kinds whose admission cap depends on the tokens in flight.
_RECYCLING = ("sliding_window", "chunked_local_attention")
# Kinds whose cached blocks follow vLLM's prefix_cache_retention_interval.
_RETAINING = ("sliding_window", "mamba")


def _default_of(spec, name: str):
    for f in dataclasses.fields(spec):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


def group_config_of(group, manager=None) -> GroupConfig:
    """One of vLLM's KVCacheGroupSpec as a trace's group (CaptureGap when the
    trace could not state it). `manager`: the single-type manager vLLM built
    for it, checked to be the one a replay builds."""
    spec = group.kv_cache_spec
    name = type(spec).__name__
    if name not in _KINDS:
        raise CaptureGap(f"KV cache group of {name}: traces carry only "
                         f"{', '.join(_KINDS)} groups")
    kind, manager_name, field = _KINDS[name]
    if getattr(group, "host_resident", False):
        raise CaptureGap("KV cache group with host_resident=True: traces cannot say so")
    role = getattr(group, "role", None)
    if role is not None and getattr(role, "name", "DEFAULT") != "DEFAULT":
        raise CaptureGap(f"KV cache group with role {role}: traces cannot say so")
    for attr in _MUST_BE_DEFAULT:
        if not hasattr(spec, attr):
            continue
        default = _default_of(spec, attr)
        if default is not dataclasses.MISSING and getattr(spec, attr) != default:
            raise CaptureGap(f"{name}.{attr}={getattr(spec, attr)!r}: traces cannot say so")
    if manager is not None and type(manager).__name__ != manager_name:
        raise CaptureGap(f"vLLM manages a {name} group with {type(manager).__name__}, "
                         f"not {manager_name}: a replay could not reproduce it")
    kwargs = {}
    if field is not None:
        kwargs[field] = getattr(spec, field)
    if kind == "mamba":
        mode = getattr(spec, "mamba_cache_mode", None)
        if mode not in ("none", "align"):
            raise CaptureGap(f"Mamba group with mamba_cache_mode={mode!r}: traces carry "
                             "'none' and 'align' only")
        kwargs["mamba_cache_mode"] = mode
    # A drafter's group, and attention kept whole on every DCP rank.
    if getattr(group, "is_eagle_group", False):
        kwargs["is_eagle_group"] = True
    if kind != "mamba" and not getattr(spec, "dcp_sharded", True):
        kwargs["dcp_sharded"] = False
    return GroupConfig(spec.block_size, kind, **kwargs)


def cache_config_of(scheduler) -> CacheConfig:
    """What the scheduler built its KVCacheManager with."""
    import vllm.envs as envs

    kv_cache_config = scheduler.kv_cache_config
    coordinator = getattr(getattr(scheduler, "kv_cache_manager", None), "coordinator", None)
    managers = list(getattr(coordinator, "single_type_managers", ()) or ())
    if managers and len(managers) != len(kv_cache_config.kv_cache_groups):
        raise CaptureGap(f"{len(managers)} single-type managers for "
                         f"{len(kv_cache_config.kv_cache_groups)} KV cache groups")
    groups = tuple(group_config_of(g, managers[i] if managers else None)
                   for i, g in enumerate(kv_cache_config.kv_cache_groups))
    retention = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if retention is not None and any(g.kind in _RETAINING for g in groups):
        # 0.32: sliding-window and Mamba groups then cache only the blocks that
        # end a retention segment, the replay boundaries of the prompt and
        # shared-prefix junctions. A trace (and impl) state dense retention
        # (None: a tail at every scheduler-block boundary) only.
        raise CaptureGap(f"prefix_cache_retention_interval={retention} with a "
                         "sliding-window or Mamba group: traces carry dense retention "
                         "only (run vLLM with prefix_cache_retention_interval=None)")
    cache = scheduler.cache_config
    extra = {}
    dcp = int(getattr(scheduler, "dcp_world_size", 1) or 1)
    if dcp != 1:
        extra["dcp_world_size"] = dcp
    if any(g.kind in _RECYCLING for g in groups):
        # The scheduler hands the manager vllm_config.max_in_flight_tokens
        # (one max_num_batched_tokens per concurrent batch); it caps what a
        # sliding-window / chunked-local request is admitted with.
        in_flight = getattr(scheduler.vllm_config, "max_in_flight_tokens", None)
        if in_flight is not None:
            extra["max_in_flight_tokens"] = int(in_flight)
    # Speculative decoding: what the scheduler built its manager with (it
    # passes use_eagle only when the drafter drops blocks).
    if getattr(getattr(scheduler, "kv_cache_manager", None), "use_eagle", False):
        extra["use_eagle"] = True
    lookahead = int(getattr(scheduler, "num_prefill_lookahead", 0) or 0)
    if lookahead:
        extra["num_prefill_lookahead"] = lookahead
    config = CacheConfig(
        num_blocks=kv_cache_config.num_blocks,
        groups=groups,
        hash_algo=cache.prefix_caching_hash_algo,
        # vLLM seeds NONE_HASH from PYTHONHASHSEED when the engine starts.
        hash_seed=os.environ.get("PYTHONHASHSEED"),
        enable_caching=bool(cache.enable_prefix_caching),
        max_model_len=scheduler.max_model_len,
        log_stats=bool(scheduler.log_stats),
        enable_kv_cache_events=bool(scheduler.enable_kv_cache_events),
        events_use_int_hashes=bool(getattr(envs, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", True)),
        watermark=float(getattr(scheduler.scheduler_config, "watermark", 0.0) or 0.0),
        **extra,
    )
    block_size = getattr(scheduler, "block_size", None)
    if block_size is not None and block_size != config.scheduler_block_size:
        raise CaptureGap(f"scheduler block size {block_size} differs from the "
                         f"{config.scheduler_block_size} the trace's groups imply; traces "
                         "cannot say so")
    hash_block_size = getattr(scheduler, "hash_block_size", None)
    if hash_block_size is not None and hash_block_size != config.hash_block_size:
        raise CaptureGap(f"hash block size {hash_block_size} differs from the hash block "
                         f"size {config.hash_block_size} the trace's groups imply; traces "
                         "cannot say so")
    return config


def model_shape_of(vllm_config) -> ModelShape:
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    return ModelShape(
        num_layers=mc.get_num_layers(pc),
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=str(mc.dtype).removeprefix("torch."),
    )


def header_of(scheduler, source: str, description: str | None = None,
              with_model: bool = False, tensors: str | None = None) -> TraceHeader:
    import vllm

    model = model_shape_of(scheduler.vllm_config) if with_model else None
    return TraceHeader(vllm.__version__, source, cache_config_of(scheduler), description,
                       model, tensors)
