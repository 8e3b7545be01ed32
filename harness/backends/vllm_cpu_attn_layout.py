"""Conversion between vLLM's CPU attention cache and plain [block, offset,
kv head, dim] tensors.

vLLM's CPU_ATTN backend allocates a layer's cache as
[num_blocks, num_kv_heads, block_size, 2 * head_size], views it as
[num_blocks, num_kv_heads, 2 * block_size, head_size] and splits dim 2: per
(block, head), a K region of block_size * head_size elements, then a V region as
large. What order the elements take inside a region depends on the ISA its
kernels were picked for (vllm/v1/attention/backends/cpu_attn.py _get_attn_isa;
csrc/cpu/cpu_attn_*.hpp reshape_and_cache):

- "vec", "vec16": K column-major [head_size, block_size]; V row-major
  [block_size, head_size] (impl's CPU_ATTN layout is the same bytes).
- "amx" (bf16 or fp16, 4-byte words of 2 elements): K in groups of 16 tokens,
  each group [head_size / 2 words, 16 tokens, 2 elements]; V in groups of 16
  head dims, each group [block_size / 2 token pairs, 16 dims, 2 tokens].

Both directions are index maps of one region, tested against vLLM's own
cpu_attn_reshape_and_cache (tests/harness/attention/test_cpu_attn_layout.py),
so a layout change in vLLM shows up as a test failure, not silent garbage.
fp8 caches and the other ISAs (neon, vxe, vsx, rvv, amx_fp8) are not converted.
"""

from __future__ import annotations

from functools import lru_cache

import torch

SUPPORTED_ISAS = ("vec", "vec16", "amx")
# AMX tiles: rows of 64 bytes; a K group holds 64 / 4 = 16 tokens, a V group
# 64 / 4 = 16 head dims (one 4-byte word per row element).
_AMX_ROW_BYTES = 64


@lru_cache(maxsize=32)
def region_index(isa: str, block_size: int, head_size: int, itemsize: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_index, v_index): int64 [block_size, head_size], the position of
    element (token, dim) inside the K and the V region of one (block, head)."""
    n = torch.arange(block_size)[:, None]
    d = torch.arange(head_size)[None, :]
    if isa in ("vec", "vec16"):
        return (d * block_size + n).expand(block_size, head_size).contiguous(), \
            (n * head_size + d).expand(block_size, head_size).contiguous()
    if isa == "amx":
        # Only 2-byte elements (bf16, fp16) are checked against vLLM's amx
        # kernels; an fp8 cache's amx order is not.
        if itemsize != 2:
            raise ValueError(f"the amx layout is converted for 2-byte elements only, "
                             f"not itemsize {itemsize}")
        per_word = 2
        tokens_per_group = _AMX_ROW_BYTES // 4
        dims_per_group = _AMX_ROW_BYTES // 4
        if block_size % tokens_per_group or head_size % dims_per_group:
            raise ValueError(f"amx needs block_size and head_size multiples of 16, "
                             f"got {block_size} and {head_size}")
        k = ((n // tokens_per_group) * tokens_per_group * head_size
             + (d // per_word) * tokens_per_group * per_word
             + (n % tokens_per_group) * per_word + d % per_word)
        v = ((d // dims_per_group) * block_size * dims_per_group
             + (n // per_word) * per_word * dims_per_group
             + (d % dims_per_group) * per_word + n % per_word)
        return k.contiguous(), v.contiguous()
    raise ValueError(f"no conversion for CPU attention ISA '{isa}' "
                     f"(supported: {', '.join(SUPPORTED_ISAS)})")


def _regions(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, num_kv_heads, 2, block_size * head_size] view of a cache
    [num_blocks, num_kv_heads, block_size, 2 * head_size]."""
    b, h, n, d2 = cache.shape
    return cache.view(b, h, 2, n * d2 // 2)


def unpack(cache: torch.Tensor, isa: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(key, value), each [num_blocks, block_size, num_kv_heads, head_size]
    (fresh tensors), from a CPU attention cache."""
    b, h, n, d2 = cache.shape
    d = d2 // 2
    k_index, v_index = region_index(isa, n, d, cache.dtype.itemsize)
    regions = _regions(cache)
    key = regions[:, :, 0][:, :, k_index.flatten()].view(b, h, n, d)
    value = regions[:, :, 1][:, :, v_index.flatten()].view(b, h, n, d)
    return key.permute(0, 2, 1, 3).contiguous(), value.permute(0, 2, 1, 3).contiguous()


def pack(key: torch.Tensor, value: torch.Tensor, isa: str) -> torch.Tensor:
    """A CPU attention cache [num_blocks, num_kv_heads, block_size,
    2 * head_size] holding key and value ([block, offset, kv head, dim])."""
    b, n, h, d = key.shape
    k_index, v_index = region_index(isa, n, d, key.dtype.itemsize)
    cache = torch.empty(b, h, n, 2 * d, dtype=key.dtype, device=key.device)
    regions = _regions(cache)
    regions[:, :, 0, k_index.flatten()] = key.permute(0, 2, 1, 3).reshape(b, h, n * d)
    regions[:, :, 1, v_index.flatten()] = value.permute(0, 2, 1, 3).reshape(b, h, n * d)
    return cache
