"""What the oracles on vLLM cost: the same seeded workload in lockstep on
vLLM and impl, without the oracles, with the invariants on vLLM's pool
alone, and with VllmBackend(check=True) whole (the invariants and the KV
events reconciled with the pool, specs/ORACLES.md), alternating runs in one
process; the ratios per event (target <= 1.5 for the whole)."""

import time

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.backends.vllm_backend import VllmBackend, installed_vllm_profile
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.sources.workload import SchedulerWorkload, WorkloadSpec

pytest.importorskip("vllm")

CONFIG = CacheConfig(num_blocks=256, groups=(GroupConfig(16),))


def _seconds_per_event(check: bool, reconcile: bool = True) -> float:
    profile = installed_vllm_profile()
    spec = WorkloadSpec(seed=3, num_requests=60)
    vllm = VllmBackend(CONFIG, profile, check=check)
    if check and not reconcile:
        vllm.reconciler = None
    elif check:
        assert vllm.reconciler is not None  # the config publishes KV events
    backends = [vllm, ImplBackend(CONFIG, profile)]
    t0 = time.perf_counter()
    result = run_lockstep(SchedulerWorkload(spec, profile, CONFIG.num_blocks).events(), backends)
    assert result.failure is None
    return (time.perf_counter() - t0) / result.num_events


def measure(runs: int = 3) -> dict:
    plain, invariants, checked = [], [], []
    for _ in range(runs):
        plain.append(_seconds_per_event(False))
        invariants.append(_seconds_per_event(True, reconcile=False))
        checked.append(_seconds_per_event(True))
    return {"ratio": min(checked) / min(plain),
            "invariants_ratio": min(invariants) / min(plain),
            "plain_us": min(plain) * 1e6, "invariants_us": min(invariants) * 1e6,
            "checked_us": min(checked) * 1e6}


@pytest.mark.benchmark(group="vllm-oracles")
def test_vllm_invariants_cost_per_event(benchmark):
    r = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(r)
    assert r["ratio"] <= 1.5, r
