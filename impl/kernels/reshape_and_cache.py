"""reshape_and_cache: write the new tokens' keys and values into the paged KV
cache at their slots.

slot = block_id * block_size + offset (see impl/block_table.py); a slot of -1
marks a padding token (e.g. a batch padded to a captured size) and is skipped.
The caches are 4-D views indexed [block, offset, kv head, dim] with any strides,
so one kernel serves every layout of impl/kv_cache_tensors.py.

With an fp8 cache ("fp8"/"fp8_e4m3" or "fp8_e5m2") the cache holds x / scale,
saturated and rounded to nearest-even; k_scale and v_scale are one-element
float32 tensors (vLLM's per-tensor scales live on the device, not the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl.kernels import triton_mode
from impl.kernels.rounding import FP8_E4M3, FP8_E5M2, cast_rounded, round_to_fp8_grid

FP8_DTYPES = {
    "fp8": (torch.float8_e4m3fn, FP8_E4M3),
    "fp8_e4m3": (torch.float8_e4m3fn, FP8_E4M3),
    "fp8_e5m2": (torch.float8_e5m2, FP8_E5M2),
}


def cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element type a cache of `kv_cache_dtype` ("auto" or an fp8 name) holds."""
    if kv_cache_dtype == "auto":
        return model_dtype
    try:
        return FP8_DTYPES[kv_cache_dtype][0]
    except KeyError:
        raise ValueError(f"unknown kv_cache_dtype '{kv_cache_dtype}' "
                         f"(known: auto, {', '.join(FP8_DTYPES)})") from None


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    k_scale_ptr, v_scale_ptr,
    num_tokens, num_kv_heads, head_size, block_size,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_b, stride_kc_n, stride_kc_h, stride_kc_d,
    stride_vc_b, stride_vc_n, stride_vc_h, stride_vc_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_FP8: tl.constexpr, FP8_MANT: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    # A program moves BLOCK_T tokens x BLOCK_H heads, each a whole head_size
    # row: columns of the tile are (head, dim) pairs.
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H * BLOCK_D)
    heads = tl.program_id(1) * BLOCK_H + cols // BLOCK_D
    dims = cols % BLOCK_D
    slot = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size
    mask = (slot >= 0)[:, None] & ((heads < num_kv_heads) & (dims < head_size))[None, :]

    k = tl.load(key_ptr + tokens[:, None] * stride_kt
                + (heads * stride_kh + dims)[None, :], mask=mask)
    v = tl.load(value_ptr + tokens[:, None] * stride_vt
                + (heads * stride_vh + dims)[None, :], mask=mask)
    kc = (key_cache_ptr + (block * stride_kc_b + offset * stride_kc_n)[:, None]
          + (heads * stride_kc_h + dims * stride_kc_d)[None, :])
    vc = (value_cache_ptr + (block * stride_vc_b + offset * stride_vc_n)[:, None]
          + (heads * stride_vc_h + dims * stride_vc_d)[None, :])
    if IS_FP8:
        k = k.to(tl.float32) / tl.load(k_scale_ptr)
        v = v.to(tl.float32) / tl.load(v_scale_ptr)
        k = round_to_fp8_grid(k, FP8_MANT, FP8_MIN_EXP, FP8_MAX)
        v = round_to_fp8_grid(v, FP8_MANT, FP8_MIN_EXP, FP8_MAX)
        tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)
    elif key_ptr.dtype.element_ty == key_cache_ptr.dtype.element_ty:
        # Same type: a bit-exact copy.
        tl.store(kc, k, mask=mask)
        tl.store(vc, v, mask=mask)
    else:
        tl.store(kc, cast_rounded(k.to(tl.float32), key_cache_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(vc, cast_rounded(v.to(tl.float32), value_cache_ptr.dtype.element_ty),
                 mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """key, value: [num_tokens, num_kv_heads, head_size]; key_cache,
    value_cache: [num_blocks, block_size, num_kv_heads, head_size] views;
    slot_mapping: [num_tokens] (int32 or int64, -1 = skip)."""
    num_tokens, num_kv_heads, head_size = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("key and value must be contiguous in head_size")
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError("slot_mapping is shorter than the number of tokens")
    _, block_size, cache_heads, cache_dim = key_cache.shape
    if (cache_heads, cache_dim) != (num_kv_heads, head_size):
        raise ValueError(f"cache holds {cache_heads} heads of {cache_dim}, "
                         f"key has {num_kv_heads} of {head_size}")
    is_fp8 = kv_cache_dtype != "auto"
    fp8 = (0, 0, 0.0)
    if is_fp8:
        expected, fp8 = FP8_DTYPES[kv_cache_dtype]
        if key_cache.dtype != expected:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype} needs a {expected} cache, "
                             f"got {key_cache.dtype}")
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 cache needs k_scale and v_scale")
    else:
        one = torch.ones(1, dtype=torch.float32, device=key.device)
        k_scale = one if k_scale is None else k_scale
        v_scale = one if v_scale is None else v_scale
    if num_tokens == 0:
        return
    block_d = triton.next_power_of_2(head_size)
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, 4096 // block_d))
    # Compiled: a token per program (thousands of programs fill a GPU).
    # Interpreted: every program costs Python time, so many tokens each.
    block_t = min(64, triton.next_power_of_2(num_tokens)) if triton_mode.INTERPRETED else 1
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(num_kv_heads, block_h))
    _reshape_and_cache_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale,
        num_tokens, num_kv_heads, head_size, block_size,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *key_cache.stride(), *value_cache.stride(),
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
        IS_FP8=is_fp8, FP8_MANT=fp8[0], FP8_MIN_EXP=fp8[1], FP8_MAX=fp8[2],
    )
