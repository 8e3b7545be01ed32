"""What the invariants on vLLM's pool cost: the same seeded workload in
lockstep on vLLM and impl, with and without VllmBackend(check=True),
alternating runs in one process; the ratio per event (target <= 1.5)."""

import time

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.backends.vllm_backend import VllmBackend, installed_vllm_profile
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.sources.workload import SchedulerWorkload, WorkloadSpec

pytest.importorskip("vllm")

CONFIG = CacheConfig(num_blocks=256, groups=(GroupConfig(16),))


def _seconds_per_event(check: bool) -> float:
    profile = installed_vllm_profile()
    spec = WorkloadSpec(seed=3, num_requests=60)
    backends = [VllmBackend(CONFIG, profile, check=check), ImplBackend(CONFIG, profile)]
    t0 = time.perf_counter()
    result = run_lockstep(SchedulerWorkload(spec, profile, CONFIG.num_blocks).events(), backends)
    assert result.failure is None
    return (time.perf_counter() - t0) / result.num_events


def measure(runs: int = 3) -> dict:
    plain, checked = [], []
    for _ in range(runs):
        plain.append(_seconds_per_event(False))
        checked.append(_seconds_per_event(True))
    return {"ratio": min(checked) / min(plain), "plain_us": min(plain) * 1e6,
            "checked_us": min(checked) * 1e6}


@pytest.mark.benchmark(group="vllm-oracles")
def test_vllm_invariants_cost_per_event(benchmark):
    r = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(r)
    assert r["ratio"] <= 1.5, r
