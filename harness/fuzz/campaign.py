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

Through a foreign backend (`backend="exec:CMD"`, specs/FOREIGN_BACKEND.md)
vLLM is still the reference and the foreign process takes impl's place: one
process for the whole campaign when its hello declares `restart` (a fresh
`start` per case and per shrink candidate), else one per case and candidate,
the shrink then trying at most EXEC_SHRINK_CHECKS candidates. A case
outside its capabilities is not covered: skipped before anything is built
when its config is (the hello's capabilities, read once), cut short when an
op is; counted and named, never a pass. A process that dies, hangs or breaks
the protocol ends the campaign with one line (BackendStopped).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.backends.base import BackendStopped
from harness.backends.exec_backend import (
    PREFIX,
    ForeignProcesses,
    NotCovered,
    coverage_gap,
    is_exec,
)
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
from harness.fuzz.shrink import MAX_CHECKS, shrink
from harness.sources.replay import exec_backend
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
    backend: str = "impl"  # who ran beside vLLM

    def replay_command(self, flags: str = "") -> str:
        """How to see the finding again: vLLM's answers replayed on the backend."""
        chosen = f"--backend '{self.backend}' " if self.backend != "impl" else ""
        return f"kvconform replay {chosen}{flags}{self.path}"


# Fewer cases than this in a campaign's whole time, and no finding: too few to
# mean anything (a case is at most --max-ops calls on a fresh pool).
MIN_CASES = 100
# A shrink through a foreign backend that cannot restart starts a process per
# candidate: at most this many candidates (impl's shrink tries MAX_CHECKS).
EXEC_SHRINK_CHECKS = 300
# Cases drawn, none covered by the foreign backend: the config is not covered
# (drawing is cheap: an uncovered config starts no process), the campaign ends.
UNCOVERED_STOP = 200
# A gate slice's floor of MIN_CASES covered cases gives up after this many
# times as many cases drawn (a config the backend covers only rarely).
FLOOR_DRAWS = 10


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
    # Cases a foreign backend did not cover (to the end), and why (reason -> cases).
    not_covered: int = 0
    not_covered_why: dict = field(default_factory=dict)
    # Foreign processes started (the hello's probe, every case's, the shrink's).
    processes_started: int = 0

    @property
    def checked(self) -> int:
        """Cases run to the end on every backend (or failed)."""
        return self.cases - self.not_covered

    @property
    def covered_none(self) -> bool:
        """Every case was outside the foreign backend's capabilities."""
        return self.cases > 0 and self.checked == 0

    @property
    def mostly_not_covered(self) -> bool:
        """Enough cases drawn, too few of them covered to mean anything: the
        foreign backend's coverage, not the machine, is short (every case
        uncovered included)."""
        return (not self.found_something() and self.not_covered > 0
                and self.checked < MIN_CASES and self.cases >= MIN_CASES)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def found_something(self) -> bool:
        raise NotImplementedError

    @property
    def too_few_cases(self) -> bool:
        """Time ran out before MIN_CASES cases (covered ones), with nothing found."""
        return (not self.found_something() and self.checked < MIN_CASES
                and not self.stopped_at_max_cases and not self.covered_none
                and not self.mostly_not_covered)

    def note_not_covered(self, why: str) -> None:
        self.not_covered += 1
        self.not_covered_why[why] = self.not_covered_why.get(why, 0) + 1

    def not_covered_text(self) -> str:
        """`N not covered (kind sliding_window: 40, op hisparse_step: 2)`."""
        reasons = sorted(self.not_covered_why.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{why}: {n}" for why, n in reasons[:6])
        more = f", {len(reasons) - 6} more reasons" if len(reasons) > 6 else ""
        return f"{self.not_covered} not covered ({shown}{more})"


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


def start_up(profile: VersionProfile, backend: str = "impl",
             processes: ForeignProcesses | None = None) -> float:
    """Import vLLM and build one pair of backends (the one-time cost every
    campaign pays first), then freeze what exists out of the garbage
    collector; the seconds it took."""
    t0 = time.perf_counter()
    run_case(CacheConfig(num_blocks=4, groups=(GroupConfig(1),)), [], profile, backend,
             processes)
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t0


def run_case(config: CacheConfig, actions: list[Action], profile: VersionProfile,
             backend: str = "impl", processes: ForeignProcesses | None = None) -> FuzzRun:
    """One case on vLLM and `backend` (impl, or exec:CMD, its process from
    `processes` or its own, given back or closed after it)."""
    backends = build_backends(config, profile, backend, processes)
    if isinstance(backends, FuzzRun):
        return backends
    driver = Driver(config, profile, backends)
    try:
        return driver.execute(actions)
    except NotCovered as e:  # an op outside the foreign backend's capabilities
        driver.run.not_covered = str(e)
        return driver.run
    finally:
        if is_exec(backend):
            backends[1].close()


def _makers(config: CacheConfig, profile: VersionProfile, backend: str,
            processes: ForeignProcesses | None) -> dict:
    """How to build each backend of a case, by name; a foreign one first, so
    that a config it does not cover builds no vLLM."""
    vllm = lambda: VllmBackend(config, profile, check=True)  # noqa: E731
    if not is_exec(backend):
        return {"vllm": vllm, "impl": lambda: ImplBackend(config, profile, check=True)}
    return {backend: lambda: exec_backend(backend[len(PREFIX):], config, profile,
                                          installed_vllm_version(), processes), "vllm": vllm}


def build_backends(config: CacheConfig, profile: VersionProfile, backend: str = "impl",
                   processes: ForeignProcesses | None = None) -> list | FuzzRun:
    """vLLM's and `backend`'s backends for a case (vLLM first: the
    reference); when a config cannot be built, a FuzzRun saying so: both
    refuse it (the release does not take such a model: the case is skipped),
    only one does (a divergence), or a foreign backend does not cover it."""
    built, refusals = {}, {}
    for name, make in _makers(config, profile, backend, processes).items():
        try:
            built[name] = make()
        except NotCovered as e:
            return FuzzRun(not_covered=str(e))
        except (EnvironmentProblem, BackendStopped):
            if backend in built:
                built[backend].close()
            raise
        except Exception as e:  # noqa: BLE001 - a backend refusing the config is an answer
            refusals[name] = f"refuses this config: {type(e).__name__}: {e}"
    if not refusals:
        return [built["vllm"], built[backend]]
    if is_exec(backend) and backend in built:
        built[backend].close()
    run = FuzzRun()
    if len(refusals) == 2:
        run.refused = refusals["vllm"]
        return run
    answers = {n: refusals.get(n, "builds it") for n in ("vllm", backend)}
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
    backend: str = "impl",
) -> CampaignResult:
    """Draw cases first_case, first_case + 1, ... until `seconds` have passed,
    `max_cases` cases ran (tests bound a campaign by cases: the same work on a
    loaded machine), or a case fails. The clock starts after start_up (unless
    `started`: the caller ran it). `min_cases`: a floor of covered cases the
    time budget does not cut short (the gate's slices: a campaign of a few
    cases means nothing, so on a slow machine the slice takes longer
    instead). `backend`: what runs beside vLLM (impl, or exec:CMD)."""
    fc = fuzz_config or FuzzConfig()
    result = CampaignResult(seed=seed)
    processes = ForeignProcesses(backend[len(PREFIX):]) if is_exec(backend) else None
    capabilities = None if processes is None else processes.capabilities
    try:
        if not started:
            result.startup_seconds = start_up(profile, backend, processes)
        t0 = time.perf_counter()
        with inject(fault):
            while _going_on(result, time.perf_counter() - t0, seconds, min_cases):
                if max_cases is not None and result.cases >= max_cases:
                    result.stopped_at_max_cases = True
                    break
                case = first_case + result.cases
                config, actions = draw_case(case_rng(seed, case), fc, max_ops,
                                            profile.hash_lookahead_tokens)
                gap = None if capabilities is None else coverage_gap(capabilities, config,
                                                                      profile)
                run = (FuzzRun(not_covered=gap) if gap is not None
                       else run_case(config, actions, profile, backend, processes))
                result.cases += 1
                if run.refused is not None:
                    result.refused += 1
                if run.not_covered is not None:
                    result.note_not_covered(_reason(run.not_covered))
                result.ops += len(run.events)
                result.states |= run.signatures
                result.seconds = time.perf_counter() - t0
                if report is not None:
                    report(result)
                if run.failed:
                    result.finding = _write_finding(profile, config, actions, run, seed,
                                                    case, out_dir, fault, backend, processes)
                    break
        result.seconds = time.perf_counter() - t0
    finally:
        if processes is not None:
            processes.close()
            result.processes_started = processes.started
        if not started:
            gc.unfreeze()
    return result


def _going_on(result: CampaignResult, elapsed: float, seconds: float, min_cases: int) -> bool:
    """Whether to draw another case: time is left or the floor is not
    reached, unless a foreign backend covered none of many."""
    if result.covered_none and result.cases >= UNCOVERED_STOP:
        return False
    if elapsed < seconds:
        return True
    return result.checked < min_cases and result.cases < min_cases * FLOOR_DRAWS


def _reason(not_covered: str) -> str:
    """'not covered by exec:CMD: op x (at event #3 (x))' -> 'op x': the
    campaign counts cases by reason."""
    why = not_covered.split(": ", 1)[1] if not_covered.startswith("not covered by ") else (
        not_covered)
    return why.split(" (at ", 1)[0]


def _write_finding(profile: VersionProfile, config: CacheConfig, actions: list[Action],
                   run: FuzzRun, seed: int, case: int, out_dir: str,
                   fault: str | None, backend: str = "impl",
                   processes: ForeignProcesses | None = None) -> Finding:
    want = _signature(run)

    def still_fails(c: CacheConfig, a: list[Action]) -> bool:
        try:
            r = run_case(c, a, profile, backend, processes)
        except Exception:  # a candidate config vLLM refuses to build, a foreign crash
            return False
        return r.failed and _signature(r) == want

    one_process = processes is None or processes.restartable
    small_config, small_actions = shrink(config, actions, still_fails,
                                         MAX_CHECKS if one_process else EXEC_SHRINK_CHECKS)
    small = run_case(small_config, small_actions, profile, backend, processes)
    d = small.failure
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"fuzz-seed{seed}-case{case}.jsonl")
    description = (f"kvconform fuzz --seed {seed}: case {case}"
                   + (f" (injected fault {fault})" if fault else "")
                   + (f" against {backend}" if backend != "impl" else "")
                   + f", shrunk from {len(run.events)} to {len(small.events)} calls; "
                   f"{d.kind.value} at call {d.index + 1} ({d.event.kind}, field {d.field or '-'})")
    header = TraceHeader(installed_vllm_version(), "fuzz", small_config, description)
    # Written with vLLM's answers: replaying it on impl shows the divergence.
    with TraceWriter(path, header) as w:
        for event, answer in small.events:
            w.write(event, answer)
    return Finding(case, path, len(small.events), len(run.events), d, backend)


def progress_reporter(stream=sys.stderr, every: float = 5.0) -> Callable[[CampaignResult], None]:
    """A live status line on a terminal; a plain line every few seconds otherwise."""
    tty = stream.isatty()
    last = [0.0]

    def report(r: CampaignResult) -> None:
        now = time.perf_counter()
        if now - last[0] < (0.2 if tty else every):
            return
        last[0] = now
        line = (f"fuzz: {r.ops} ops, {r.ops_per_s:,.0f} ops/s, {r.cases} cases"
                + (f" ({r.not_covered} not covered)" if r.not_covered else "")
                + f", {len(r.states)} distinct states, {1 if r.finding else 0} findings")
        stream.write(("\r" + line + "\x1b[K") if tty else line + "\n")
        stream.flush()

    return report
