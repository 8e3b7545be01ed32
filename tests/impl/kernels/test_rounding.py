"""The explicit round-to-nearest-even casts agree bit for bit with torch's
casts, including ties, subnormals and saturation (the interpreter's own casts
truncate, which these tests would catch)."""

import pytest
import torch
import triton
import triton.language as tl

from impl.kernels.rounding import FP8_E4M3, FP8_E5M2, cast_rounded, round_to_fp8_grid


@triton.jit
def _to_bf16(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, cast_rounded(x, y_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _to_fp8(x_ptr, y_ptr, n, MANT: tl.constexpr, MIN_EXP: tl.constexpr, MAX: tl.constexpr,
            BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = round_to_fp8_grid(x, MANT, MIN_EXP, MAX)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n)


def _inputs(scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(3000, generator=g) * scale,
                      torch.randn(500, generator=g) * scale * 1e-3])


def test_bf16_rounding_matches_torch_including_ties():
    # 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0);
    # 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
    ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0e38, 0.0])
    x = torch.cat([_inputs(10.0), ties])
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    _to_bf16[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert torch.equal(y, x.to(torch.bfloat16))


@pytest.mark.parametrize("fmt, dtype", [(FP8_E4M3, torch.float8_e4m3fn),
                                        (FP8_E5M2, torch.float8_e5m2)])
def test_fp8_rounding_matches_torch_and_saturates(fmt, dtype):
    mant, min_exp, max_val = fmt
    # Ties of the e4m3 grid around 1 (spacing 1/8) and 16 (spacing 2),
    # subnormals, and values past the largest finite one.
    special = torch.tensor([1 + 1 / 16, 1 + 3 / 16, 17.0, 19.0, 2.0 ** -9, 3 * 2.0 ** -10,
                            -2.0 ** -17, 1e6, -1e6, max_val, 0.0])
    x = torch.cat([_inputs(100.0), special])
    y = torch.empty(x.numel(), dtype=dtype)
    _to_fp8[(1,)](x, y, x.numel(), mant, min_exp, max_val,
                  BLOCK=triton.next_power_of_2(x.numel()))
    want = x.clamp(-max_val, max_val).to(dtype)
    assert torch.equal(y.float(), want.float())
