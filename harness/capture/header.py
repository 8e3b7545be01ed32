"""The trace header of a live vLLM scheduler: its KV cache config as a trace states it."""

from __future__ import annotations

import os

from harness.cache_config import CacheConfig, GroupConfig
from harness.capture.errors import CaptureGap
from harness.trace.codec import ModelShape, TraceHeader

# vLLM KV cache spec class -> the trace's attention kind. Only the kinds impl
# implements can be replayed; anything else is a gap, not a guess.
_KINDS = {"FullAttentionSpec": "full_attention"}


def cache_config_of(scheduler) -> CacheConfig:
    """What the scheduler built its KVCacheManager with."""
    import vllm.envs as envs

    kv_cache_config = scheduler.kv_cache_config
    groups = []
    for g in kv_cache_config.kv_cache_groups:
        name = type(g.kv_cache_spec).__name__
        if name not in _KINDS:
            raise CaptureGap(f"KV cache group of {name}: traces carry only "
                             f"{', '.join(_KINDS)} groups for now")
        groups.append(GroupConfig(g.kv_cache_spec.block_size, _KINDS[name]))
    cache = scheduler.cache_config
    config = CacheConfig(
        num_blocks=kv_cache_config.num_blocks,
        groups=tuple(groups),
        hash_algo=cache.prefix_caching_hash_algo,
        # vLLM seeds NONE_HASH from PYTHONHASHSEED when the engine starts.
        hash_seed=os.environ.get("PYTHONHASHSEED"),
        enable_caching=bool(cache.enable_prefix_caching),
        max_model_len=scheduler.max_model_len,
        log_stats=bool(scheduler.log_stats),
        enable_kv_cache_events=bool(scheduler.enable_kv_cache_events),
        events_use_int_hashes=bool(getattr(envs, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", True)),
        watermark=float(getattr(scheduler.scheduler_config, "watermark", 0.0) or 0.0),
    )
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
