"""`kvconform peer --matrix` (make peer-matrix): every profiled release's own
KV-cache tests, one release after another, each in a `kvconform --vllm V
peer` subprocess (an overlay is chosen before anything imports vllm, so one
process per release); pytest-xdist runs inside each. One row per release
from its OUT/V/summary.json, in OUT/matrix.md and OUT/matrix.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.core.exit_codes import ExitCode, worst
from impl.profiles import UnsupportedVersion, get_profile

# One release's two pytest runs, generously bounded (a loaded 2-core machine).
RELEASE_TIMEOUT_S = 3600


@dataclass(slots=True)
class PeerRow:
    release: str
    profile: str
    vllm_passed: int = 0
    impl_passed: int = 0
    impl_failed: int = 0
    not_applicable: dict[str, int] = field(default_factory=dict)
    not_runnable_on_vllm: int = 0  # tests (or files) that do not pass on the release itself
    files_not_in_sdist: int = 0
    seconds: float = 0.0
    exit_code: int = ExitCode.OK
    problem: str = ""  # one line when the release's run wrote no summary

    @property
    def not_applicable_total(self) -> int:
        return sum(self.not_applicable.values())

    @property
    def share(self) -> str:
        return f"{100 * self.impl_passed / self.vllm_passed:.1f}%" if self.vllm_passed else "-"




def row_from_summary(release: str, summary: dict, seconds: float, exit_code: int) -> PeerRow:
    return PeerRow(release, get_profile(release).name, summary["vllm_passed"],
                   summary["impl_passed"], summary["impl_failed"],
                   dict(summary["not_applicable"]), len(summary.get("not_runnable_on_vllm", ())),
                   len(summary.get("files_not_in_sdist", ())), round(seconds, 1), int(exit_code))


def run_release(release: str, out: Path, workers: str, rerun_vllm: bool = False,
                tests: list[str] | None = None) -> PeerRow:
    folder = out / release
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "harness.cli.main", "--vllm", release, "peer",
           "--out", str(out), "-n", workers, *(["--rerun-vllm"] if rerun_vllm else []),
           *(tests or ())]
    env = {k: v for k, v in os.environ.items() if k not in ("KVCONFORM_VLLM", "PYTHONPATH")}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    print(f"peer-matrix: vLLM {release} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(folder / "peer.log", "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=RELEASE_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.perf_counter() - t0
    summary = folder / "summary.json"
    if code is None or not summary.exists():
        tail = (folder / "peer.log").read_text().strip().splitlines()[-1:] or ["no output"]
        problem = "timed out" if code is None else tail[0][:160]
        return PeerRow(release, get_profile(release).name, seconds=round(seconds, 1),
                       exit_code=ExitCode.ENVIRONMENT, problem=problem)
    return row_from_summary(release, json.loads(summary.read_text()), seconds, code)


def markdown(rows: list[PeerRow], seconds: float | None = None) -> str:
    lines = ["# kvconform peer matrix: every release's own KV-cache tests on impl", "",
             "Each release's tests (its sdist's tests/v1/core KV-cache files) run first on "
             "the release itself through its overlay, then on impl with the release's "
             "profile. *impl %*: impl passed / passed on vLLM. *not runnable on vLLM*: tests "
             "or files that do not pass on the release's overlay (in no impl count; listed "
             "in V/summary.md).", "",
             "| release | profile | passed on vLLM | impl passed | impl % | impl failed "
             "| not applicable | not runnable on vLLM | files not in sdist | seconds |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.problem:
            lines.append(f"| {r.release} | {r.profile} | not run: {r.problem.replace('|', '/')} "
                         f"| | | | | | | {r.seconds:.0f} |")
            continue
        lines.append(f"| {r.release} | {r.profile} | {r.vllm_passed} | {r.impl_passed} "
                     f"| {r.share} | {r.impl_failed} | {r.not_applicable_total} "
                     f"| {r.not_runnable_on_vllm} | {r.files_not_in_sdist} | {r.seconds:.0f} |")
    lines += ["", "## Not applicable, by reason", "", "| release | reason | tests |",
              "|---|---|---:|"]
    for r in rows:
        for reason, n in r.not_applicable.items():
            lines.append(f"| {r.release} | {reason.replace('|', '/')} | {n} |")
    if seconds is not None:
        lines += ["", f"{len(rows)} releases in {seconds / 60:.1f} min."]
    return "\n".join(lines) + "\n"


def write(rows: list[PeerRow], out: Path, seconds: float | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"releases": [dict(asdict(r), not_applicable_total=r.not_applicable_total)
                         for r in rows], "seconds": None if seconds is None else round(seconds, 1)}
    (out / "matrix.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "matrix.md").write_text(markdown(rows, seconds))


def main(releases: list[str], out: Path, workers: str = "auto", rerun_vllm: bool = False,
         tests: list[str] | None = None) -> int:
    for release in releases:
        try:
            get_profile(release)
        except UnsupportedVersion as e:
            print(f"kvconform peer: {e}", file=sys.stderr)
            return ExitCode.ENVIRONMENT
    t0 = time.perf_counter()
    rows = []
    for release in releases:
        rows.append(run_release(release, out, workers, rerun_vllm, tests))
        write(rows, out, time.perf_counter() - t0)  # a partial matrix survives a stop
    seconds = time.perf_counter() - t0
    write(rows, out, seconds)
    print(markdown(rows, seconds))
    print(f"peer-matrix: {out / 'matrix.md'}, {out / 'matrix.json'}", file=sys.stderr)
    return worst(ExitCode(r.exit_code) for r in rows) if rows else ExitCode.OK
