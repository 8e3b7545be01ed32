"""A fuzzing campaign: draw cases until the budget (seconds, or cases) is spent or
a case fails; shrink the finding and write it as a trace before reporting it.

Case n of seed s always draws the same program, so the same seed and config
give the same calls, the same finding and a byte-identical trace file; cases
first_case.. of a seed can run anywhere (harness/fuzz/distributed.py splits a
campaign over a Ray cluster that way).

The budget counts fuzzing only: vLLM's one-time import and the first backends
built (seconds on a quiet machine, tens under load) are the campaign's
start-up, timed and reported apart. After it the objects it left are frozen
out of the garbage collector (as vLLM does after its own start-up), so that the
collections the cases trigger walk only what the cases made. A campaign that
ends its time with fewer than MIN_CASES cases and no finding checked too
little to mean anything: `too_few_cases` says so, and the CLI and the gate
report it as such, never as a plain pass.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.backends.impl_backend import ImplBackend
from harness.backends.vllm_backend import (
    EnvironmentProblem,
    VllmBackend,
    installed_vllm_version,
)
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.compare import Failure, FailureKind
from harness.core.events import Checkpoint
from harness.fuzz.actions import Action
from harness.fuzz.driver import Driver, FuzzRun
from harness.fuzz.faults import inject
from harness.fuzz.generate import FuzzConfig, draw_case
from harness.fuzz.shrink import shrink
from harness.trace import TraceWriter
from harness.trace.codec import TraceHeader
from impl.profiles import VersionProfile


@dataclass(slots=True)
class Finding:
    case: int
    path: str
    num_calls: int  # calls in the shrunk trace
    num_calls_before: int
    failure: Failure


# Fewer cases than this in a campaign's whole time, and no finding: too few to
# mean anything (a case is at most --max-ops calls on a fresh pool).
MIN_CASES = 100


@dataclass(slots=True)
class CampaignTotals:
    """What any campaign counts (one process's, or a cluster's)."""

    cases: int = 0
    ops: int = 0
    seconds: float = 0.0  # fuzzing only
    states: set = field(default_factory=set)
    startup_seconds: float = 0.0  # vLLM's import and the first backends, not in `seconds`
    # The campaign stopped at max_cases, the budget it was given in cases.
    stopped_at_max_cases: bool = False
    # Cases whose config both backends refuse (the release builds no such model).
    refused: int = 0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def found_something(self) -> bool:
        raise NotImplementedError

    @property
    def too_few_cases(self) -> bool:
        """Time ran out before MIN_CASES cases, with nothing found."""
        return (not self.found_something() and self.cases < MIN_CASES
                and not self.stopped_at_max_cases)


@dataclass(slots=True)
class CampaignResult(CampaignTotals):
    seed: int = 0
    finding: Finding | None = None

    def found_something(self) -> bool:
        return self.finding is not None


def too_few_cases_warning(result: CampaignResult) -> str:
    return (f"only {result.cases} cases in {result.seconds:.1f}s, no divergence: too few to "
            f"mean anything (a campaign needs at least {MIN_CASES}); the machine is too slow "
            "or too loaded for this budget: give it more --seconds")


def start_up(profile: VersionProfile) -> float:
    """Import vLLM and build one pair of backends (the one-time cost every
    campaign pays first), then freeze what exists out of the garbage
    collector; the seconds it took."""
    t0 = time.perf_counter()
    run_case(CacheConfig(num_blocks=4, groups=(GroupConfig(1),)), [], profile)
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t0


def run_case(config: CacheConfig, actions: list[Action], profile: VersionProfile) -> FuzzRun:
    backends = build_backends(config, profile)
    if isinstance(backends, FuzzRun):
        return backends
    return Driver(config, profile, backends).execute(actions)


def build_backends(config: CacheConfig, profile: VersionProfile) -> list | FuzzRun:
    """vLLM's and impl's backends for a case; when a config cannot be built,
    a FuzzRun saying so: both refuse it (the release does not take such a
    model: the case is skipped), or only one does (a divergence)."""
    built, refusals = [], {}
    for name, make in (("vllm", lambda: VllmBackend(config, profile, check=True)),
                       ("impl", lambda: ImplBackend(config, profile, check=True))):
        try:
            built.append(make())
        except EnvironmentProblem:
            raise
        except Exception as e:  # noqa: BLE001 - a backend refusing the config is an answer
            refusals[name] = f"refuses this config: {type(e).__name__}: {e}"
    if not refusals:
        return built
    run = FuzzRun()
    if len(refusals) == 2:
        run.refused = refusals["vllm"]
        return run
    answers = {n: refusals.get(n, "builds it") for n in ("vllm", "impl")}
    event = Checkpoint(fields=())
    run.failure = Failure(FailureKind.DIVERGED, event, answers, "cache")
    run.events.append((event, None))
    return run


def _signature(run: FuzzRun) -> tuple:
    """What a shrunk case must keep to count as the same failure."""
    f = run.failure
    return f.event.kind, f.kind


def case_rng(seed: int, case: int) -> random.Random:
    return random.Random(f"kvconform-fuzz:{seed}:{case}")


def fuzz(
    profile: VersionProfile,
    seconds: float,
    seed: int,
    out_dir: str,
    max_ops: int = 40,
    fuzz_config: FuzzConfig | None = None,
    fault: str | None = None,
    report: Callable[[CampaignResult], None] | None = None,
    max_cases: int | None = None,
    first_case: int = 0,
    started: bool = False,
    min_cases: int = 0,
) -> CampaignResult:
    """Draw cases first_case, first_case + 1, ... until `seconds` have passed,
    `max_cases` cases ran (tests bound a campaign by cases: the same work on a
    loaded machine), or a case fails. The clock starts after start_up (unless
    `started`: the caller ran it). `min_cases`: a floor the time budget does
    not cut short (the gate's slices: a campaign of a few cases means nothing,
    so on a slow machine the slice takes longer instead)."""
    fc = fuzz_config or FuzzConfig()
    result = CampaignResult(seed=seed)
    if not started:
        result.startup_seconds = start_up(profile)
    try:
        t0 = time.perf_counter()
        with inject(fault):
            while time.perf_counter() - t0 < seconds or result.cases < min_cases:
                if max_cases is not None and result.cases >= max_cases:
                    result.stopped_at_max_cases = True
                    break
                case = first_case + result.cases
                config, actions = draw_case(case_rng(seed, case), fc, max_ops,
                                            profile.hash_lookahead_tokens)
                run = run_case(config, actions, profile)
                result.cases += 1
                if run.refused is not None:
                    result.refused += 1
                result.ops += len(run.events)
                result.states |= run.signatures
                result.seconds = time.perf_counter() - t0
                if report is not None:
                    report(result)
                if run.failed:
                    result.finding = _write_finding(profile, config, actions, run, seed,
                                                    case, out_dir, fault)
                    break
        result.seconds = time.perf_counter() - t0
    finally:
        if not started:
            gc.unfreeze()
    return result


def _write_finding(profile: VersionProfile, config: CacheConfig, actions: list[Action],
                   run: FuzzRun, seed: int, case: int, out_dir: str,
                   fault: str | None) -> Finding:
    want = _signature(run)

    def still_fails(c: CacheConfig, a: list[Action]) -> bool:
        try:
            r = run_case(c, a, profile)
        except Exception:  # a candidate config vLLM refuses to build
            return False
        return r.failed and _signature(r) == want

    small_config, small_actions = shrink(config, actions, still_fails)
    small = run_case(small_config, small_actions, profile)
    d = small.failure
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"fuzz-seed{seed}-case{case}.jsonl")
    description = (f"kvconform fuzz --seed {seed}: case {case}"
                   + (f" (injected fault {fault})" if fault else "")
                   + f", shrunk from {len(run.events)} to {len(small.events)} calls; "
                   f"{d.kind.value} at call {d.index + 1} ({d.event.kind}, field {d.field or '-'})")
    header = TraceHeader(installed_vllm_version(), "fuzz", small_config, description)
    # Written with vLLM's answers: replaying it on impl shows the divergence.
    with TraceWriter(path, header) as w:
        for event, answer in small.events:
            w.write(event, answer)
    return Finding(case, path, len(small.events), len(run.events), d)


def progress_reporter(stream=sys.stderr, every: float = 5.0) -> Callable[[CampaignResult], None]:
    """A live status line on a terminal; a plain line every few seconds otherwise."""
    tty = stream.isatty()
    last = [0.0]

    def report(r: CampaignResult) -> None:
        now = time.perf_counter()
        if now - last[0] < (0.2 if tty else every):
            return
        last[0] = now
        line = (f"fuzz: {r.ops} ops, {r.ops_per_s:,.0f} ops/s, {r.cases} cases, "
                f"{len(r.states)} distinct states, {1 if r.finding else 0} findings")
        stream.write(("\r" + line + "\x1b[K") if tty else line + "\n")
        stream.flush()

    return report
