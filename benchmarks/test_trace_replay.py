"""Trace throughput and streaming memory.

- replay events/s (impl) and diff events/s (impl and vLLM, each in a process
  of its own, recorded answers checked) on a 100k-event workload trace, each
  against baselines measured in the same run (bounds in ci/bench-table):
  replay against impl alone on the same events (at least 40%); the diff
  against the same diff in one process, both backends in turn (at least 1.3x),
  and against the slower of its backends alone (at least 75%: the diff is
  bounded by the slower backend, not by their sum). The serial bound (impl
  alone + vLLM alone, one after the other) is reported beside its ceiling,
  1 + impl's time / vLLM's: no diff can beat the slower backend alone;
- peak RSS of replaying 100k and 1M events, each in a fresh process: streaming
  replay must stay flat as the trace grows.

Rates are the best of a few rounds: on a machine shared with other work the
best round is the one least disturbed.
"""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.sources.replay import BACKENDS, check_trace
from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
from harness.trace import TraceWriter
from harness.trace.codec import TraceHeader
from impl.profiles import get_profile

P = get_profile("0.32")
CONFIG = CacheConfig(num_blocks=64, groups=(GroupConfig(16),))
CACHE = Path(__file__).resolve().parents[1] / ".bench" / "traces"


def workload_trace(num_events: int) -> str:
    """A recorded scheduler-workload trace of about num_events events (cached;
    v2: free-queue digests after frees)."""
    path = CACHE / f"workload-v2-{num_events}.jsonl"
    if path.exists():
        return str(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    # ~85 events per request with this spec.
    spec = WorkloadSpec(seed=7, block_size=16, num_requests=num_events // 85 + 1)
    backend = ImplBackend(CONFIG, P)
    header = TraceHeader("0.32.0", "scheduler", CONFIG, "benchmark workload")
    with TraceWriter(str(path), header) as w:
        for event, answer in drive(SchedulerWorkload(spec, P, CONFIG.num_blocks).events(),
                                   backend.run):
            w.write(event, answer)
    return str(path)


def _events_in(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f) - 1


ROUNDS = 3


def _best(run) -> tuple[float, float]:
    """The best round's (wall seconds, CPU seconds): on a shared machine the
    CPU time says what the work costs, the wall time what a user waits."""
    rounds = [run() for _ in range(ROUNDS)]
    return min(w for w, _ in rounds), min(c for _, c in rounds)


def _alone(make, events) -> tuple[float, float]:
    """One backend, built as the diff builds it (vLLM with its invariant
    oracle), running the events by itself."""
    header = TraceHeader("0.32.0", "scheduler", CONFIG, "")

    def run():
        backend = make(header, P)
        t0, c0 = time.perf_counter(), time.process_time()
        for e in events:
            backend.run(e)
        return time.perf_counter() - t0, time.process_time() - c0
    return _best(run)


def _one_process(path: str, backends: list[str]) -> tuple[float, float]:
    """_traced with both backends in this process, in turn."""
    from harness.sources import side_by_side

    beside = side_by_side.available
    side_by_side.available = lambda: False
    try:
        return _traced(path, backends)
    finally:
        side_by_side.available = beside


def _traced(path: str, backends: list[str]) -> tuple[float, float]:
    """check_trace on the events (reading, checking, running). Its CPU time
    is that of the busier of its processes (this one, and the diff's forked
    one where it has one: what it takes on cores of its own, whatever else
    the machine runs), and includes opening the trace and building the
    backends (64 blocks)."""
    def run():
        c0, k0 = time.process_time(), _children_cpu()
        outcome = check_trace(path, backends)
        cpu = max(time.process_time() - c0, _children_cpu() - k0)
        assert outcome.exit_code == 0, outcome.error or outcome.divergence
        return outcome.run_seconds, cpu
    return _best(run)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.benchmark(group="trace-bounds")
def test_replay_and_diff_against_their_bounds(benchmark):
    path = workload_trace(100_000)
    events = [r.event for r in open_trace_records(path)]
    n = len(events)
    seconds = {
        "impl_alone": _alone(BACKENDS["impl"], events),
        "vllm_alone": _alone(BACKENDS["vllm"], events),
        "replay": _traced(path, ["impl"]),
        "diff": _traced(path, ["vllm", "impl"]),
        "diff_one_process": _one_process(path, ["vllm", "impl"]),
    }
    benchmark.pedantic(lambda: None, rounds=1)
    info = benchmark.extra_info
    info["events"] = n
    for clock, i, unit in (("wall", 0, "events_per_s"), ("cpu", 1, "events_per_cpu_s")):
        rates = {k: n / v[i] for k, v in seconds.items()}
        serial = n / (seconds["impl_alone"][i] + seconds["vllm_alone"][i])
        info.update({f"{k}_{unit}": v for k, v in rates.items()})
        info[f"serial_bound_{unit}"] = serial
        suffix = "" if clock == "wall" else "_cpu"
        info[f"replay_share_of_impl{suffix}"] = rates["replay"] / rates["impl_alone"]
        info[f"diff_share_of_serial_bound{suffix}"] = rates["diff"] / serial
        alone = seconds["impl_alone"][i], seconds["vllm_alone"][i]
        info[f"serial_bound_ceiling{suffix}"] = sum(alone) / max(alone)
        info[f"diff_over_one_process{suffix}"] = rates["diff"] / rates["diff_one_process"]
        info[f"diff_share_of_slower_alone{suffix}"] = rates["diff"] / min(
            rates["impl_alone"], rates["vllm_alone"])


# VmHWM is the peak RSS of this address space; unlike ru_maxrss it does not
# carry over the parent's peak across fork + exec.
_CHILD = """
import json, sys
from harness.sources.replay import BACKENDS, check_trace
o = check_trace(sys.argv[1], ["impl"])
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"exit": o.exit_code, "events": o.num_events, "seconds": o.run_seconds,
                  "peak_rss_kb": hwm}))
"""


@pytest.mark.benchmark(group="trace-memory")
def test_streaming_replay_peak_rss(benchmark):
    rows = {}
    for n in (100_000, 1_000_000):
        path = workload_trace(n)
        out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                             text=True, check=True, env={**os.environ})
        rows[n] = json.loads(out.stdout)
        assert rows[n]["exit"] == 0 and rows[n]["events"] == _events_in(path)
    small, large = rows[100_000]["peak_rss_kb"], rows[1_000_000]["peak_rss_kb"]
    benchmark.extra_info.update({f"peak_rss_mb_{n // 1000}k": r["peak_rss_kb"] / 1024
                                 for n, r in rows.items()})
    benchmark.extra_info.update({f"events_{n // 1000}k": r["events"] for n, r in rows.items()})
    benchmark.extra_info["rss_growth_ratio"] = large / small
    benchmark.pedantic(lambda: None, rounds=1)
    # Ten times the events may not cost anything like ten times the memory.
    assert large < small * 1.25, rows


@pytest.mark.benchmark(group="event-step")
def test_event_step_overhead(benchmark):
    """What harness/lockstep.run_event adds to the backend's own work: the
    same 100k events through run_lockstep and straight through backend.run
    (fresh impl backends, the same answers), in the same run. The step
    allocates nothing when the answers agree, so the ratio stays near 1."""
    import time

    from harness.backends.lockstep import run_lockstep

    events = [r.event for r in open_trace_records(workload_trace(100_000))]

    def direct() -> float:
        backend = ImplBackend(CONFIG, P)
        t0 = time.perf_counter()
        for e in events:
            backend.run(e)
        return time.perf_counter() - t0

    def stepped() -> float:
        backend = ImplBackend(CONFIG, P)
        t0 = time.perf_counter()
        result = run_lockstep(events, [backend])
        seconds = time.perf_counter() - t0
        assert result.failure is None and result.num_events == len(events)
        return seconds

    best = {"direct": min(direct() for _ in range(3)), "stepped": min(stepped() for _ in range(3))}
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info["events"] = len(events)
    benchmark.extra_info["direct_events_per_s"] = len(events) / best["direct"]
    benchmark.extra_info["stepped_events_per_s"] = len(events) / best["stepped"]
    benchmark.extra_info["step_overhead_ratio"] = best["stepped"] / best["direct"]


def open_trace_records(path: str):
    from harness.trace import open_trace

    return list(open_trace(path).records)
