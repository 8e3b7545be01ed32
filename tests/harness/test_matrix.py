"""make matrix and the gate against a release held to another release's
profile: the upgrade question (did 0.33 change anything 0.32's profile says?)
answered by the gate, named by bisect, and every release's row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.exit_codes import ExitCode
from harness.core.vllm_releases import RELEASES
from harness.releases.matrix.run import Row, row_from_gate
from harness.releases.matrix.table import format_markdown, format_text
from impl.profiles import get_profile, profiled_releases

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "traces" / "scenarios" / "documented-example.yaml"


def _case(name: str, mode: str, code: int, events: int = 10) -> dict:
    return {"name": name, "kind": "trace", "mode": mode, "events": events, "seconds": 0.1,
            "exit_code": code, "message": "" if code == 0 else f"{name} went wrong"}


def _gate(unverified: bool, *cases: dict) -> dict:
    return {"vllm": "0.33.0", "profile": "0.32", "profile_releases": "0.32.0",
            "unverified_profile": unverified, "seconds": 1.0, "exit_code": 0,
            "cases": list(cases)}


def test_a_row_counts_divergences_and_errors_and_attention_an_overlay_cannot_run():
    row = row_from_gate("0.33.0", _gate(True, _case("a", "diff", 0, 5),
                                        _case("b", "attention", 3),
                                        _case("w", "lockstep", 1, 7),
                                        _case("c", "replay 0.17", 2)))
    assert (row.cases, row.events, row.divergences, row.errors, row.not_run) == (3, 22, 1, 1, 1)
    assert row.exit_code == ExitCode.BAD_INPUT and row.result == "BAD INPUT"
    assert row.failed_cases == ["w (lockstep): w went wrong", "c (replay 0.17): c went wrong"]
    # Negative control: attention that ran and diverged is a divergence.
    row = row_from_gate("0.33.0", _gate(False, _case("b", "attention", 1)))
    assert (row.divergences, row.not_run, row.result) == (1, 0, "DIVERGED")
    row = row_from_gate("0.33.0", _gate(False, _case("b", "attention", 3)))
    assert row.result == "conformant"


def test_the_table_marks_an_unverified_profile_and_lists_failures():
    rows = [Row("0.32.0", "0.32", "0.32.0", False, 5, 100, seconds=3.0),
            Row("0.33.0", "0.32", "0.32.0", True, 5, 100, 1, seconds=4.0,
                exit_code=ExitCode.DIVERGED, failed_cases=["w (lockstep): diverged"])]
    md = format_markdown(rows, 7.0, 24)
    assert "| 0.33.0 | 0.32 (0.32.0), unverified profile | 5 | 100 | 1 |" in md
    assert "1 of 2 releases conformant" in md and "`w (lockstep): diverged`" in md
    assert "unverified profile" in format_text(rows).splitlines()[2]


def test_every_followed_release_is_in_the_matrix():
    assert profiled_releases() == list(RELEASES)


def _kvconform(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVCONFORM_VLLM", "KVCONFORM_ASSUME_PROFILE")}
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.vllm
def test_033_against_its_own_profile_passes_and_against_032s_the_mamba_change_fails(tmp_path):
    """The gate on the 0.33 overlay (traces cut to one, no fuzz, to stay
    short; the seeded workloads are what finds the change)."""
    def gate(name: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        out = tmp_path / name
        done = _kvconform("--vllm", "0.33.0", *extra, "gate", str(EXAMPLE), "--fuzz-seconds",
                          "0", "--jobs", "1", "--json", str(out / "gate.json"), "--summary",
                          str(out / "summary.md"), "--fuzz-out", str(out / "findings"))
        return done, json.loads((out / "gate.json").read_text())

    (tmp_path / "own").mkdir()
    done, own = gate("own")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-1000:]
    assert (own["profile"], own["unverified_profile"]) == ("0.33", False)
    assert "workload-mamba-hybrid" in {c["name"] for c in own["cases"]}

    (tmp_path / "assumed").mkdir()
    done, assumed = gate("assumed", "--assume-profile", "0.32")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-1000:]
    assert (assumed["profile"], assumed["unverified_profile"]) == ("0.32", True)
    failed = {c["name"]: c for c in assumed["cases"] if c["exit_code"] != 0}
    assert set(failed) == {"workload-mamba-hybrid"}
    assert "allocate" in failed["workload-mamba-hybrid"]["message"]
    assert "unverified profile" in done.stdout
    assert "unverified profile" in (tmp_path / "assumed" / "summary.md").read_text()

    # The finding, as a trace, names 0.33.0 when bisected from 0.32.0.
    finding = tmp_path / "assumed" / "findings" / "workload-mamba-hybrid.jsonl"
    assert f"kvconform bisect {finding} --from 0.32.0 --to 0.33.0" in done.stdout
    done = _kvconform("bisect", str(finding), "--from", "0.32.0", "--to", "0.33.0", "--json")
    assert done.returncode == 1, done.stderr[-800:]
    result = json.loads(done.stdout)
    assert (result["changed_in"], result["last_same"]) == ("0.33.0", "0.32.0")
    assert result["difference"]["op"] == "allocate"


@pytest.mark.vllm
def test_matrix_rows_come_from_each_releases_gate(tmp_path):
    done = _kvconform("matrix", str(EXAMPLE), "--releases", "0.17.1", "0.33.0",
                      "--fuzz-seconds", "0", "--jobs", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((tmp_path / "matrix.json").read_text())
    rows = {r["release"]: r for r in data["rows"]}
    assert set(rows) == {"0.17.1", "0.33.0"}
    for release, profile in (("0.17.1", "0.17"), ("0.33.0", "0.33")):
        assert (rows[release]["profile"], rows[release]["result"]) == (profile, "conformant")
        assert rows[release]["cases"] >= 13 and rows[release]["events"] > 0
        assert (tmp_path / release / "junit.xml").exists()
    # (The profile's range is derived: a later release joining it widens it.)
    assert f"| 0.33.0 | 0.33 ({get_profile('0.33').releases}) |" in (
        tmp_path / "matrix.md").read_text()
    assert "kvconform: matrix [2/2] vLLM 0.33.0" in done.stderr


def test_matrix_refuses_an_unknown_release_in_one_line(tmp_path):
    done = _kvconform("matrix", "--releases", "0.9", "--out", str(tmp_path), timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "0.9" in done.stderr
