"""The live conformance run: scenarios and seeded workloads, impl vs installed vLLM.

Every event runs on vLLM's KVCacheManager and on impl's, and their answers must
be equal (block ids, hit tokens, free-queue order, KV events, stats); scenario
steps must also match their hand-derived expectations.

    python -m harness.conform        (what `make conform` runs)
Exit codes: 0 conformant, 1 a divergence, 3 vLLM missing / unsupported version.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.backends.impl_backend import ImplBackend
from harness.backends.vllm_backend import EnvironmentProblem, VllmBackend, installed_vllm_profile
from harness.cache_config import CacheConfig, GroupConfig
from harness.lockstep import run_lockstep
from harness.scenarios import SCENARIOS, Scenario, check_expected
from harness.workload import SchedulerWorkload, WorkloadSpec
from impl.profiles import VersionProfile

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


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


WORKLOADS: list[WorkloadCase] = [
    _wl("workload-tight-pool", seed=1, num_blocks=24),
    _wl("workload-medium-pool", seed=2, num_blocks=64),
    _wl("workload-sha256_cbor", seed=3, num_blocks=40, block_size=32, hash_algo="sha256_cbor"),
    _wl("workload-xxhash", seed=4, num_blocks=48, hash_algo="xxhash"),
    _wl("workload-no-caching", seed=5, num_blocks=32, enable_caching=False),
]


@dataclass(slots=True)
class CaseResult:
    name: str
    num_events: int
    seconds: float
    problem: str | None  # None = conformant


def run_scenario(scenario: Scenario, profile: VersionProfile) -> CaseResult:
    t0 = time.perf_counter()
    backends = [VllmBackend(scenario.config, profile), ImplBackend(scenario.config, profile,
                                                                   check=True)]
    for i, (event, expected) in enumerate(scenario.steps):
        answers = {b.name: b.run(event) for b in backends}
        for name, answer in answers.items():
            err = check_expected(answer, expected)
            if err:
                return CaseResult(scenario.name, i + 1, time.perf_counter() - t0,
                                  f"#{i} {event.kind}: {name} {err}")
        if answers["vllm"] != answers["impl"]:
            return CaseResult(scenario.name, i + 1, time.perf_counter() - t0,
                              f"#{i} {event.kind}: vllm {answers['vllm']} != impl "
                              f"{answers['impl']}")
    return CaseResult(scenario.name, len(scenario.steps), time.perf_counter() - t0, None)


def run_workload(case: WorkloadCase, profile: VersionProfile) -> CaseResult:
    t0 = time.perf_counter()
    stream = SchedulerWorkload(case.spec, profile, case.config.num_blocks).events()
    result = run_lockstep(
        stream, [VllmBackend(case.config, profile), ImplBackend(case.config, profile)]
    )
    problem = None
    if result.divergence is not None:
        problem = result.divergence.describe()
    return CaseResult(case.name, result.num_events, time.perf_counter() - t0, problem)


def format_table(results: list[CaseResult]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'case':<{width}}  {'events':>7}  {'seconds':>7}  result",
             f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 10}"]
    for r in results:
        verdict = "conformant" if r.problem is None else "DIVERGED"
        lines.append(f"{r.name:<{width}}  {r.num_events:>7}  {r.seconds:>7.2f}  {verdict}")
    total = sum(r.num_events for r in results)
    failed = sum(r.problem is not None for r in results)
    lines.append(f"{len(results)} cases, {total} events compared live, "
                 f"{failed} diverged")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        profile = installed_vllm_profile()
    except EnvironmentProblem as e:
        print(f"kvconform: {e}", file=sys.stderr)
        return EXIT_ENV
    cases: list[tuple[str, Callable[[], CaseResult]]] = [
        (name, lambda make=make: run_scenario(make(), profile))
        for name, make in SCENARIOS.items()
    ] + [(c.name, lambda c=c: run_workload(c, profile)) for c in WORKLOADS]

    from tqdm import tqdm

    results = []
    bar = tqdm(cases, desc="conform", unit="case", disable=not sys.stderr.isatty())
    for name, run in bar:
        bar.set_postfix_str(name)
        results.append(run())
    print(format_table(results))
    for r in results:
        if r.problem is not None:
            print(f"\n{r.name}: first divergence\n{r.problem}")
    return EXIT_DIVERGED if any(r.problem for r in results) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
