"""A fuzz campaign spread over a Ray cluster (`kvconform fuzz --ray [ADDRESS]`).

The campaign is cut into units: a kind config, a seed, and a run of that
seed's cases (case n of seed s is always the same program, wherever it runs).
Units go round the kind configs, each next run of cases in turn, to whichever
worker is free (harness/fuzz/ray_cluster.py); a unit stops at its first finding, at
its last case, or when the campaign's time is up. Findings stream back as
units finish: each is named by its shrunk signature (what failed, at which
op and field, with which message; harness/fuzz/campaign.py shrinks it), and
only the first (the smallest, if a smaller one comes later) of each
signature is written to --out as a regression trace; the others are counted.

With --max-cases the units are the same on any cluster, so the same cases run
and the same findings come back; with a time budget, how far each config gets
depends on the cluster.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.core.compare import Failure, FailureKind
from harness.core.exit_codes import ExitCode, worst
from harness.fuzz.campaign import CampaignTotals, fuzz
from harness.fuzz.generate import FuzzConfig
from harness.fuzz.ray_cluster import Failed, WorkerPool

# Cases per unit (a fraction of a second): long enough that dispatching and
# merging results costs the driver next to nothing (on a small machine the
# driver shares the CPUs with the workers), short enough to spread a small
# campaign over every worker. A budget in cases splits evenly over the configs.
UNIT_CASES = 250


@dataclass(frozen=True, slots=True)
class FuzzUnit:
    config_name: str
    fuzz_config: FuzzConfig
    seed: int
    first_case: int
    num_cases: int
    max_ops: int
    seconds: float  # at most this long (the campaign's time left when drawn)
    fault: str | None = None


@dataclass(slots=True)
class UnitResult:
    cases: int
    ops: int
    seconds: float
    states: set
    failure: Failure | None = None
    case: int = 0
    num_calls: int = 0
    num_calls_before: int = 0
    trace: str | None = None  # the shrunk finding, a JSON Lines trace
    refused: int = 0  # cases whose config both backends refuse


def run_unit(unit: FuzzUnit, profile_name: str) -> UnitResult:
    """On a worker (started: vLLM imported): the unit's cases."""
    from impl.profiles import get_profile

    with tempfile.TemporaryDirectory(prefix="kvconform-unit-") as out:
        r = fuzz(get_profile(profile_name), unit.seconds, unit.seed, out, unit.max_ops,
                 unit.fuzz_config, unit.fault, max_cases=unit.num_cases,
                 first_case=unit.first_case, started=True)
        result = UnitResult(r.cases, r.ops, r.seconds, r.states, refused=r.refused)
        f = r.finding
        if f is not None:
            with open(f.path) as fh:
                result.trace = fh.read()
            result.failure, result.case = f.failure, f.case
            result.num_calls, result.num_calls_before = f.num_calls, f.num_calls_before
    return result


@dataclass(slots=True)
class RayFinding:
    signature: tuple
    path: str
    config_name: str
    seed: int
    case: int
    num_calls: int
    failure: Failure
    duplicates: int = 0  # more findings with this signature


@dataclass(slots=True)
class RayCampaignResult(CampaignTotals):
    workers: int = 0
    findings: list[RayFinding] = field(default_factory=list)
    units: int = 0
    lost_units: list[str] = field(default_factory=list)
    # config name -> [cases, ops]
    per_config: dict[str, list[int]] = field(default_factory=dict)

    def found_something(self) -> bool:
        return bool(self.findings)

    @property
    def exit_code(self) -> ExitCode:
        codes = [f.failure.exit_code for f in self.findings]
        if self.lost_units or (not self.findings and self.too_few_cases):
            codes.append(ExitCode.ENVIRONMENT)
        return worst(codes)


def kind_configs(profile=None) -> dict[str, FuzzConfig]:
    """harness/fuzz/kind_configs/: one config per attention kind or hybrid
    (all.yaml, every kind at once, left out: each kind has its own); with a
    profile, those its release has the groups of."""
    from harness.fuzz.configs import kinds_supported
    from harness.fuzz.slices import kind_names, load_kind_config

    configs = {name: load_kind_config(name) for name in kind_names()}
    # Sizing kind configs (harness/fuzz/sizing.py) are no manager campaign.
    return {name: fc for name, fc in configs.items() if isinstance(fc, FuzzConfig)
            and (profile is None or kinds_supported(fc.kinds, profile))}


def signature(failure: Failure) -> tuple:
    """What makes two findings the same bug: the failure's kind, op and field,
    and for a broken invariant or a rejection its message, numbers (block
    ids, counts) and indices left out."""
    field_ = re.sub(r"\[\d+\]", "[]", failure.field)
    message = ""
    if failure.kind is not FailureKind.DIVERGED:
        message = failure.message or next(
            (a for a in failure.answers.values() if isinstance(a, str)), "")
        message = re.sub(r"\d+", "#", message)
    return failure.kind.value, failure.event.kind, field_, message


def _units(configs: dict[str, FuzzConfig], seed: int, max_ops: int, fault: str | None,
           time_left: Callable[[], float], max_cases: int | None) -> Iterator[FuzzUnit]:
    # A budget in cases is shared by every config.
    size = UNIT_CASES if max_cases is None else max(1, min(UNIT_CASES,
                                                           max_cases // len(configs)))
    assigned = 0
    for block in itertools.count():
        for name, fc in configs.items():
            left = time_left()
            if left <= 0:
                return
            n = size
            if max_cases is not None:
                n = min(n, max_cases - assigned)
                if n <= 0:
                    return
            assigned += n
            yield FuzzUnit(name, fc, seed, block * size, n, max_ops, left, fault)


def fuzz_on_ray(pool: WorkerPool, profile_name: str, seconds: float, seed: int, out_dir: str,
                configs: dict[str, FuzzConfig], max_ops: int = 40,
                max_cases: int | None = None, fault: str | None = None,
                on_finding: Callable[[RayFinding, bool], None] | None = None,
                report: Callable[[RayCampaignResult], None] | None = None,
                ) -> RayCampaignResult:
    """Run the campaign on the started pool; findings written to out_dir."""
    result = RayCampaignResult(startup_seconds=max(pool.startup_seconds, default=0.0),
                               workers=len(pool.workers))
    by_signature: dict[tuple, RayFinding] = {}
    t0 = time.perf_counter()

    def time_left() -> float:
        return seconds - (time.perf_counter() - t0)

    units = _units(configs, seed, max_ops, fault, time_left, max_cases)
    for unit, r in pool.map_unordered("harness.fuzz.distributed:run_unit", units,
                                      (profile_name,)):
        result.units += 1
        if isinstance(r, Failed):
            result.lost_units.append(f"{unit.config_name} cases {unit.first_case}.."
                                     f"{unit.first_case + unit.num_cases - 1}: {r.message}")
            continue
        result.cases += r.cases
        result.ops += r.ops
        result.refused += r.refused
        result.states |= r.states
        counts = result.per_config.setdefault(unit.config_name, [0, 0])
        counts[0] += r.cases
        counts[1] += r.ops
        if r.failure is not None:
            finding, new = _keep(r, unit, out_dir, by_signature)
            if new:
                result.findings.append(finding)
            if on_finding is not None:
                on_finding(finding, new)
        result.seconds = time.perf_counter() - t0
        if report is not None:
            report(result)
    result.seconds = time.perf_counter() - t0
    result.stopped_at_max_cases = max_cases is not None and result.cases >= max_cases
    return result


def _keep(r: UnitResult, unit: FuzzUnit, out_dir: str,
          by_signature: dict[tuple, RayFinding]) -> tuple[RayFinding, bool]:
    """Write a finding unless its signature is known (then count it; a
    smaller one replaces the known one's trace)."""
    sig = signature(r.failure)
    known = by_signature.get(sig)
    if known is not None:
        known.duplicates += 1
        if r.num_calls >= known.num_calls:
            return known, False
        os.remove(known.path)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"fuzz-{unit.config_name}-seed{unit.seed}-case{r.case}.jsonl")
    with open(path, "w") as f:
        f.write(r.trace)
        f.flush()
        os.fsync(f.fileno())
    if known is not None:
        known.path, known.config_name, known.case = path, unit.config_name, r.case
        known.num_calls, known.failure = r.num_calls, r.failure
        return known, False
    finding = RayFinding(sig, path, unit.config_name, unit.seed, r.case, r.num_calls, r.failure)
    by_signature[sig] = finding
    return finding, True
