"""The model shape of a cache config: what the gate sizes for every trace
with a `model` header and every seeded workload (specs/SIZING.md).

Layer i takes group i mod G of the config's G groups (every group at least
one layer) with the model's heads, head size and dtype (MLA: one 576-wide
latent); one worker whose memory is exactly `num_blocks` blocks of its pool,
max_model_len auto-fitted from the config's. vLLM must size it to the
config's `num_blocks` (what the manager the trace ran on was given), and
impl as vLLM does.
"""

from __future__ import annotations

from harness.core import kinds
from harness.core.cache_config import CacheConfig
from harness.core.sizing_shape import DTYPE_SIZES, LayerShape, SizingShape, WorkerShape

# The model a config without a `model` header is given (the golden engine
# traces' tiny model).
DEFAULT_MODEL = (2, 2, 64, "bfloat16")  # (layers, KV heads, head size, dtype)
# A state-space layer's states: a conv state and an SSM state.
_MAMBA_STATES = (((3, 256), (8, 16, 16)), ("bfloat16", "float32"))
_MLA_LATENT = 576
_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _layer(config: CacheConfig, g, heads: int, head_size: int, dtype: str) -> LayerShape:
    row = kinds.kind_row(g.kind)
    values = dict(kinds.spec_values(row, g, config))
    block_size = values.pop("block_size")
    if g.kind == "mamba":
        shapes, dtypes = _MAMBA_STATES
        values["shapes"] = shapes
        return LayerShape("mamba", block_size, dtypes=dtypes,
                          values=tuple(sorted(values.items())))
    if g.kind in ("mla_attention", "sliding_window_mla"):
        heads, head_size = 1, _MLA_LATENT
    return LayerShape(g.kind, block_size, heads, head_size, dtype,
                      values=tuple(sorted(values.items())))


def shape_of_config(name: str, config: CacheConfig, model=None, where: str = "") -> SizingShape:
    """The shape of `config` with the model `model` (a trace header's
    ModelShape; None: DEFAULT_MODEL)."""
    num_layers, heads, head_size, dtype = (
        DEFAULT_MODEL if model is None else
        (model.num_layers, model.num_kv_heads, model.head_size, model.dtype))
    dtype = dtype if dtype in DTYPE_SIZES else "bfloat16"
    # The cache holds what --kv-cache-dtype says, not the model's dtype.
    dtype = _CACHE_DTYPES.get(getattr(model, "kv_cache_dtype", "auto"), dtype)
    groups = config.groups
    layers = tuple(
        (f"model.layers.{i}.{groups[i % len(groups)].kind}",
         _layer(config, groups[i % len(groups)], heads, head_size, dtype))
        for i in range(max(num_layers, len(groups))))
    modes = {layer.value("mamba_cache_mode") for _, layer in layers if layer.kind == "mamba"}
    return SizingShape(
        name, layers, (WorkerShape(tuple(n for n, _ in layers), memory_blocks=config.num_blocks),),
        max_model_len=config.max_model_len, auto_fit=True,
        dcp_world_size=config.dcp_world_size, enable_caching=config.enable_caching,
        prefix_match_unit=config.prefix_match_unit,
        mamba_cache_mode=modes.pop() if len(modes) == 1 else "none",
        max_in_flight_tokens=config.max_in_flight_tokens, where=where,
        expect=(("scheduler.num_blocks", config.num_blocks),))
