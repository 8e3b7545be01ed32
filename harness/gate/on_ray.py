"""`kvconform gate --ray [ADDRESS]`: the conformance gate over a Ray cluster.

The same cases as `kvconform gate` (harness/gate/cases.py), spread over the
cluster's workers (harness/fuzz/ray_cluster.py) instead of pytest-xdist: every
trace (its bytes travel with the unit, so the workers need no shared
filesystem), the seeded workloads, then the fuzz campaign spread the same way
(harness/fuzz/distributed.py, every kind config). Cases come back as they
finish; the table, the JUnit XML and the markdown summary are the gate's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from harness.core.exit_codes import ExitCode
from harness.gate.cases import Case, case_name, gate_exit_code


@dataclass(frozen=True, slots=True)
class CaseUnit:
    kind: str  # trace | workload
    name: str
    data: bytes = b""  # a trace's bytes
    suffix: str = ""


def run_case_unit(unit: CaseUnit, profile_name: str) -> Case:
    """On a worker: one trace or workload case."""
    from harness.gate.cases import WORKLOADS, run_trace, run_workload
    from impl.profiles import get_profile

    if unit.kind == "workload":
        return run_workload(next(c for c in WORKLOADS if c.name == unit.name),
                            get_profile(profile_name))
    with tempfile.TemporaryDirectory(prefix="kvconform-gate-") as d:
        path = os.path.join(d, "trace" + unit.suffix)
        with open(path, "wb") as f:
            f.write(unit.data)
        case = run_trace(path)
    # Named, and placed in reports, as the driver knows it.
    case.name = unit.name
    case.report = case.report.replace(path, unit.name)
    return case


def _units(paths: list[str]) -> Iterator[CaseUnit]:
    from harness.gate.cases import WORKLOADS
    from harness.trace import find_traces

    for path in find_traces(paths):
        with open(path, "rb") as f:
            data = f.read()
        yield CaseUnit("trace", case_name(path), data, os.path.splitext(path)[1])
    for w in WORKLOADS:
        yield CaseUnit("workload", w.name)


def run_gate_on_ray(address: str | None, workers: int | None, paths: list[str],
                    fuzz_seconds: float, fuzz_seed: int, fuzz_out: str, junit: str | None,
                    summary: str | None) -> ExitCode:
    from harness.backends.vllm_backend import installed_vllm_profile
    from harness.backends.vllm_check import check_vllm
    from harness.core.exit_codes import fail
    from harness.fuzz.ray_cluster import Failed, close_pool, open_pool, require_ray
    from harness.gate.run import format_summary, format_table, installed_against, write_junit

    require_ray(address)
    if (code := check_vllm()) is not None:
        return code
    for p in paths:
        if not os.path.exists(p):
            return fail(f"{p}: no such file or folder")
    profile = installed_vllm_profile()
    against = installed_against()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    cases: list[Case] = []
    pool = None
    t0 = time.perf_counter()
    try:
        pool = open_pool(address, workers, profile.name, say)
        for unit, case in pool.map_unordered("harness.gate.on_ray:run_case_unit", _units(paths),
                                             (profile.name,)):
            if isinstance(case, Failed):
                case = Case(unit.name, unit.kind, "-", 0, 0.0, ExitCode.ENVIRONMENT,
                            f"the case did not come back from its worker: {case.message}")
            cases.append(case)
            say(f"gate --ray: {len(cases)} cases done ({case.name}: {case.verdict})")
        if fuzz_seconds > 0:
            from harness.fuzz.distributed import fuzz_on_ray, kind_configs

            r = fuzz_on_ray(pool, profile.name, fuzz_seconds, fuzz_seed, fuzz_out,
                            kind_configs(profile))
            cases.append(_fuzz_row(r, fuzz_seed, fuzz_seconds))
    finally:
        close_pool(pool)
    seconds = time.perf_counter() - t0
    cases.sort(key=lambda c: (c.kind != "trace", c.name))
    print(format_table(cases, against))
    for c in cases:
        if c.exit_code != ExitCode.OK:
            print(f"\n{c.name}:\n{c.report}")
    if junit:
        write_junit(junit, [(c.name, c) for c in cases], seconds, against)
    if summary:
        with open(summary, "w") as f:
            f.write(format_summary(cases, seconds, against))
    return gate_exit_code(cases)


def _fuzz_row(r, seed: int, seconds: float) -> Case:
    """The distributed campaign (RayCampaignResult) as one gate row: every
    distinct finding, the units that did not come back, or too few cases.
    A finding that is a known crash of vLLM (traces/upstream/) is listed with
    its reproducer and passes, as on the gate's own fuzz slices."""
    from harness.core.exit_codes import worst
    from harness.fuzz.campaign import MIN_CASES
    from harness.gate.cases import KNOWN_UPSTREAM, TOO_FEW_CASES, known_upstream_crash
    from harness.report.text import format_failure

    name = f"fuzz[ray,seed={seed},seconds={seconds:g},workers={r.workers}]"
    mode = f"{r.cases} cases, {r.ops_per_s:,.0f} ops/s"
    lines = []
    if r.findings:
        lines.append(f"{len(r.findings)} distinct findings (by shrunk signature):")
    codes = []
    for f in r.findings:
        lines += [f"{f.path} ({f.config_name} case {f.case}, {f.num_calls} calls, "
                  f"{f.duplicates} duplicates)", format_failure(f.failure)]
        if (known := known_upstream_crash(f.failure)) is not None:
            lines.append(f"the known upstream bug of {known}")
        else:
            codes.append(f.failure.exit_code)
    lines += [f"a unit did not come back: {u}" for u in r.lost_units]
    label = ""
    if r.findings and not codes:
        label = KNOWN_UPSTREAM
    if not r.findings and r.too_few_cases:
        label = TOO_FEW_CASES
        lines.append(f"warning: only {r.cases} cases in {r.seconds:.1f}s: too few to mean "
                     f"anything (a campaign needs at least {MIN_CASES})")
    if r.lost_units or (not r.findings and r.too_few_cases):
        codes.append(ExitCode.ENVIRONMENT)
    return Case(name, "fuzz", mode, r.ops, r.seconds, worst(codes), "\n".join(lines),
                label=label)
