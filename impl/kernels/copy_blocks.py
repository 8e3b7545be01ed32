"""copy_blocks: copy whole blocks of every layer's cache, src -> dst, for
copy-on-write (vLLM: cache_ops.copy_blocks).

block_mapping is an int64 tensor [num_pairs, 2] of (src, dst) block ids; a
block is block_size x num_kv_heads x head_size elements of K and as many of V.
The kernel walks [offset, head, dim] through the view's strides, so it copies
the blocks of any layout. One launch per layer: each layer is its own tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from impl.kernels import triton_mode


@triton.jit
def _copy_blocks_kernel(
    key_cache_ptr, value_cache_ptr, block_mapping_ptr,
    num_kv_heads, head_size, block_elems,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    elems = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = elems < block_elems
    d = elems % head_size
    h = (elems // head_size) % num_kv_heads
    n = elems // (head_size * num_kv_heads)
    k_off = n * stride_kn + h * stride_kh + d * stride_kd
    v_off = n * stride_vn + h * stride_vh + d * stride_vd
    k = tl.load(key_cache_ptr + src * stride_kb + k_off, mask=mask)
    v = tl.load(value_cache_ptr + src * stride_vb + v_off, mask=mask)
    tl.store(key_cache_ptr + dst * stride_kb + k_off, k, mask=mask)
    tl.store(value_cache_ptr + dst * stride_vb + v_off, v, mask=mask)


def copy_blocks(
    key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Each cache: [num_blocks, block_size, num_kv_heads, head_size] view."""
    if len(key_caches) != len(value_caches):
        raise ValueError("as many key caches as value caches are needed")
    if block_mapping.numel() == 0:
        return
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError("block_mapping must be [num_pairs, 2] (src, dst)")
    dsts = block_mapping[:, 1].tolist()
    if len(set(dsts)) != len(dsts) or set(dsts) & set(block_mapping[:, 0].tolist()):
        # Programs run in any order: a block both read and written, or written
        # twice, would make the result depend on it.
        raise ValueError("destination blocks must be distinct and not also sources")
    mapping = block_mapping.to(torch.int64).contiguous()
    for kc, vc in zip(key_caches, value_caches):
        _, n, h, d = kc.shape
        elems = n * h * d
        block = 8192 if triton_mode.INTERPRETED else 1024
        block = min(block, triton.next_power_of_2(elems))
        _copy_blocks_kernel[(mapping.shape[0], triton.cdiv(elems, block))](
            kc, vc, mapping, h, d, elems, *kc.stride(), *vc.stride(), BLOCK=block)
