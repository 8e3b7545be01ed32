"""Triton kernels of the KV cache's tensor side (vLLM: csrc/cache_kernels,
the Triton unified attention), plus block swapping between devices.

Importing this package picks how Triton runs (impl/kernels/triton_mode.py):
compiled on a CUDA GPU, interpreted otherwise.
"""

from impl.kernels import triton_mode  # noqa: F401  (first: decides interpretation)
