"""How Triton runs here: compiled on a CUDA GPU, interpreted everywhere else.

Triton picks the interpreter when a kernel is *defined* (`@triton.jit` reads
TRITON_INTERPRET), so this module must be imported before any kernel module;
every kernel module in this package imports it first. Without a CUDA device
compiled Triton cannot launch at all, so the interpreter is then the only way to
run the kernels; an explicit TRITON_INTERPRET (e.g. 0 from ci/gpu_check.py, or
1 to debug on a GPU) always wins.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# The interpreter computes bf16 arithmetic wrongly and runs tl.dot on numpy, so
# kernels upcast to fp32 before any math when this is true (see rounding.py for
# the casts down).
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
