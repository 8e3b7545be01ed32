"""vLLM 0.17.1 through its overlay (ci/vllm-overlay.sh 0.17.1) on this venv.

The overlay has no compiled ops (its wheel is a CUDA build), so 0.17.1 cannot
detect a CPU platform by itself; building a Scheduler
needs one. This sets the CPU platform with kernel loading off: enough for the
scheduler-driven capture, which runs no model.
"""

from __future__ import annotations


def use_cpu_platform_without_kernels() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels = classmethod(lambda cls: None)
    platforms._current_platform = CpuPlatform()
