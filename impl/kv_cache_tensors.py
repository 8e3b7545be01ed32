"""The KV cache's memory: raw buffers and the per-layer views kernels use.

As in vLLM, the sizing plan is a list of KVCacheTensor: one raw byte buffer
each, holding the pages of one or more layers (`layers[l]`'s page for block b
starts at offset + l * layer_stride + b * block_stride bytes). Every layer gets
two 4-D views, key and value, indexed [block, offset in block, kv head, dim];
the layout decides their strides, so kernels take any layout through strides:

- STACKED: the layer's region is (2, num_blocks, block_size, num_kv_heads,
  head_size), K of every block then V of every block (the classic flash layout).
- LBNHC: vLLM 0.32's default; a block's page is [block_size, num_kv_heads,
  2 * head_size], key and value of one token and head side by side.
- CPU_ATTN: the shape vLLM's CPU attention backend allocates, a page of
  [num_kv_heads, block_size, 2 * head_size] that the backend splits per head
  into a K part and a V part of block_size * head_size each. Inside them K is
  stored [head_size, block_size] (column-major) and V [block_size, head_size],
  the order of vLLM's "vec" kernels; its AMX kernels pack the same bytes in
  tiles (harness/backends/vllm_cpu_attn_layout.py converts).

A page is 2 * block_size * num_kv_heads * head_size elements, vLLM's
AttentionSpec.page_size_bytes. An MLA layer (`KVCacheShape.mla`) caches one
latent row per token instead of a key and a value: its page is
block_size * head_size elements (MLAAttentionSpec), allocated (num_blocks,
block_size, head_size) whatever the layout, and its `key` and `value` views are
the same [block, offset, 1, head_size] view (attention takes the value as the
row's first kv_lora_rank elements).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch


class KVCacheLayout(str, Enum):
    STACKED = "stacked"
    LBNHC = "LBNHC"
    CPU_ATTN = "cpu_attn"

    @property
    def block_contiguous(self) -> bool:
        """Whether one block's K and V form one contiguous page (a block can
        then be copied or swapped as one run of bytes)."""
        return self is not KVCacheLayout.STACKED


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    """What one layer's cache holds per block."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    mla: bool = False  # one latent row per token (num_kv_heads 1), no separate value

    @property
    def page_elems(self) -> int:
        parts = 1 if self.mla else 2
        return parts * self.block_size * self.num_kv_heads * self.head_size

    @property
    def page_size_bytes(self) -> int:
        return self.page_elems * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class KVCacheTensor:
    """One raw buffer of the sizing plan (vLLM: KVCacheTensor)."""

    size: int  # bytes
    layers: tuple[str, ...]
    layer_stride: int  # bytes between the regions of consecutive layers
    block_stride: int  # bytes between consecutive blocks of one layer
    offset: int = 0  # byte offset of layers[0]'s block 0


@dataclass(slots=True)
class LayerKVCache:
    """One layer's cache: key and value views [block, offset, kv head, dim]."""

    key: torch.Tensor
    value: torch.Tensor
    # The layer's region of the raw buffer, in the cache dtype, shaped as the
    # layout's allocation shape (what vLLM hands the attention backend).
    raw: torch.Tensor


def plan_kv_cache_tensors(
    layer_names: Sequence[str], num_blocks: int, shape: KVCacheShape,
    layout: KVCacheLayout = KVCacheLayout.LBNHC,
) -> list[KVCacheTensor]:
    """One buffer per layer, each num_blocks pages: the plan vLLM makes for a
    model whose layers all share one KV cache spec."""
    page = shape.page_size_bytes
    block_stride = page if layout.block_contiguous or shape.mla else page // 2
    return [KVCacheTensor(page * num_blocks, (name,), page * num_blocks, block_stride)
            for name in layer_names]


def allocate_kv_cache(
    tensors: Sequence[KVCacheTensor], num_blocks: int, shape: KVCacheShape,
    layout: KVCacheLayout = KVCacheLayout.LBNHC, device: torch.device | str = "cpu",
    fill: float | None = None,
) -> dict[str, LayerKVCache]:
    """Allocate every raw buffer of the plan and view each layer in it.

    `fill` sets every element (e.g. NaN, to prove a kernel never reads a block
    it should not); by default the memory is left uninitialised, as in vLLM.
    """
    caches: dict[str, LayerKVCache] = {}
    item = shape.dtype.itemsize
    for t in tensors:
        _check_tensor(t, num_blocks, shape, layout)
        raw = torch.empty(t.size, dtype=torch.int8, device=device)
        for i, name in enumerate(t.layers):
            if name in caches:
                raise ValueError(f"layer '{name}' is in more than one KV cache tensor")
            start = t.offset + i * t.layer_stride
            caches[name] = _layer_views(raw, start // item, t.block_stride // item,
                                        num_blocks, shape, layout)
    if fill is not None:
        for c in caches.values():
            c.key.fill_(fill)
            c.value.fill_(fill)
    return caches


def _check_tensor(t: KVCacheTensor, num_blocks: int, shape: KVCacheShape,
                  layout: KVCacheLayout) -> None:
    item = shape.dtype.itemsize
    page = shape.page_size_bytes
    if any(v % item for v in (t.offset, t.layer_stride, t.block_stride)):
        raise ValueError(f"{t}: offsets and strides must be multiples of {item} bytes")
    if (layout.block_contiguous or shape.mla) and t.block_stride < page:
        raise ValueError(f"{t}: block_stride {t.block_stride} < page of {page} bytes")
    if not (layout.block_contiguous or shape.mla) and t.block_stride != page // 2:
        raise ValueError(f"{t}: the {layout.value} layout keeps K and V apart; "
                         f"block_stride must be half a page ({page // 2} bytes)")
    if layout.block_contiguous or shape.mla:
        layer_bytes = t.block_stride * (num_blocks - 1) + page
    else:
        layer_bytes = page * num_blocks
    end = t.offset + t.layer_stride * (len(t.layers) - 1) + layer_bytes
    if end > t.size:
        raise ValueError(f"{t}: its layers need {end} bytes, the buffer has {t.size}")


def _layer_views(raw: torch.Tensor, start: int, block_stride: int, num_blocks: int,
                 shape: KVCacheShape, layout: KVCacheLayout) -> LayerKVCache:
    """Views of one layer starting `start` elements into raw (strides in elements)."""
    n, h, d = shape.block_size, shape.num_kv_heads, shape.head_size
    storage = raw.view(shape.dtype)
    half = n * h * d  # elements of K (or V) of one block

    def view(size, stride, offset=0):
        return storage.as_strided(size, stride, start + offset)

    if shape.mla:
        raw_view = view((num_blocks, n, h * d), (block_stride, h * d, 1))
        latent = view((num_blocks, n, h, d), (block_stride, h * d, d, 1))
        return LayerKVCache(latent, latent, raw_view)
    if layout is KVCacheLayout.STACKED:
        raw_view = view((2, num_blocks, n, h, d),
                        (num_blocks * half, block_stride, h * d, d, 1))
        key, value = raw_view[0], raw_view[1]
    elif layout is KVCacheLayout.LBNHC:
        # Allocated (B, N, H, 2D); vLLM's logical view of it is (B, H, N, 2D).
        raw_view = view((num_blocks, n, h, 2 * d), (block_stride, h * 2 * d, 2 * d, 1))
        key, value = raw_view[..., :d], raw_view[..., d:]
    else:
        raw_view = view((num_blocks, h, n, 2 * d), (block_stride, 2 * n * d, 2 * d, 1))
        # Per (block, head): K part [d, n] column-major, then V part [n, d].
        key = view((num_blocks, n, h, d), (block_stride, 1, 2 * n * d, n))
        value = view((num_blocks, n, h, d), (block_stride, d, 2 * n * d, 1), n * d)
    return LayerKVCache(key, value, raw_view)
