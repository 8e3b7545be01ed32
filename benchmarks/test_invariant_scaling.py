"""The invariant checker's cost per event as the pool grows (issue 16 item 3):
impl with its checker after every event, on pools of 10^3, 10^5 and 10^6
blocks running the very same calls (group `invariant-scaling`). The checker
works incrementally, so the bound is the same cost at every size (within
1.5x of the smallest pool); its one full check, when it first sees the
manager, is made before the clock starts.

As in test_scaling_and_fuzz.py the pool is frozen out of the garbage
collector once built, so that full collections do not charge the heap size
to whichever event triggers them.
"""

import gc

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.cache_config import CacheConfig, GroupConfig
from harness.events import Checkpoint
from harness.workload import SchedulerWorkload, WorkloadSpec, drive
from impl.profiles import get_profile

P = get_profile("0.32")
# Few requests at a time: the pool never fills, so every size runs the same calls.
SPEC = WorkloadSpec(seed=3, block_size=16, num_requests=150, max_running=8, max_waiting=8)


def _config(num_blocks: int) -> CacheConfig:
    return CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(16),),
                       enable_kv_cache_events=False)


@pytest.fixture(scope="module")
def events():
    pairs = list(drive(SchedulerWorkload(SPEC, P, 1000).events(),
                       ImplBackend(_config(1000), P).run))
    assert not any("refused" in a for e, a in pairs if e.kind == "allocate")
    return [e for e, _ in pairs if not isinstance(e, Checkpoint)]


@pytest.mark.benchmark(group="invariant-scaling")
@pytest.mark.parametrize("num_blocks", [10**3, 10**5, 10**6])
def test_checked_events_at_pool_size(benchmark, events, num_blocks):
    config = _config(num_blocks)

    def setup():
        gc.unfreeze()
        gc.collect()
        backend = ImplBackend(config, P, check=True)
        backend.checker.check(backend.manager)  # the one full check
        gc.freeze()
        return (backend.run,), {}

    def run_all(run):
        for e in events:
            run(e)

    try:
        benchmark.pedantic(run_all, setup=setup, rounds=5, warmup_rounds=1)
    finally:
        gc.unfreeze()
    benchmark.extra_info["events"] = len(events)
    benchmark.extra_info["events_per_s"] = len(events) / benchmark.stats.stats.median
    benchmark.extra_info["us_per_event"] = benchmark.stats.stats.median / len(events) * 1e6
