"""impl's side of the sizing differential: a model shape's KV cache configs
as impl plans them (impl/kv_cache_planning.py, impl/kv_cache_sizing.py),
answered in the plain form of harness/backends/sizing_answer.py.

Also where a worker's memory "in blocks" becomes bytes: the bytes one block
takes in impl's pool for the worker's layers (both sides are then given
the same bytes, so a pool impl sizes wrongly still shows as a difference in
num_blocks or in the fitted length).
"""

from __future__ import annotations

from harness.backends.sizing_answer import SPEC_FIELDS, capacity, in_flight_tokens, plain, refusal
from harness.core import kinds
from harness.core.sizing_shape import DTYPE_SIZES, LayerShape, SizingShape
from impl import kv_cache_planning as iplan
from impl import kv_cache_sizing as isizing
from impl.profiles import VersionProfile


def impl_spec(layer: LayerShape, shape: SizingShape):
    """impl's spec of one layer (kinds.SpecFieldMissing: a value its class lacks)."""
    row = kinds.kind_row(layer.kind)
    required = {"block_size": layer.block_size, **dict(layer.values)}
    if layer.kind == "mamba":
        required.setdefault("mamba_cache_mode", shape.mamba_cache_mode)
        required["dtype_sizes"] = tuple(DTYPE_SIZES[d] for d in layer.dtypes)
        required["shapes"] = tuple(tuple(s) for s in required.get("shapes", ()))
        return kinds.build_spec(row.impl_spec, required, {})
    offered = dict(num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
                   dtype_size=DTYPE_SIZES[layer.dtype], dtype_label=f"torch.{layer.dtype}")
    return kinds.build_spec(row.impl_spec, required, offered)


def worker_specs(shape: SizingShape) -> list[dict]:
    specs = {name: impl_spec(layer, shape) for name, layer in shape.layers}
    return [{n: specs[n] for n in w.layers} for w in shape.workers]


def planning_config(shape: SizingShape, profile: VersionProfile) -> iplan.KVCachePlanningConfig:
    return iplan.KVCachePlanningConfig(
        max_model_len=shape.max_model_len, auto_fit_max_model_len=shape.auto_fit,
        num_gpu_blocks_override=shape.num_gpu_blocks_override,
        kv_cache_layout=shape.kv_cache_layout,
        tensor_parallel_size=shape.tensor_parallel_size,
        decode_context_parallel_size=shape.dcp_world_size,
        max_in_flight_tokens=in_flight_tokens(shape),
        max_num_encoder_input_tokens=shape.max_num_encoder_input_tokens,
        num_prefill_lookahead_tokens=shape.num_prefill_lookahead_tokens,
        disable_hybrid_kv_cache_manager=shape.disable_hybrid_kv_cache_manager,
        mamba_cache_mode=shape.mamba_cache_mode,
        pad_pages=profile.unify_pads_pages, pad_ratio=profile.uniform_group_pad_ratio,
        tensor_plan=profile.kv_cache_tensor_plan)


def worker_memory(shape: SizingShape, profile: VersionProfile) -> list[int]:
    """Each worker's memory in bytes. A budget in blocks is counted in impl's
    bytes per block of the worker's share of the groups (where impl cannot
    group the model, the sum of its layers' pages)."""
    if all(w.memory is not None for w in shape.workers):
        return [w.memory for w in shape.workers]
    per_worker = worker_specs(shape)
    cfg = planning_config(shape, profile)
    try:
        merged = {n: s for specs in per_worker for n, s in specs.items()}
        groups = cfg.groups(dict(merged))
        block = [cfg.block_bytes(iplan.project_kv_cache_groups_to_worker(groups, specs))
                 for specs in per_worker]
    except Exception:  # noqa: BLE001 - impl's refusal is its answer, not the input's
        block = [sum(s.page_size_bytes for s in specs.values()) for specs in per_worker]
    return [w.memory if w.memory is not None else w.memory_blocks * b + w.memory_extra
            for w, b in zip(shape.workers, block)]


def spec_answer(spec) -> dict:
    if isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        return {"kind": "UniformTypeKVCacheSpecs", "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "layers": {n: spec_answer(s) for n, s in spec.kv_cache_specs.items()}}
    out = {"kind": type(spec).__name__, "block_size": spec.block_size,
           "page_size_bytes": spec.page_size_bytes}
    for name in SPEC_FIELDS:
        if name == "head_size_v" and hasattr(spec, "v_head_size"):
            out[name] = spec.v_head_size  # impl writes "as K's" as None
        elif hasattr(spec, name):
            out[name] = plain(getattr(spec, name))
    return out


def _worker_answer(plan) -> dict:
    return {
        "num_blocks": plan.num_blocks, "kv_tp_replicas": plan.kv_tp_replicas,
        "groups": [{"layers": list(g.layer_names), "spec": spec_answer(g.kv_cache_spec)}
                   for g in plan.kv_cache_groups],
        "tensors": [{"size": t.size, "layers": list(t.layers), "layer_stride": t.layer_stride,
                     "block_stride": t.block_stride, "offset": t.offset}
                    for t in plan.kv_cache_tensors],
    }


def impl_sizing(shape: SizingShape, profile: VersionProfile,
                memory: list[int] | None = None) -> dict:
    """impl's answer for the shape (memory: each worker's bytes, default
    worker_memory's)."""
    memory = worker_memory(shape, profile) if memory is None else memory
    cfg = planning_config(shape, profile)
    answer: dict = {}
    stage = "configs"
    try:
        plans, max_model_len = iplan.get_kv_cache_configs(worker_specs(shape), memory, cfg)
        answer["max_model_len"] = max_model_len
        answer["workers"] = [_worker_answer(p) for p in plans]
        stage = "scheduler"
        scheduler = iplan.generate_scheduler_kv_cache_config(plans)
        groups = scheduler.kv_cache_groups
        answer["scheduler"] = {"num_blocks": scheduler.num_blocks,
                               "groups": [spec_answer(g.kv_cache_spec) for g in groups]}
        stage = "block_sizes"
        answer["scheduler"]["block_sizes"] = list(isizing.resolve_kv_cache_block_sizes(
            [g.kv_cache_spec for g in groups], shape.enable_caching, shape.dcp_world_size,
            shape.prefix_match_unit, rule=profile.block_sizes_rule))
        stage = "capacity"
        if groups:
            answer["scheduler"]["capacity"] = capacity(*isizing.get_kv_cache_capacity(
                groups, scheduler.num_blocks, max_model_len,
                dcp_world_size=shape.dcp_world_size,
                max_in_flight_tokens=in_flight_tokens(shape),
                max_num_encoder_input_tokens=shape.max_num_encoder_input_tokens,
                mamba_cache_mode=shape.mamba_cache_mode))
    except Exception as e:  # noqa: BLE001 - a refusal is an answer, compared as one
        answer["refused"] = refusal(stage, e)
    return answer
