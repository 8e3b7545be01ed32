"""Attention-output tolerances: the error model of specs/ATTENTION.md, its
constants read from specs/attention_tolerances.yaml.

An implementation's output element is compared with the exact value o, the
float64 reference over the very values the KV cache holds (so the cache's own
rounding, fp8 included, is not an error). Its allowed error is

    u_out * |o|                                   rounding the result once
  + sigmas * u32 * (sqrt(n) + L) * M              fp32 logits, exp2 and sums
  + sigmas * u_p * R                              probabilities rounded to the
                                                  model dtype before P @ V
  + sigmas * u_kv * (L + 1) * R                   fp8 keys/values rounded to
                                                  the model dtype after scaling
  + floor                                         half the dtype's subnormal step

with, from the reference (reference.py): n the keys the query sees, M =
sum_i p_i |v_i| (what the sum is made of), R = sqrt(sum_i p_i^2 v_i^2) (its
random-walk size), L the largest logit magnitude summed into a row
(scale * sum_j |q_j k_ij| plus |ALiBi bias|). u_out, u_p, u_kv are unit
roundoffs (2^-24 float32, 2^-11 float16, 2^-8 bfloat16); u_p and u_kv count
only for implementations that make those roundings (`paths` in the spec). The
first term is a bound; the others are the sizes of sums of independent
rounding errors, taken `sigmas` times. Comparing two implementations, their
allowances add.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

SPEC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "specs",
                         "attention_tolerances.yaml")

_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
# Half the spacing of the smallest subnormals: the absolute rounding error
# that u_out * |o| misses near zero.
_FLOOR = {torch.float32: 2.0 ** -150, torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPE_NAMES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown model dtype '{name}' (known: float32, float16, "
                         "bfloat16)") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class Path:
    """Which roundings an implementation makes beyond fp32 arithmetic."""

    rounds_p: bool
    rounds_kv: bool


@dataclass(frozen=True, slots=True)
class ErrorModel:
    sigmas: float
    unit_roundoff: dict[str, float]
    paths: dict[str, Path]

    def u(self, dtype: torch.dtype) -> float:
        return self.unit_roundoff[dtype_name(dtype)]

    def allowed(self, ref, dtype: torch.dtype, path: str,
                kv_cache_dtype: str = "auto") -> torch.Tensor:
        """Allowed |error| per element of ref.out (a ReferenceOutput) for an
        output in `dtype` computed the way `path` computes."""
        try:
            how = self.paths[path]
        except KeyError:
            raise ValueError(f"{SPEC_PATH}: no path '{path}' (known: "
                             f"{', '.join(self.paths)})") from None
        u_out, u32 = self.u(dtype), self.u(torch.float32)
        n = ref.num_keys[..., None]
        logits = ref.logit_scale[..., None]
        noise = u32 * (n.sqrt() + logits) * ref.mix
        if how.rounds_p:
            noise = noise + u_out * ref.spread
        if how.rounds_kv and kv_cache_dtype != "auto":
            noise = noise + u_out * (logits + 1.0) * ref.spread
        return u_out * ref.out.abs() + self.sigmas * noise + _FLOOR[dtype]

    def table(self, dtype: torch.dtype, num_keys: int, logit_scale: float = 10.0) -> dict:
        """The allowance's coefficients for a context of num_keys (for the spec's
        tolerance table): rtol on |o|, on M (fp32 sums), on R (rounded P)."""
        u32 = self.u(torch.float32)
        return {"rtol": self.u(dtype),
                "per_mix": self.sigmas * u32 * (math.sqrt(num_keys) + logit_scale),
                "per_spread": self.sigmas * self.u(dtype)}


@lru_cache(maxsize=4)
def load_error_model(path: str = SPEC_PATH) -> ErrorModel:
    import yaml

    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    try:
        return ErrorModel(
            float(doc["sigmas"]),
            {k: float(v) for k, v in doc["unit_roundoff"].items()},
            {k: Path(bool(v["rounds_p"]), bool(v["rounds_kv"]))
             for k, v in doc["paths"].items()})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad error model: {e}") from None


def impl_path() -> str:
    """How impl's kernels compute here: interpreted (fp32 throughout) or compiled."""
    from impl.kernels import triton_mode

    return "impl_interpreted" if triton_mode.INTERPRETED else "impl_compiled"


def allowed(ref, dtype: torch.dtype, *paths: str, kv_cache_dtype: str = "auto"
            ) -> torch.Tensor:
    """The allowance of comparing outputs of `paths` with each other (two
    paths) or with the reference (one): their allowances add."""
    model = load_error_model()
    total = model.allowed(ref, dtype, paths[0], kv_cache_dtype)
    for p in paths[1:]:
        total = total + model.allowed(ref, dtype, p, kv_cache_dtype)
    return total
