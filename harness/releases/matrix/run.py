"""Running the gate on every profiled release: one `kvconform --vllm V gate`
subprocess per release (its overlay built first when missing), each writing
its cases as JSON, which become the release's row.

The overlays are block-level only (vLLM's Python, no compiled ops, no engine):
the attention cases of traces with a `model` header are an environment result
there, which a row counts as not run rather than as a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.exit_codes import ExitCode, worst
from harness.core.vllm_releases import resolve
from harness.releases.vllm_overlay import ensure
from impl.profiles import get_profile

# One release's gate, generously bounded (a loaded 2-core machine).
RELEASE_TIMEOUT_S = 3600


@dataclass(slots=True)
class Row:
    """One release's gate run, as the matrix shows it."""

    release: str
    profile: str  # the profile's name ("0.24")
    profile_releases: str  # what that profile was checked against
    unverified: bool  # held to another release's profile (--assume-profile)
    cases: int = 0
    events: int = 0
    divergences: int = 0  # cases that diverged (exit 1)
    errors: int = 0  # cases that could not be checked (bad input, the environment)
    not_run: int = 0  # attention cases an overlay cannot run (no attention ops)
    seconds: float = 0.0
    exit_code: ExitCode = ExitCode.OK
    # What the gate itself said when it did not run its cases (one line).
    problem: str = ""
    failed_cases: list[str] = field(default_factory=list)

    @property
    def result(self) -> str:
        if self.problem:
            return f"not run: {self.problem}"
        if self.exit_code == ExitCode.OK:
            return "conformant"
        return {ExitCode.DIVERGED: "DIVERGED", ExitCode.BAD_INPUT: "BAD INPUT",
                ExitCode.ENVIRONMENT: "ENVIRONMENT",
                ExitCode.INTERRUPTED: "INTERRUPTED"}[self.exit_code]




def row_from_gate(release: str, data: dict) -> Row:
    """A release's row from its gate's JSON (harness/gate/run.py cases_json)."""
    row = Row(release, data["profile"], data["profile_releases"], data["unverified_profile"],
              seconds=data["seconds"])
    codes = []
    for case in data["cases"]:
        code = ExitCode(case["exit_code"])
        if case["mode"] == "attention" and code == ExitCode.ENVIRONMENT:
            row.not_run += 1
            continue
        row.cases += 1
        row.events += case["events"]
        codes.append(code)
        if code == ExitCode.DIVERGED:
            row.divergences += 1
        elif code != ExitCode.OK:
            row.errors += 1
        if code != ExitCode.OK:
            row.failed_cases.append(f"{case['name']} ({case['mode']}): {case['message']}")
    row.exit_code = worst(codes)
    return row


def run_release(release: str, out_dir: Path, fuzz_seconds: float, fuzz_seed: int,
                jobs: str, assume_profile: str | None = None, paths: list[str] = (),
                progress: bool = True) -> Row:
    """The gate against one release's overlay; its reports in out_dir/RELEASE/."""
    ensure(release, progress)
    folder = out_dir / release
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "gate.json"
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "harness.cli.main", "--vllm", release]
    if assume_profile:
        cmd += ["--assume-profile", assume_profile]
    cmd += ["gate", *paths, "--fuzz-seconds", f"{fuzz_seconds:g}", "--fuzz-seed", str(fuzz_seed),
            "--fuzz-out", str(folder / "findings"), "--jobs", jobs, "--json", str(results),
            "--junit", str(folder / "junit.xml"), "--summary", str(folder / "summary.md")]
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVCONFORM_VLLM", "KVCONFORM_ASSUME_PROFILE", "PYTHONPATH")}
    t0 = time.perf_counter()
    with open(folder / "gate.log", "w") as log:
        try:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=RELEASE_TIMEOUT_S)
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    seconds = time.perf_counter() - t0
    if results.exists():
        row = row_from_gate(release, json.loads(results.read_text()))
        row.seconds = seconds
        return row
    profile = get_profile(assume_profile or release)
    row = Row(release, profile.name, profile.releases,
              bool(assume_profile) and not profile.covers(release), seconds=seconds,
              exit_code=ExitCode.ENVIRONMENT)
    if returncode is None:
        row.problem = f"no result within {RELEASE_TIMEOUT_S} s"
    else:
        lines = [x for x in (folder / "gate.log").read_text().splitlines() if x.strip()]
        row.problem = (lines[-1] if lines else f"exit {returncode}").removeprefix("kvconform: ")
        if returncode in (ExitCode.BAD_INPUT, ExitCode.ENVIRONMENT, ExitCode.INTERRUPTED):
            row.exit_code = ExitCode(returncode)
    return row


def run_matrix(releases: list[str], out_dir: Path, fuzz_seconds: float, fuzz_seed: int,
               jobs: str, assume_profile: str | None = None, paths: list[str] = (),
               progress: bool = True) -> list[Row]:
    rows = []
    for n, release in enumerate(releases, 1):
        release = resolve(release)
        ensure(release, progress)  # built first when missing, with its own progress
        if progress:
            print(f"kvconform: matrix [{n}/{len(releases)}] vLLM {release} ...",
                  file=sys.stderr, end="", flush=True)
        row = run_release(release, out_dir, fuzz_seconds, fuzz_seed, jobs, assume_profile,
                          paths, progress=False)
        rows.append(row)
        if progress:
            print(f" {row.cases} cases, {row.events:,} events, {row.result} "
                  f"({row.seconds:.0f} s)", file=sys.stderr, flush=True)
    return rows
