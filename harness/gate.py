"""`kvconform gate`: the CI conformance gate (and `kvconform conform`: the same
without fuzz, serially).

Every trace under the given paths (default: the bundled traces/) is replayed
and diffed, the seeded workloads run in lockstep, and a short fuzz campaign
runs (harness/cases.py); one exit code gates the merge (harness/exit_codes.py),
a JUnit XML file tells the CI system which case failed, and a markdown summary
suits a CI job summary.

The cases run as pytest items (harness/pytest_plugin.py) so that pytest-xdist
spreads them over all cores; results are the same as a serial run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness.cases import ROOT, TRACES_DIR, Case
from harness.exit_codes import ExitCode, worst


class _Collector:
    """Gathers each case's result on the controller (xdist included)."""

    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}
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
                truncated=bool(props.get("kvconform_truncated", False)),
                label=props.get("kvconform_label", ""),
            )

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.internal_errors.append(str(report.longrepr))


def format_table(cases: list[Case]) -> str:
    width = max([len(c.name) for c in cases] + [4])
    mode_w = max([len(c.mode) for c in cases] + [4])
    lines = [f"{'case':<{width}}  {'kind':<8}  {'mode':<{mode_w}}  {'events':>8}  "
             f"{'seconds':>7}  result",
             f"{'-' * width}  {'-' * 8}  {'-' * mode_w}  {'-' * 8}  {'-' * 7}  {'-' * 10}"]
    for c in cases:
        lines.append(f"{c.name:<{width}}  {c.kind:<8}  {c.mode:<{mode_w}}  {c.events:>8}  "
                     f"{c.seconds:>7.2f}  {c.verdict}")
    failed = sum(c.exit_code != ExitCode.OK for c in cases)
    lines.append(f"{len(cases)} cases, {sum(c.events for c in cases)} events checked, "
                 f"{failed} failed")
    return "\n".join(lines)


def format_summary(cases: list[Case], seconds: float, vllm_version: str) -> str:
    failed = [c for c in cases if c.exit_code != ExitCode.OK]
    head = "✅ conformant" if not failed else f"❌ {len(failed)} of {len(cases)} cases failed"
    lines = [f"## kvconform gate: {head}", "",
             f"Against vLLM {vllm_version}; {len(cases)} cases, "
             f"{sum(c.events for c in cases):,} events checked in {seconds:.0f} s.", "",
             "| case | kind | mode | events | seconds | result |",
             "|---|---|---|---:|---:|---|"]
    for c in cases:
        lines.append(f"| `{c.name}` | {c.kind} | {c.mode} | {c.events} | {c.seconds:.2f} | "
                     f"{c.verdict} |")
    for c in failed:
        lines += ["", f"<details><summary><code>{c.name}</code>: {c.verdict}</summary>", "",
                  "```", c.report.strip(), "```", "</details>"]
    return "\n".join(lines) + "\n"


def run_gate(paths: list[str], fuzz_seconds: float, fuzz_seed: int, fuzz_out: str,
             junit: str | None, summary: str | None, jobs: str) -> ExitCode:
    from harness.backends.vllm_backend import installed_vllm_version
    from harness.cli_support import check_vllm, fail

    # Before pytest starts: a missing vLLM or a release without a profile is
    # one line, not a failure per case.
    if (code := check_vllm()) is not None:
        return code
    vllm_version = installed_vllm_version()
    for p in paths:
        if not os.path.exists(p):
            return fail(f"{p}: no such file or folder")

    import pytest

    args = [*paths, "--kvconform-workloads", f"--kvconform-fuzz-seconds={fuzz_seconds}",
            f"--kvconform-fuzz-seed={fuzz_seed}", f"--kvconform-fuzz-out={fuzz_out}",
            "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            "-o", "junit_family=xunit1",
            "--no-header", "-rN", "--tb=no"]
    if junit:
        args.append(f"--junitxml={junit}")
    if jobs != "1":
        args += ["-n", jobs]
    collector = _Collector()
    t0 = time.perf_counter()
    rc = pytest.main(args, plugins=[collector])
    seconds = time.perf_counter() - t0
    cases = sorted(collector.cases.values(), key=lambda c: (c.kind != "trace", c.name))
    if rc == pytest.ExitCode.INTERRUPTED:
        return ExitCode.INTERRUPTED
    if collector.internal_errors or rc not in (0, 1) or not cases:
        for err in collector.internal_errors:
            print(err, file=sys.stderr)
        return fail(f"the gate could not run its cases (pytest exit {int(rc)})")
    print(format_table(cases))
    for c in cases:
        if c.exit_code != ExitCode.OK or c.truncated:
            print(f"\n{c.name}:\n{c.report}")
    if summary:
        Path(summary).write_text(format_summary(cases, seconds, vllm_version))
    return worst(c.exit_code for c in cases)


def default_paths() -> list[str]:
    return [str(TRACES_DIR)]
