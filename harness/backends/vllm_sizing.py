"""vLLM's side of the sizing differential: a model shape's KV cache configs
as the installed vLLM plans them (get_kv_cache_configs and the scheduler's
config, block sizes and capacity), in the plain form of
harness/backends/sizing_answer.py.

vLLM's functions read a VllmConfig; they get a stand-in holding the fields
sizing reads (every other field of a real VllmConfig is engine start-up, not
sizing). Where a release keeps its sizing functions, and whether it groups
the whole model before planning the workers (0.33's get_global_kv_cache_groups),
is the API table's (harness/backends/vllm_api.py).
"""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

from harness.backends.sizing_answer import (
    REFUSALS,
    SPEC_FIELDS,
    capacity,
    in_flight_tokens,
    plain,
    refusal,
)
from harness.backends.vllm_api import VllmApi
from harness.core import kinds
from harness.core.sizing_shape import LayerShape, SizingShape
from impl.profiles import BlockSizesRule

# Cache dtypes by name, as torch names them.
_TORCH_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
# Spec values given as vLLM's enums.
_ENUMS = {"kv_quant_mode": "KVQuantMode", "cache_role": "SparseCacheRole"}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, name))


def vllm_spec(layer: LayerShape, shape: SizingShape):
    """vLLM's spec of one layer, from the kinds table's class for its kind."""
    from vllm.v1 import kv_cache_interface as kvi

    row = kinds.kind_row(layer.kind)
    cls = kinds.vllm_class(row)
    if cls is None:
        raise NotImplementedError(f"this vLLM has no {row.vllm_spec}")
    required = {"block_size": layer.block_size}
    for name, value in layer.values:
        required[name] = getattr(kvi, _ENUMS[name])(value) if name in _ENUMS else value
    if layer.kind == "mamba":
        required.setdefault("mamba_cache_mode", shape.mamba_cache_mode)
        required["shapes"] = tuple(tuple(s) for s in required.get("shapes", ()))
        required["dtypes"] = tuple(_torch_dtype(d) for d in layer.dtypes)
        return kinds.build_spec(cls, required, {})
    offered = dict(num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
                   dtype=_torch_dtype(layer.dtype))
    return kinds.build_spec(cls, required, offered)


def _layout(name: str):
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:  # releases before layouts: nothing to resolve
        return None
    return KVCacheLayout[name]


def engine_block_size(shape: SizingShape) -> int:
    """The engine's block size (cache_config.block_size, which vLLM's block
    sizes read for a model of one group): the one its attention layers were
    built with (Mamba layers may take another), else the first layer's."""
    sizes = [layer.block_size for _, layer in shape.layers if layer.kind != "mamba"]
    sizes = sizes or [layer.block_size for _, layer in shape.layers]
    return sizes[0] if sizes else 16


def vllm_config(shape: SizingShape) -> SimpleNamespace:
    """The VllmConfig fields vLLM's sizing reads, for the shape."""
    layout = _layout(shape.kv_cache_layout)
    cache = SimpleNamespace(
        get_resolved_kv_cache_layout=lambda: layout,
        num_gpu_blocks_override=shape.num_gpu_blocks_override,
        prefix_cache_retention_interval=None, mamba_cache_mode=shape.mamba_cache_mode,
        enable_prefix_caching=shape.enable_caching, prefix_match_unit=shape.prefix_match_unit,
        block_size=engine_block_size(shape),
        kv_cache_size_tokens=None, kv_cache_max_concurrency=None)
    return SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=shape.max_model_len,
            original_max_model_len=-1 if shape.auto_fit else shape.max_model_len,
            supports_kv_cache_grouping=False),
        cache_config=cache,
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=shape.disable_hybrid_kv_cache_manager,
            max_num_encoder_input_tokens=shape.max_num_encoder_input_tokens,
            # What 0.17-0.19's windows and chunks cap a request by.
            max_num_batched_tokens=in_flight_tokens(shape)),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=shape.tensor_parallel_size,
            decode_context_parallel_size=shape.dcp_world_size,
            prefill_context_parallel_size=1, pipeline_parallel_size=len(shape.workers)),
        attention_config=SimpleNamespace(hisparse_config=None),
        device_config=SimpleNamespace(device_type="cpu"),
        speculative_config=None, kv_transfer_config=None,
        num_prefill_lookahead_tokens=shape.num_prefill_lookahead_tokens,
        max_in_flight_tokens=in_flight_tokens(shape),
    )


def spec_answer(spec) -> dict:
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        return {"kind": name, "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "layers": {n: spec_answer(s) for n, s in spec.kv_cache_specs.items()}}
    out = {"kind": name, "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes}
    for field in SPEC_FIELDS:
        if field == "dtype_size" and hasattr(spec, "dtype"):
            out[field] = spec.dtype.itemsize
        elif field == "dtype_sizes" and hasattr(spec, "dtypes"):
            out[field] = [d.itemsize for d in spec.dtypes]
        elif hasattr(spec, field):
            out[field] = plain(getattr(spec, field))
    return out


def _tensor_answer(t) -> dict:
    # 0.17-0.23 name a tensor's layers shared_by and have no strides.
    layers = getattr(t, "layers", None)
    return {"size": t.size, "layers": list(layers if layers is not None else t.shared_by),
            "layer_stride": getattr(t, "layer_stride", 0),
            "block_stride": getattr(t, "block_stride", 0), "offset": getattr(t, "offset", 0)}


def _worker_answer(config) -> dict:
    return {
        "num_blocks": config.num_blocks, "kv_tp_replicas": getattr(config, "kv_tp_replicas", 1),
        "groups": [{"layers": list(g.layer_names), "spec": spec_answer(g.kv_cache_spec)}
                   for g in config.kv_cache_groups],
        "tensors": [_tensor_answer(t) for t in config.kv_cache_tensors],
    }


def _quiet() -> None:
    # vLLM logs each override and capacity at info; the gate reports them.
    logger = logging.getLogger("vllm")
    if logger.level < logging.ERROR:
        logger.setLevel(logging.ERROR)


def resolves_block_sizes(api: VllmApi) -> bool:
    """Whether the release has resolve_kv_cache_block_sizes (0.20+; before,
    the engine took its cache block size as it was)."""
    return api.block_sizes_rule is not BlockSizesRule.CACHE_BLOCK_SIZE


def plan_configs(api: VllmApi, config, specs: list[dict], memory: list[int]):
    """vLLM's per-worker KV cache configs, called as the release calls them."""
    sizing = importlib.import_module(api.sizing_module)
    if api.sizing_groups_model_first:
        groups = sizing.get_global_kv_cache_groups(config, specs)
        return sizing.get_kv_cache_configs(config, specs, memory, groups)
    return sizing.get_kv_cache_configs(config, specs, memory)


def vllm_sizing(shape: SizingShape, api: VllmApi, memory: list[int]) -> dict:
    """vLLM's answer for the shape, each worker given `memory[i]` bytes."""
    from vllm.v1.core import kv_cache_utils as ku

    _quiet()
    config = vllm_config(shape)
    answer: dict = {}
    stage = "configs"
    try:
        specs = {name: vllm_spec(layer, shape) for name, layer in shape.layers}
        per_worker = [{n: specs[n] for n in w.layers} for w in shape.workers]
        configs = plan_configs(api, config, per_worker, list(memory))
        answer["max_model_len"] = config.model_config.max_model_len
        answer["workers"] = [_worker_answer(c) for c in configs]
        stage = "scheduler"
        scheduler = ku.generate_scheduler_kv_cache_config(configs)
        answer["scheduler"] = {"num_blocks": scheduler.num_blocks,
                               "groups": [spec_answer(g.kv_cache_spec)
                                          for g in scheduler.kv_cache_groups]}
        stage = "block_sizes"
        if resolves_block_sizes(api):
            answer["scheduler"]["block_sizes"] = list(ku.resolve_kv_cache_block_sizes(
                scheduler, config))
        stage = "capacity"
        if scheduler.kv_cache_groups:
            answer["scheduler"]["capacity"] = capacity(*ku.get_kv_cache_capacity(config,
                                                                                 scheduler))
    except kinds.SpecFieldMissing as e:  # the shape asks for a field this release lacks
        answer["lacks"] = {"at": stage, "error": "no such spec field", "message": str(e)}
    except REFUSALS as e:  # a refusal is an answer, compared as one
        answer["refused"] = refusal(stage, e)
    except AttributeError:
        raise  # the stand-in config lacks a field this release reads: the harness's
    except Exception as e:  # noqa: BLE001 - vLLM's own crash on a shape it should plan
        answer["crashed"] = {"at": stage, "error": type(e).__name__,
                             "message": str(e).splitlines()[0] if str(e) else ""}
    return answer
