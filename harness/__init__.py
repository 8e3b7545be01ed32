"""kvconform's harness (specs/ARCHITECTURE.md)."""

# Triton must know whether it is interpreted before it is first imported:
# imported earlier (vLLM's sizing code and torch's inductor import it), every
# kernel defined after it fails when it runs under the interpreter. So the
# choice impl/kernels/triton_mode.py makes is made here, before any harness
# module can import vLLM.
from impl.kernels import triton_mode as _triton_mode  # noqa: F401
