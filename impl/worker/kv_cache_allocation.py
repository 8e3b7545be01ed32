"""The worker's KV cache tensors: one backing allocation for a whole KV cache
config and a view of every layer's pages in it (vLLM 0.32:
worker/utils.allocate_kv_cache and the per-layer views of
kv_cache_interface); specs/WORKER_BLOCK_TABLE.md, "The KV cache tensors".

The plan (impl/kv_cache_sizing.py) already says where each page lives: layer
l's block b starts at offset + l * layer_stride + b * block_stride bytes. What
is left here is the view: the logical [blocks, heads, states, cell bytes]
grid of one layer, strided as the layout orders the axes, with the plan's
layer and block strides kept, and read in the spec's element type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import torch

from impl.kv_cache_layout import AXIS_L
from impl.kv_cache_sizing import (
    KVCacheConfigPlan,
    KVCacheTensor,
    layer_view_shape_bytes,
    layout_strides,
)
from impl.kv_cache_spec import AttentionSpec, KVCacheGroupSpec, KVCacheSpec
from impl.uniform_type_spec import UniformTypeKVCacheSpecs


@dataclass(frozen=True, slots=True)
class TensorViewPlan:
    """How one plan tensor's layers are viewed (what allocation decides
    before touching memory; tests read it without allocating)."""

    group_index: int
    spec: KVCacheSpec
    num_blocks: int  # manager blocks
    kernel_block_size: int | None  # None: the spec's own block size
    shape: tuple[int, ...]  # logical [L, B, H, N, C], C in bytes
    strides: tuple[int, ...]  # bytes, same axis order


def allocate_kv_cache(
    config: KVCacheConfigPlan, layout: str, kernel_block_sizes: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Allocate the config's backing bytes (zeroed) and view every layer in them."""
    if not config.kv_cache_tensors:
        return {}
    raw = torch.zeros(backing_size(config.kv_cache_tensors), dtype=torch.int8, device=device)
    caches: dict[str, torch.Tensor] = {}
    for tensor in config.kv_cache_tensors:
        plan = plan_tensor_views(config, tensor, layout, kernel_block_sizes)
        if plan is None:
            # The spec lays out its own region: it gets the whole allocation.
            caches.update((name, raw) for name in tensor.layers)
            continue
        caches.update(zip(tensor.layers, _layer_views(raw, tensor, plan)))
    return caches


def backing_size(tensors: Sequence[KVCacheTensor]) -> int:
    """Every tensor of a strided plan is a region of one allocation."""
    sizes = {t.size for t in tensors}
    if len(sizes) != 1:
        raise ValueError(f"the KV cache tensors name {len(sizes)} allocation sizes "
                         f"{sorted(sizes)}; a strided plan shares one allocation")
    return sizes.pop()


def plan_tensor_views(config: KVCacheConfigPlan, tensor: KVCacheTensor, layout: str,
                      kernel_block_sizes: Sequence[int] | None = None) -> TensorViewPlan | None:
    """The views of `tensor`'s layers; None where its spec has no layer views."""
    group_index, spec = _tensor_spec(config.kv_cache_groups, tensor)
    if not spec.has_layer_views:
        return None
    num_blocks = _num_blocks(config, tensor)
    kernel = None
    if kernel_block_sizes is not None and group_index < len(kernel_block_sizes):
        kernel = kernel_block_sizes[group_index]
    view_shape = layer_view_shape_bytes(spec, num_blocks, kernel)
    block_stride = _kernel_block_stride(spec, tensor, layout, view_shape[0] // num_blocks,
                                        kernel)
    strides = layout_strides(spec, num_blocks, len(tensor.layers), layout,
                             block_stride=block_stride, layer_stride=tensor.layer_stride,
                             kernel_block_size=kernel)
    return TensorViewPlan(group_index, spec, num_blocks, kernel,
                          (len(tensor.layers), *view_shape), strides)


def _tensor_spec(groups: Sequence[KVCacheGroupSpec],
                 tensor: KVCacheTensor) -> tuple[int, KVCacheSpec]:
    """The first group holding the tensor's first layer, and that layer's spec."""
    first = tensor.layers[0]
    for i, group in enumerate(groups):
        if first in group.layer_names:
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[first]
            return i, spec
    raise ValueError(f"layer '{first}' of a KV cache tensor is in no KV cache group")


def _num_blocks(config: KVCacheConfigPlan, tensor: KVCacheTensor) -> int:
    if not tensor.host_resident:
        return config.num_blocks
    if config.hisparse_host_num_blocks is None:
        raise ValueError("a host-resident KV cache tensor in a config without a host pool")
    return config.hisparse_host_num_blocks


def _kernel_block_stride(spec: KVCacheSpec, tensor: KVCacheTensor, layout: str, ratio: int,
                         kernel_block_size: int | None) -> int:
    """The plan's block stride, split into `ratio` kernel blocks: only a dense
    block (no padding, no other layer's page before the next block) has its
    kernel blocks a constant stride apart."""
    if ratio == 1:
        return tensor.block_stride
    dense = prod(layer_view_shape_bytes(spec, 1)[1:])
    if tensor.block_stride != dense:
        raise ValueError(
            f"blocks of the {layout} layout are {tensor.block_stride} bytes apart, not one "
            f"dense {dense}-byte page: a block cannot be viewed as {ratio} kernel blocks "
            f"of {kernel_block_size} tokens (a smaller block size, or a layout with "
            f"layers outermost, can)")
    if tensor.block_stride % ratio:
        raise AssertionError(f"a {tensor.block_stride}-byte block does not split into "
                             f"{ratio} equal kernel blocks")
    return tensor.block_stride // ratio


def _layer_views(raw: torch.Tensor, tensor: KVCacheTensor,
                 plan: TensorViewPlan) -> list[torch.Tensor]:
    # One strided view of all the tensor's layers, in bytes; each layer is
    # then a slice of it, read in the spec's element type.
    all_layers = raw.as_strided(plan.shape, plan.strides,
                                raw.storage_offset() + tensor.offset)
    dtype = element_type(plan.spec)
    views = []
    for layer in range(plan.shape[AXIS_L]):
        view = all_layers[layer]
        views.append(view if dtype is None else view.view(dtype))
    return views


def element_type(spec: KVCacheSpec) -> torch.dtype | None:
    """The dtype the spec's label names (attention specs); None: bytes (a
    Mamba spec has one dtype per state tensor, an unlabelled spec none)."""
    if not isinstance(spec, AttentionSpec) or spec.dtype_label is None:
        return None
    dtype = getattr(torch, spec.dtype_label.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the KV cache dtype label {spec.dtype_label!r} names no torch dtype")
    if dtype.itemsize != spec.dtype_size:
        raise ValueError(f"the label {spec.dtype_label!r} is {dtype.itemsize} bytes an "
                         f"element, the spec {spec.dtype_size}")
    return dtype
