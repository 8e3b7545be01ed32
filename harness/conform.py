"""The conformance run: every bundled trace and the seeded workloads.

- Each trace under traces/ recorded for the installed vLLM's version is diffed:
  impl and vLLM run side by side, their answers must be equal, equal to the
  recorded answers, and satisfy the hand-derived expectations. Traces of other
  versions are replayed on impl with their own profile.
- Each seeded workload runs impl and vLLM in lockstep: every answer, the free
  queue after every free and preemption, and the KV events must be identical.

    kvconform conform        (what `make conform` runs)
Exit codes: 0 conformant, 1 a divergence, 2 a bad trace, 3 vLLM missing or
unsupported.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.backends.impl_backend import ImplBackend
from harness.backends.vllm_backend import VllmBackend, installed_vllm_profile
from harness.cache_config import CacheConfig, GroupConfig
from harness.exit_codes import ExitCode, worst
from harness.lockstep import run_lockstep
from harness.replay import check_trace
from harness.report import format_failure
from harness.trace import find_traces
from harness.workload import SchedulerWorkload, WorkloadSpec
from impl.profiles import VersionProfile

TRACES_DIR = Path(__file__).resolve().parents[1] / "traces"


@dataclass(frozen=True, slots=True)
class WorkloadCase:
    name: str
    spec: WorkloadSpec
    config: CacheConfig


def _wl(name: str, seed: int, num_blocks: int, block_size: int = 16, **cfg) -> WorkloadCase:
    return WorkloadCase(
        name,
        WorkloadSpec(seed=seed, block_size=block_size),
        CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(block_size),), **cfg),
    )


def _hybrid(name: str, seed: int, num_blocks: int, groups: tuple[GroupConfig, ...],
            **cfg) -> WorkloadCase:
    """A workload over several groups (or another kind). The workload keeps a
    request within num_blocks blocks of 16 tokens; the pool is sized so that a
    request fits in every group at once."""
    return WorkloadCase(
        name,
        WorkloadSpec(seed=seed, block_size=16),
        CacheConfig(num_blocks=num_blocks, groups=groups, **cfg),
    )


_FULL = GroupConfig(16)
_WINDOW = GroupConfig(16, "sliding_window", sliding_window=40)

WORKLOADS: list[WorkloadCase] = [
    _wl("workload-tight-pool", seed=1, num_blocks=24),
    _wl("workload-medium-pool", seed=2, num_blocks=64),
    _wl("workload-sha256_cbor", seed=3, num_blocks=40, block_size=32, hash_algo="sha256_cbor"),
    _wl("workload-xxhash", seed=4, num_blocks=48, hash_algo="xxhash"),
    _wl("workload-no-caching", seed=5, num_blocks=32, enable_caching=False),
    _hybrid("workload-sliding-window", 6, 40, (_WINDOW,)),
    _hybrid("workload-gemma-hybrid", 7, 100, (_FULL, _WINDOW, _WINDOW)),
    _hybrid("workload-hybrid-block-sizes", 8, 120,
            (_FULL, GroupConfig(32, "sliding_window", sliding_window=24))),
    _hybrid("workload-llama4-hybrid", 9, 100,
            (_FULL, GroupConfig(16, "chunked_local_attention", attention_chunk_size=64))),
    _hybrid("workload-mla-dcp", 10, 32, (GroupConfig(16, "mla_attention"),), dcp_world_size=2),
    _hybrid("workload-hybrid-no-caching", 11, 100, (_FULL, _WINDOW), enable_caching=False),
]


@dataclass(slots=True)
class CaseResult:
    name: str
    mode: str
    num_events: int
    seconds: float
    problem: str | None  # None = conformant
    exit_code: ExitCode = ExitCode.OK


def run_trace(path: str) -> CaseResult:
    name = str(Path(path).relative_to(TRACES_DIR)) if path.startswith(str(TRACES_DIR)) else path
    o, mode = check_trace(path, ["vllm", "impl"], explicit=False), "diff"
    if o.skipped:  # recorded for another vLLM version: impl replays it
        o, mode = check_trace(path, ["impl"]), f"replay {o.profile}"
    problem = None
    if o.error is not None:
        problem = str(o.error)
    elif o.divergence is not None:
        problem = format_failure(o.divergence, o.context)
    return CaseResult(name, mode, o.num_events, o.seconds, problem, o.exit_code)


def run_workload(case: WorkloadCase, profile: VersionProfile) -> CaseResult:
    t0 = time.perf_counter()
    stream = SchedulerWorkload(case.spec, profile, case.config.num_blocks).events()
    result = run_lockstep(
        stream, [VllmBackend(case.config, profile), ImplBackend(case.config, profile)]
    )
    f = result.failure
    return CaseResult(case.name, "lockstep", result.num_events, time.perf_counter() - t0,
                      None if f is None else format_failure(f),
                      ExitCode.OK if f is None else f.exit_code)


def format_table(results: list[CaseResult]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'case':<{width}}  {'mode':<12}  {'events':>7}  {'seconds':>7}  result",
             f"{'-' * width}  {'-' * 12}  {'-' * 7}  {'-' * 7}  {'-' * 10}"]
    for r in results:
        verdict = "conformant" if r.problem is None else (
            "DIVERGED" if r.exit_code == ExitCode.DIVERGED else "ERROR")
        lines.append(f"{r.name:<{width}}  {r.mode:<12}  {r.num_events:>7}  {r.seconds:>7.2f}  "
                     f"{verdict}")
    total = sum(r.num_events for r in results)
    failed = sum(r.problem is not None for r in results)
    lines.append(f"{len(results)} cases, {total} events checked, {failed} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from harness.cli_support import check_vllm

    if (code := check_vllm()) is not None:
        return code
    profile = installed_vllm_profile()
    cases: list[tuple[str, Callable[[], CaseResult]]] = [
        (p, lambda p=p: run_trace(p)) for p in find_traces([str(TRACES_DIR)])
    ] + [(c.name, lambda c=c: run_workload(c, profile)) for c in WORKLOADS]

    from tqdm import tqdm

    results = []
    bar = tqdm(cases, desc="conform", unit="case", disable=not sys.stderr.isatty())
    for name, run in bar:
        bar.set_postfix_str(Path(name).name)
        results.append(run())
    print(format_table(results))
    for r in results:
        if r.problem is not None:
            print(f"\n{r.name}:\n{r.problem}")
    return worst(r.exit_code for r in results)


if __name__ == "__main__":
    sys.exit(main())
