"""`kvconform gate`: the CI conformance gate (and `kvconform conform`: the same
without fuzz, serially).

Every trace under the given paths (default: the bundled traces/) is replayed
and diffed, the seeded workloads run in lockstep, and a short fuzz campaign
runs (harness/gate/cases.py); one exit code gates the merge (harness/core/exit_codes.py),
a JUnit XML file tells the CI system which case failed, and a markdown summary
suits a CI job summary.

The cases run as pytest items (harness/gate/pytest_plugin.py) so that pytest-xdist
spreads them over all cores; results are the same as a serial run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.exit_codes import ExitCode
from harness.fuzz.core_coverage import CoreBranches, combined
from harness.gate.cases import ROOT, TRACES_DIR, Case, gate_exit_code


class _Collector:
    """Gathers each case's result on the controller (xdist included)."""

    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}
        self.item_names: dict[str, str] = {}
        self.internal_errors: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        props = dict(report.user_properties)
        if report.when == "call" or (report.failed and report.nodeid not in self.cases):
            code = props.get("kvconform_exit", ExitCode.OK if report.passed
                             else ExitCode.BAD_INPUT)
            if report.failed and code == ExitCode.OK:
                code = ExitCode.BAD_INPUT  # crashed before reporting: a harness error
            self.cases[report.nodeid] = Case(
                props.get("kvconform_name", report.nodeid.split("::")[-1]),
                props.get("kvconform_kind", "trace"),
                props.get("kvconform_mode", "-"),
                props.get("kvconform_events", 0),
                props.get("kvconform_seconds", report.duration),
                ExitCode(code),
                "" if report.passed else str(report.longrepr),
                props.get("kvconform_message", ""),
                truncated=bool(props.get("kvconform_truncated", False)),
                label=props.get("kvconform_label", ""),
                not_run_here=props.get("kvconform_not_run_here", ""),
            )
            self.item_names[report.nodeid] = report.nodeid.split("::")[-1]

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.internal_errors.append(str(report.longrepr))


@dataclass(frozen=True, slots=True)
class Against:
    """What a gate run checks: the vLLM release and the profile it is held to."""

    vllm_version: str
    profile: str  # the profile's name ("0.24")
    profile_releases: str  # the releases it was checked against ("0.24.0-0.25.1")
    # The profile is another release's (--assume-profile): nobody checked that
    # it describes this release.
    unverified: bool = False

    def describe(self) -> str:
        what = f"vLLM {self.vllm_version} against the {self.profile} profile"
        return what + (f" ({UNVERIFIED}: checked on {self.profile_releases})"
                       if self.unverified else f" (checked on {self.profile_releases})")


UNVERIFIED = "unverified profile"


def format_table(cases: list[Case], against: Against | None = None) -> str:
    width = max([len(c.name) for c in cases] + [4])
    mode_w = max([len(c.mode) for c in cases] + [4])
    lines = [against.describe()] if against is not None else []
    lines += [f"{'case':<{width}}  {'kind':<8}  {'mode':<{mode_w}}  {'events':>8}  "
              f"{'seconds':>7}  result",
              f"{'-' * width}  {'-' * 8}  {'-' * mode_w}  {'-' * 8}  {'-' * 7}  {'-' * 10}"]
    for c in cases:
        lines.append(f"{c.name:<{width}}  {c.kind:<8}  {c.mode:<{mode_w}}  {c.events:>8}  "
                     f"{c.seconds:>7.2f}  {c.verdict}")
    failed = sum(c.exit_code != ExitCode.OK and not c.not_run_here for c in cases)
    tail = f"{len(cases)} cases, {sum(c.events for c in cases)} events checked, {failed} failed"
    if skipped := sum(bool(c.not_run_here) for c in cases):
        tail += f", {skipped} not run on this machine (what it lacks is named above)"
    if against is not None and against.unverified:
        tail += f" ({UNVERIFIED})"
    lines.append(tail)
    return "\n".join(lines)


def coverage_line(cases: list[Case], backend: str) -> str:
    """How much of the run a foreign backend's capabilities covered."""
    covered = sum(not c.not_covered for c in cases)
    return f"{backend} covered {covered} of {len(cases)} cases"


def format_summary(cases: list[Case], seconds: float, against: Against,
                   backend: str = "impl", branches: CoreBranches | None = None) -> str:
    failed = [c for c in cases if c.exit_code != ExitCode.OK and not c.not_run_here]
    skipped = [c for c in cases if c.not_run_here]
    head = "✅ conformant" if not failed else f"❌ {len(failed)} of {len(cases)} cases failed"
    if against.unverified:
        head += f" ({UNVERIFIED})"
    lines = [f"## kvconform gate: {head}", "",
             f"{against.describe()}; {len(cases)} cases, "
             f"{sum(c.events for c in cases):,} events checked in {seconds:.0f} s.", "",
             *([coverage_line(cases, backend) + ".", ""] if backend != "impl" else []),
             *([branches.line() + ".", ""] if branches is not None else []),
             "| case | kind | mode | events | seconds | result |",
             "|---|---|---|---:|---:|---|"]
    for c in cases:
        lines.append(f"| `{c.name}` | {c.kind} | {c.mode} | {c.events} | {c.seconds:.2f} | "
                     f"{c.verdict} |")
    for c in failed:
        lines += ["", f"<details><summary><code>{c.name}</code>: {c.verdict}</summary>", "",
                  "```", c.report.strip(), "```", "</details>"]
    if skipped:
        lines += ["", f"{len(skipped)} cases not run on this machine (they decide nothing):"]
        lines += [f"- `{c.name}` ({c.mode}): {c.not_run_here}" for c in skipped]
    return "\n".join(lines) + "\n"


def write_junit(path: str, named: list[tuple[str, Case]], seconds: float,
                against: Against) -> None:
    """JUnit XML: a divergence is a <failure>, a case that could not be checked
    (bad input, the environment) an <error>; its message is the case's one
    line, its body the report."""
    import xml.etree.ElementTree as ET

    cases = [c for _, c in named]
    suite = ET.Element("testsuite", name="kvconform", tests=str(len(cases)),
                       failures=str(sum(c.exit_code == ExitCode.DIVERGED for c in cases)),
                       errors=str(sum(c.exit_code not in (ExitCode.OK, ExitCode.DIVERGED)
                                      and not c.not_run_here for c in cases)),
                       skipped=str(sum(c.not_covered or bool(c.not_run_here) for c in cases)),
                       time=f"{seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in (("vllm", against.vllm_version), ("profile", against.profile),
                       ("unverified_profile", str(against.unverified).lower())):
        ET.SubElement(props, "property", name=key, value=value)
    for name, c in named:
        case = ET.SubElement(suite, "testcase", classname=f"kvconform.{c.kind}", name=name,
                             time=f"{c.seconds:.3f}")
        cprops = ET.SubElement(case, "properties")
        ET.SubElement(cprops, "property", name="mode", value=c.mode)
        ET.SubElement(cprops, "property", name="events", value=str(c.events))
        if c.not_covered:
            ET.SubElement(case, "skipped", message=c.message or c.verdict)
            continue
        if c.exit_code == ExitCode.OK:
            continue
        if c.not_run_here:
            ET.SubElement(case, "skipped", message=c.not_run_here)
            continue
        tag = "failure" if c.exit_code == ExitCode.DIVERGED else "error"
        ET.SubElement(case, tag, message=c.message or c.verdict).text = c.report
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def cases_json(cases: list[Case], seconds: float, against: Against, code: ExitCode,
               branches: CoreBranches | None = None) -> dict:
    """The run as data (`kvconform gate --json FILE`; make matrix reads it)."""
    return {
        "core_branches": None if branches is None else {
            "covered": branches.covered, "total": branches.total, "slices": branches.slices},
        "vllm": against.vllm_version, "profile": against.profile,
        "profile_releases": against.profile_releases, "unverified_profile": against.unverified,
        "seconds": round(seconds, 3), "exit_code": int(code),
        "cases": [{"name": c.name, "kind": c.kind, "mode": c.mode, "events": c.events,
                   "seconds": round(c.seconds, 3), "exit_code": int(c.exit_code),
                   "message": c.message, "not_run_here": c.not_run_here} for c in cases],
    }


def installed_against() -> Against:
    """The installed vLLM and the profile it is held to (its own, or the one
    --assume-profile names)."""
    from harness.backends.vllm_backend import (
        installed_vllm_profile,
        installed_vllm_version,
        profile_is_assumed,
    )

    profile = installed_vllm_profile()
    return Against(installed_vllm_version(), profile.name, profile.releases,
                   profile_is_assumed())


def run_gate(paths: list[str], fuzz_seconds: float, fuzz_seed: int, fuzz_out: str,
             junit: str | None, summary: str | None, jobs: str, workloads: bool = True,
             attention: bool = True, json_out: str | None = None,
             backend: str = "impl", page: str | None = None,
             core_coverage: bool | str = True) -> ExitCode:
    """The gate's cases (the traces under `paths`, the workloads, a fuzz of
    `fuzz_seconds`) under pytest; the exit code gates the merge.
    `core_coverage`: measure the fuzz slices' reach into vLLM's KV
    core (True: in a scratch folder; a folder: kept there, with an HTML
    report in its html/; False: not measured)."""
    from harness.backends.vllm_check import check_vllm
    from harness.core.exit_codes import fail

    # Before pytest starts: a missing vLLM or a release without a profile is
    # one line, not a failure per case.
    if (code := check_vllm()) is not None:
        return code
    against = installed_against()
    for p in paths:
        if not os.path.exists(p):
            return fail(f"{p}: no such file or folder")

    import pytest

    args = [*paths, f"--kvconform-fuzz-seconds={fuzz_seconds}",
            f"--kvconform-fuzz-seed={fuzz_seed}", f"--kvconform-fuzz-out={fuzz_out}",
            "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            "--no-header", "-rN", "--tb=no"]
    if workloads:
        args.append("--kvconform-workloads")
    if not attention:
        args.append("--kvconform-no-attention")
    if backend != "impl":
        args.append(f"--kvconform-backend={backend}")
    if jobs != "1":
        args += ["-n", jobs]
    # Each fuzz slice's reach into vLLM's KV core, combined for the summary.
    kept = core_coverage if isinstance(core_coverage, str) else None
    scratch = tempfile.TemporaryDirectory(prefix="kvconform-core-") if (
        core_coverage is True and fuzz_seconds > 0) else None
    data_dir = kept or (scratch.name if scratch is not None else None)
    if data_dir is not None:
        args.append(f"--kvconform-core-coverage={data_dir}")
    collector = _Collector()
    t0 = time.perf_counter()
    rc = pytest.main(args, plugins=[collector])
    seconds = time.perf_counter() - t0
    branches = None
    if data_dir is not None:
        branches = combined(data_dir, os.path.join(kept, "html") if kept else None)
    if scratch is not None:
        scratch.cleanup()
    order = sorted(collector.cases, key=lambda n: (collector.cases[n].kind != "trace",
                                                   collector.cases[n].name,
                                                   collector.cases[n].mode))
    cases = [collector.cases[n] for n in order]
    if rc == pytest.ExitCode.INTERRUPTED:
        return ExitCode.INTERRUPTED
    if collector.internal_errors or rc not in (0, 1) or not cases:
        for err in collector.internal_errors:
            print(err, file=sys.stderr)
        return fail(f"the gate could not run its cases (pytest exit {int(rc)})")
    print(format_table(cases, against))
    if backend != "impl":
        print(coverage_line(cases, backend))
    if branches is not None:
        print(branches.line())
    for c in cases:
        if c.exit_code != ExitCode.OK or c.truncated:
            print(f"\n{c.name} ({c.mode}):\n{c.report}")
    code = gate_exit_code(cases)
    if summary:
        Path(summary).write_text(format_summary(cases, seconds, against, backend, branches))
    if junit:
        write_junit(junit, [(collector.item_names[n], collector.cases[n]) for n in order],
                    seconds, against)
    if page:
        write_page(page, cases, against, backend)
    if json_out:
        Path(json_out).write_text(json.dumps(cases_json(cases, seconds, against, code, branches),
                                             indent=1) + "\n")
    return code


def write_page(out_dir: str, cases: list[Case], against: Against, backend: str) -> None:
    """The publishable result page (harness/report/results.py)."""
    from harness.report.results import ResultRow, write_result_page

    title = f"kvconform conformance: {backend}"
    rows = [ResultRow(c.name, f"{c.kind} {c.mode}", c.exit_code, c.report or c.message,
                      c.label) for c in cases]
    write_result_page(out_dir, title, rows, against.describe())


def default_paths() -> list[str]:
    return [str(TRACES_DIR)]
