"""`kvconform peer --matrix`: the table from per-release summaries (fake
ones: no test run), and its refusals, each one line: a release without a
profile (exit 3), a string that is no version (exit 2). Seconds, no vLLM run."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.core.exit_codes import ExitCode
from harness.peer import matrix, run


def _summary(vllm_passed, impl_passed, impl_failed, na, not_runnable=0, lacking=()):
    return {"vllm_version": "x", "vllm_passed": vllm_passed, "impl_passed": impl_passed,
            "impl_failed": impl_failed, "not_applicable": na, "files": {},
            "not_runnable_on_vllm": [{"nodeid": f"t::n{i}"} for i in range(not_runnable)],
            "files_not_in_sdist": list(lacking)}


def test_table_from_fake_summaries(tmp_path):
    rows = [
        matrix.row_from_summary("0.17.1", _summary(109, 100, 2, {"never reaches impl": 7},
                                                   not_runnable=10, lacking=("a.py", "b.py")),
                                12.0, ExitCode.DIVERGED),
        matrix.row_from_summary("0.33.0", _summary(640, 620, 0, {"reads vLLM-private X": 20}),
                                30.0, ExitCode.OK),
    ]
    matrix.write(rows, tmp_path, 42.0)
    md = (tmp_path / "matrix.md").read_text()
    assert "| 0.17.1 | 0.17 | 109 | 100 | 91.7% | 2 | 7 | 10 | 2 | 12 |" in md
    assert "| 0.33.0 | 0.33 | 640 | 620 | 96.9% | 0 | 20 | 0 | 0 | 30 |" in md
    assert "| 0.33.0 | reads vLLM-private X | 20 |" in md
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert [r["release"] for r in data["releases"]] == ["0.17.1", "0.33.0"]
    assert data["releases"][0]["not_applicable_total"] == 7
    assert data["releases"][0]["exit_code"] == ExitCode.DIVERGED


def test_row_of_a_release_that_wrote_no_summary_says_why(tmp_path):
    row = matrix.PeerRow("0.25.1", "0.25", exit_code=ExitCode.ENVIRONMENT, problem="no sdist")
    assert "not run: no sdist" in matrix.markdown([row])


def test_present_splits_the_files_a_release_lacks(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "a.py").write_text("")
    assert run.present(tmp_path, ["tests/a.py::t", "tests/b.py"]) == (["tests/a.py::t"],
                                                                       ["tests/b.py"])


@pytest.mark.parametrize("argv, code", [
    (["peer", "--matrix", "--releases", "0.16.0"], ExitCode.ENVIRONMENT),
    (["peer", "--matrix", "--releases", "nonsense"], ExitCode.BAD_INPUT),
    (["peer", "--releases", "0.25.1"], ExitCode.BAD_INPUT),
])
def test_refusals_are_one_line(argv, code, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing ran
