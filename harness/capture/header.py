"""The trace header of a live vLLM scheduler: its KV cache config as a trace states it."""

from __future__ import annotations

import dataclasses
import os

from harness.capture.errors import CaptureGap
from harness.core import kinds
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.trace.codec import ModelShape, TraceHeader

# HiSparse roles of full-attention groups -> (the trace's role, the manager).
# The source group's blocks are host blocks (host_resident).
_ROLES = {
    "HISPARSE_SOURCE": ("hisparse_source", "HiSparseSourceManager"),
    "HISPARSE_INDEXER": ("hisparse_indexer", "FullAttentionManager"),
}
# Spec fields a manager reads that a trace's group cannot state: the capture
# is refused unless they hold their default.
_MUST_BE_DEFAULT = ("extra_retained_tokens", "bounded_replay")
# MambaSpec fields a trace's Mamba group carries, with their default.
_MAMBA_FIELDS = (("num_speculative_blocks", 0), ("num_prefill_checkpoint_blocks", 0),
                 ("prefill_checkpoint_alignment", None))


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
    # Only kinds with a row can be replayed (its own class: a subclass
    # without a row may be managed otherwise); anything else is a gap.
    row = kinds.row_of_vllm_spec(spec, exact=True)
    if row is None:
        raise CaptureGap(f"KV cache group of {name}: traces carry only "
                         f"{', '.join(r.vllm_spec for r in kinds.rows())} groups")
    kind, manager_name = row.name, row.vllm_manager
    role_name = getattr(getattr(group, "role", None), "name", "DEFAULT")
    role = None
    if role_name != "DEFAULT":
        if role_name not in _ROLES or kind != "full_attention":
            raise CaptureGap(f"{name} group with role {role_name}: traces cannot say so")
        role, manager_name = _ROLES[role_name]
    if getattr(group, "host_resident", False) != (role == "hisparse_source"):
        raise CaptureGap(f"KV cache group with host_resident={group.host_resident!r} and "
                         f"role {role_name}: traces state host blocks for the HiSparse "
                         "source group only")
    for attr in _MUST_BE_DEFAULT:
        if not hasattr(spec, attr):
            continue
        default = _default_of(spec, attr)
        if default is not dataclasses.MISSING and getattr(spec, attr) != default:
            raise CaptureGap(f"{name}.{attr}={getattr(spec, attr)!r}: traces cannot say so")
    if manager is not None and type(manager).__name__ != manager_name:
        raise CaptureGap(f"vLLM manages a {name} group with {type(manager).__name__}, "
                         f"not {manager_name}: a replay could not reproduce it")
    kwargs = {f: getattr(spec, f) for f in row.fields}
    cache_role = getattr(getattr(spec, "cache_role", None), "value", "sparse")
    if kind == "mla_attention" and cache_role != "sparse":
        kwargs["cache_role"] = cache_role
    if kind == "mamba":
        mode = getattr(spec, "mamba_cache_mode", None)
        if mode not in ("none", "align"):
            raise CaptureGap(f"Mamba group with mamba_cache_mode={mode!r}: traces carry "
                             "'none' and 'align' only")
        kwargs["mamba_cache_mode"] = mode
        for attr, default in _MAMBA_FIELDS:
            kwargs[attr] = getattr(spec, attr, default)
    if role is not None:
        kwargs["role"] = role
    # A drafter's group, and attention kept whole on every DCP rank.
    if getattr(group, "is_eagle_group", False):
        kwargs["is_eagle_group"] = True
    if row.sharded and not getattr(spec, "dcp_sharded", True):
        kwargs["dcp_sharded"] = False
    return GroupConfig.make(spec.block_size, kind, **kwargs)


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
    cache = scheduler.cache_config
    extra = {}
    hash_seed = os.environ.get("PYTHONHASHSEED")
    if hash_seed is None and cache.enable_prefix_caching:
        # Unseeded, vLLM may have drawn NONE_HASH at random (per process): the
        # trace carries the one it drew, or no replay could reproduce a hash.
        # It is set when the engine core starts, after the scheduler: the
        # plugin builds the header it writes at the first recorded call.
        from vllm.v1.core import kv_cache_utils

        drawn = getattr(kv_cache_utils, "NONE_HASH", None)
        if drawn is not None:
            extra["none_hash"] = bytes(drawn).hex()
    retention = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if retention is not None and any(kinds.kind_row(g.kind).retaining for g in groups):
        # Sliding-window and Mamba groups then cache only the blocks that end
        # a retention segment, each prompt's replay boundaries and
        # shared-prefix junctions (vLLM's engines default to 0). Other kinds
        # ignore it: their headers stay as they were.
        extra["prefix_cache_retention_interval"] = int(retention)
    if getattr(cache, "enable_mamba_shared_prefix_checkpoint", False):
        extra["enable_mamba_shared_prefix_checkpoint"] = True
    host_blocks = getattr(kv_cache_config, "hisparse_host_num_blocks", None)
    if host_blocks is not None:
        extra["hisparse_host_num_blocks"] = int(host_blocks)
    dcp = int(getattr(scheduler, "dcp_world_size", 1) or 1)
    if dcp != 1:
        extra["dcp_world_size"] = dcp
    if any(kinds.kind_row(g.kind).in_flight_cap for g in groups):
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
        hash_seed=hash_seed,
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
