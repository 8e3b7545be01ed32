"""impl operations per second as the pool grows (an operation must cost the same
with 10^3, 10^5 or 10^6 blocks), with the invariant checker after every event
too (issue 16 item 3: it works incrementally, so the same bound holds; its one
full check, when it first sees the manager, is made before the clock starts),
and kvconform diff's cost per event as the pool grows, with and without the
invariant checker (free-queue checkpoints are digests: O(1) at any size).

The pool's block objects are frozen out of the garbage collector after they are
built (gc.freeze, as vLLM does after start-up): otherwise Python's full
collections, which walk every live object, would charge the size of the heap
to whichever operation happens to trigger them.
"""

import gc
from pathlib import Path

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import Checkpoint
from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
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


# -- diff (impl + vLLM, a trace through check_trace) as the pool grows ------------------

POOL_SIZES = (10**3, 10**5, 10**6)
TRACES = Path(__file__).resolve().parents[1] / ".bench" / "traces"


def _pool_trace(events, num_blocks: int) -> str:
    """The scaling workload as a trace on a pool of num_blocks blocks, answers
    recorded by impl (cached). Its checkpoints take the free queue's digest;
    the final whole-queue checkpoint is left out (one O(pool) answer is not a
    per-event cost)."""
    from harness.trace import TraceWriter
    from harness.trace.codec import TraceHeader

    path = TRACES / f"pool-v1-{num_blocks}.jsonl"
    if not path.exists():
        TRACES.mkdir(parents=True, exist_ok=True)
        backend = ImplBackend(_config(num_blocks), P)
        with TraceWriter(str(path), TraceHeader("0.32.0", "scheduler", _config(num_blocks),
                                                "pool scaling")) as w:
            for e in events:
                w.write(e, backend.run(e))
    return str(path)


@pytest.fixture(scope="module")
def checked_events():
    """The scaling workload with its checkpoints (digests, counts, KV events)."""
    pairs = list(drive(SchedulerWorkload(SPEC, P, 1000).events(),
                       ImplBackend(_config(1000), P).run))
    return [e for e, _ in pairs[:-1]]


@pytest.mark.benchmark(group="diff-pool-scaling")
@pytest.mark.parametrize("invariants", [False, True], ids=["plain", "invariants"])
def test_diff_cost_per_event_at_pool_size(benchmark, checked_events, invariants):
    """kvconform diff's cost per event (reading, both backends, comparing),
    best of 3 rounds per pool size, sizes interleaved; must not grow with the
    pool (bound: 1.5x the smallest pool's), with or without impl's invariant
    checker."""
    from harness.sources.replay import check_trace

    paths = {n: _pool_trace(checked_events, n) for n in POOL_SIZES}
    best = {n: float("inf") for n in POOL_SIZES}
    for _ in range(3):
        for n, path in paths.items():
            o = check_trace(path, ["vllm", "impl"], check_invariants=invariants)
            assert o.exit_code == 0, o.error or o.divergence
            best[n] = min(best[n], o.run_seconds / o.num_events)
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info["events"] = len(checked_events)
    for n in POOL_SIZES:
        benchmark.extra_info[f"us_per_event_{n}"] = best[n] * 1e6
    benchmark.extra_info["growth_1e6_over_1e3"] = best[10**6] / best[10**3]
