"""The vLLM adapter: version detection and refusal, and process-global state."""

import sys

import pytest

from harness.backends.vllm_backend import (
    EnvironmentProblem,
    VllmBackend,
    installed_vllm_profile,
)
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest
from impl.profiles import get_profile, supported_versions

pytestmark = pytest.mark.vllm


def test_installed_vllm_is_the_reference():
    assert installed_vllm_profile().name == "0.32"


def test_version_without_profile_is_an_environment_problem(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.9.2")
    with pytest.raises(EnvironmentProblem,
                       match=rf"0.9.2 has no profile \(supported: {supported_versions()}\)"):
        VllmBackend(CacheConfig(num_blocks=4))


def test_missing_vllm_is_an_environment_problem(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EnvironmentProblem, match="vLLM is not installed"):
        installed_vllm_profile()


def test_trace_for_another_version_is_refused():
    with pytest.raises(EnvironmentProblem, match="wants vLLM 0.17 but vLLM 0.32"):
        VllmBackend(CacheConfig(num_blocks=4), get_profile("0.17.1"))


def test_backends_with_different_seeds_do_not_share_none_hash():
    cfg = lambda seed: CacheConfig(num_blocks=4, groups=(GroupConfig(4),), hash_seed=seed)  # noqa: E731
    a, b = VllmBackend(cfg("1")), VllmBackend(cfg("2"))
    ha = a.run(AddRequest("r", [1, 2, 3, 4]))
    hb = b.run(AddRequest("r", [1, 2, 3, 4]))
    assert ha != hb
    # a again, after b re-seeded vLLM's global: still a's own seed.
    assert a.run(AddRequest("s", [1, 2, 3, 4])) == ha
