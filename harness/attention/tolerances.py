"""Attention-output tolerances per dtype, read from specs/attention_tolerances.yaml.

Two sets: `reference` (impl and vLLM against the float64 reference) and `vllm`
(impl against vLLM's op: both rounded to the dtype, so up to about one unit in
the last place each apart).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch

SPEC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "specs",
                         "attention_tolerances.yaml")
AGAINST = ("reference", "vllm")

_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


@dataclass(frozen=True, slots=True)
class Tolerance:
    atol: float
    rtol: float


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPE_NAMES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown model dtype '{name}' (known: float32, float16, "
                         "bfloat16)") from None


def dtype_key(dtype: torch.dtype, kv_cache_dtype: str = "auto") -> str:
    """The key of a dtype (and fp8 KV cache) in the spec, e.g. "bfloat16" or
    "bfloat16+fp8_e4m3"."""
    name = str(dtype).removeprefix("torch.")
    if kv_cache_dtype == "auto":
        return name
    return f"{name}+{'fp8_e4m3' if kv_cache_dtype == 'fp8' else kv_cache_dtype}"


@lru_cache(maxsize=4)
def load_tolerances(path: str = SPEC_PATH) -> dict[str, dict[str, Tolerance]]:
    import yaml

    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    out: dict[str, dict[str, Tolerance]] = {}
    for against in AGAINST:
        table = doc.get(against)
        if not isinstance(table, dict):
            raise ValueError(f"{path}: missing table '{against}'")
        out[against] = {key: Tolerance(float(v["atol"]), float(v["rtol"]))
                        for key, v in table.items()}
    return out


def tolerance(dtype: torch.dtype, against: str = "reference",
              kv_cache_dtype: str = "auto") -> Tolerance:
    table = load_tolerances()[against]
    key = dtype_key(dtype, kv_cache_dtype)
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"{SPEC_PATH}: no '{against}' tolerance for {key}") from None
