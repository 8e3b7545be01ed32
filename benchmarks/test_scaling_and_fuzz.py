"""impl operations per second as the pool grows (an operation must cost the same
with 10^3, 10^5 or 10^6 blocks), with the invariant checker after every event
too (issue 16 item 3: it works incrementally, so the same bound holds; its one
full check, when it first sees the manager, is made before the clock starts),
and differential fuzzing throughput.

The pool's block objects are frozen out of the garbage collector after they are
built (gc.freeze, as vLLM does after start-up): otherwise Python's full
collections, which walk every live object, would charge the size of the heap
to whichever operation happens to trigger them.
"""

import gc

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.cache_config import CacheConfig, GroupConfig
from harness.events import Checkpoint
from harness.workload import SchedulerWorkload, WorkloadSpec, drive
from impl.profiles import get_profile

P = get_profile("0.32")
# Few requests at a time: the pool never fills, so the very same calls run
# whatever its size.
SPEC = WorkloadSpec(seed=3, block_size=16, num_requests=150, max_running=8, max_waiting=8)


@pytest.fixture(scope="module")
def events():
    pairs = list(drive(SchedulerWorkload(SPEC, P, 1000).events(),
                       ImplBackend(_config(1000), P).run))
    assert not any("refused" in a for e, a in pairs if e.kind == "allocate")
    return [e for e, _ in pairs if not isinstance(e, Checkpoint)]


def _config(num_blocks: int) -> CacheConfig:
    return CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(16),),
                       enable_kv_cache_events=False)


def _time_all_events(benchmark, events, make_run) -> None:
    """Every event through a fresh backend each round; the backend (its pool)
    is built, and frozen out of the collector, before the clock starts."""
    def setup():
        gc.unfreeze()
        gc.collect()
        run = make_run()
        gc.freeze()
        return (run,), {}

    def run_all(run):
        for e in events:
            run(e)

    try:
        benchmark.pedantic(run_all, setup=setup, rounds=5, warmup_rounds=1)
    finally:
        gc.unfreeze()


@pytest.mark.benchmark(group="pool-scaling")
@pytest.mark.parametrize("num_blocks", [10**3, 10**5, 10**6])
def test_impl_ops_at_pool_size(benchmark, events, num_blocks):
    config = _config(num_blocks)
    _time_all_events(benchmark, events, lambda: ImplBackend(config, P).run)
    benchmark.extra_info["ops"] = len(events)
    benchmark.extra_info["ops_per_s"] = len(events) / benchmark.stats.stats.median


@pytest.mark.benchmark(group="invariant-scaling")
@pytest.mark.parametrize("num_blocks", [10**3, 10**5, 10**6])
def test_checked_events_at_pool_size(benchmark, events, num_blocks):
    config = _config(num_blocks)

    def checked():
        backend = ImplBackend(config, P, check=True)
        backend.checker.check(backend.manager)  # the one full check
        return backend.run

    _time_all_events(benchmark, events, checked)
    benchmark.extra_info["events"] = len(events)
    benchmark.extra_info["events_per_s"] = len(events) / benchmark.stats.stats.median
    benchmark.extra_info["us_per_event"] = benchmark.stats.stats.median / len(events) * 1e6


@pytest.mark.benchmark(group="fuzz-ops")
def test_fuzz_ops_per_second(benchmark, tmp_path):
    from harness.fuzz.campaign import fuzz

    result = benchmark.pedantic(fuzz, args=(P, 15.0, 0, str(tmp_path)), rounds=1, iterations=1)
    assert result.finding is None
    benchmark.extra_info["ops"] = result.ops
    benchmark.extra_info["ops_per_s"] = result.ops_per_s
    benchmark.extra_info["cases"] = result.cases
