"""Round-to-nearest-even casts from fp32 down to bf16 and fp8, as Triton
functions.

A compiled kernel rounds these casts itself, but the interpreter truncates
fp32 -> bf16 and fp32 -> fp8. Rounding explicitly onto the target grid first
makes the final cast exact, so both runs store the same bits (and the same bits
torch's `.to()` would produce). fp16 casts are rounded correctly everywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from impl.kernels import triton_mode  # noqa: F401  (must precede @triton.jit)

# fp8 formats vLLM's KV cache uses: (mantissa bits, smallest normal exponent,
# largest finite value). vLLM saturates instead of overflowing to NaN/inf.
FP8_E4M3 = (3, -6, 448.0)
FP8_E5M2 = (2, -14, 57344.0)


@triton.jit
def round_to_bf16_grid(x):
    """fp32 values rounded (nearest, ties to even) to what bf16 can hold."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def round_to_fp8_grid(x, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr,
                      MAX_VAL: tl.constexpr):
    """fp32 values saturated to +-MAX_VAL and rounded (nearest, ties to even)
    onto the grid of an fp8 format with MANT_BITS mantissa bits."""
    x = tl.minimum(tl.maximum(x, -MAX_VAL), MAX_VAL)
    bits = x.to(tl.uint32, bitcast=True)
    exp = ((bits >> 23) & 0xFF).to(tl.int32) - 127
    # The spacing of representable values around x (subnormals share the
    # spacing of the smallest normal binade).
    quantum_exp = tl.maximum(exp, MIN_EXP) - MANT_BITS
    quantum = ((quantum_exp + 127).to(tl.uint32) << 23).to(tl.float32, bitcast=True)
    y = x / quantum  # exact: a power-of-two division
    r = tl.floor(y + 0.5)
    is_tie = (r - y) == 0.5
    is_odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    r = tl.where(is_tie & is_odd, r - 1.0, r)
    out = r * quantum
    # A value that rounds to zero keeps its sign (floor(y + 0.5) gives +0 for
    # a small negative y): the cast of every fp8 format stores -0 for it, and
    # the cache's bytes must be the same.
    return tl.where(out == 0.0, x * 0.0, out)


@triton.jit
def cast_rounded(x, dtype: tl.constexpr):
    """x (fp32) cast to dtype with round-to-nearest-even, interpreter or not."""
    if dtype == tl.bfloat16:
        x = round_to_bf16_grid(x)
    return x.to(dtype)
