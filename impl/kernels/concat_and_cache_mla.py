"""concat_and_cache_mla: write MLA's latent cache.

An MLA layer caches, per token, one row of kv_lora_rank + rope_dim elements:
the compressed latent kv_c (from which keys and values are both recovered),
then the rotary part of the key k_pe. The cache is [num_blocks, block_size,
kv_lora_rank + rope_dim] (vLLM's MLA layout; one "kv head"), a token's row at
its slot, -1 skipped. Attention then reads the whole row as the key and its
first kv_lora_rank elements as the value (impl/kernels/unified_attention.py
with two views of the same cache).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl.kernels import triton_mode
from impl.kernels.rounding import cast_rounded


@triton.jit
def _concat_and_cache_mla_kernel(
    kv_c_ptr, k_pe_ptr, cache_ptr, slot_mapping_ptr,
    num_tokens, latent, rope, block_size,
    stride_ct, stride_pt, stride_cache_b, stride_cache_n,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    row = cache_ptr + (slot // block_size) * stride_cache_b + (slot % block_size) * stride_cache_n
    keep = slot >= 0
    c = tl.arange(0, BLOCK_C)
    c_mask = keep[:, None] & (c < latent)[None, :]
    x = tl.load(kv_c_ptr + tokens[:, None] * stride_ct + c[None, :], mask=c_mask)
    tl.store(row[:, None] + c[None, :], cast_rounded(x.to(tl.float32),
                                                     cache_ptr.dtype.element_ty), mask=c_mask)
    r = tl.arange(0, BLOCK_R)
    r_mask = keep[:, None] & (r < rope)[None, :]
    y = tl.load(k_pe_ptr + tokens[:, None] * stride_pt + r[None, :], mask=r_mask)
    tl.store(row[:, None] + latent + r[None, :],
             cast_rounded(y.to(tl.float32), cache_ptr.dtype.element_ty), mask=r_mask)


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor) -> None:
    """kv_c: [num_tokens, kv_lora_rank]; k_pe: [num_tokens, rope_dim];
    kv_cache: [num_blocks, block_size, kv_lora_rank + rope_dim] (rows
    contiguous); slot_mapping: [num_tokens] (-1 = skip)."""
    num_tokens, latent = kv_c.shape
    if k_pe.shape[0] != num_tokens or slot_mapping.shape[0] < num_tokens:
        raise ValueError(f"kv_c has {num_tokens} tokens, k_pe {k_pe.shape[0]}, "
                         f"slot_mapping {slot_mapping.shape[0]}")
    rope = k_pe.shape[1]
    if kv_cache.shape[2] != latent + rope or kv_cache.stride(2) != 1:
        raise ValueError(f"a cache row of {kv_cache.shape[2]} elements cannot hold "
                         f"{latent} + {rope}")
    if kv_c.stride(1) != 1 or k_pe.stride(1) != 1:
        raise ValueError("kv_c and k_pe rows must be contiguous")
    if num_tokens == 0:
        return
    block_t = min(64, triton.next_power_of_2(num_tokens)) if triton_mode.INTERPRETED else 1
    _concat_and_cache_mla_kernel[(triton.cdiv(num_tokens, block_t),)](
        kv_c, k_pe, kv_cache, slot_mapping, num_tokens, latent, rope, kv_cache.shape[1],
        kv_c.stride(0), k_pe.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        BLOCK_T=block_t, BLOCK_C=triton.next_power_of_2(latent),
        BLOCK_R=triton.next_power_of_2(rope),
    )
