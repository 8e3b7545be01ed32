"""The command line: exit codes, one-line errors, every trace reported."""

import json
import subprocess
import sys
from pathlib import Path

from harness.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "scenarios" / "documented-example.yaml"
HEADER = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
          "cache": {"num_blocks": 8, "groups": [{"block_size": 4}]}}


def test_conformant_replay_exits_0(capsys):
    assert main(["replay", str(EXAMPLE)]) == 0
    assert "conformant, 18 events" in capsys.readouterr().out


def test_bad_trace_is_one_line_exit_2_and_others_still_run(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n" + '{"op": "lookup", "req": "nobody"}\n')
    code = main(["replay", str(bad), str(EXAMPLE)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == [f"{bad}:2: req: no request 'nobody' (not added, or "
                                        "already freed)"]
    assert f"{EXAMPLE}: conformant" in out


def test_pathological_json_is_one_line_exit_2_and_others_still_run(tmp_path, capsys):
    """Issue 15: nesting thousands deep, an integer of millions of digits."""
    head = json.dumps(HEADER) + "\n"
    deep = tmp_path / "deep.jsonl"
    deep.write_text(head + '{"op":"step","answer":' + "[" * 100_000 + "]" * 100_000 + "}\n")
    huge = tmp_path / "huge.jsonl"
    huge.write_text(head + '{"op":"step","answer":{"n":' + "1" * 2_000_000 + "}}\n")
    code = main(["replay", str(deep), str(huge), str(EXAMPLE)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == [
        f"{deep}:2: (line): not valid JSON: nested too deeply",
        f"{huge}:2: (line): not valid JSON: an integer too large to read"]
    assert f"{EXAMPLE}: conformant" in out


def test_unsupported_version_exit_3(tmp_path, capsys):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({**HEADER, "vllm_version": "0.8.5"}) + "\n")
    assert main(["replay", str(old)]) == 3
    assert "0.8.5 has no profile" in capsys.readouterr().err


def test_worst_exit_code_wins(tmp_path, capsys):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({**HEADER, "vllm_version": "0.8.5"}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["replay", str(bad), str(old)]) == 3


def test_json_output(capsys):
    assert main(["replay", "--json", str(EXAMPLE)]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["exit_code"] == 0 and result["events"] == 18


def test_usage_errors_exit_2(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["replay"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["teleport"])
    assert e.value.code == 2
    assert main(["replay", "/nonexistent/folder/"]) == 2


def test_no_traceback_from_the_console_script(tmp_path):
    binary = tmp_path / "junk.jsonl"
    binary.write_bytes(b"\x00\x01\x02\xff\xfe")
    proc = subprocess.run([sys.executable, "-m", "harness.cli.main", "replay", str(binary)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"{binary}:1: (line): not UTF-8 text (byte 0xff at column 4)"


def test_fuzz_finding_exit_1_names_the_file(tmp_path, capsys):
    # Seed 2 finds it in its fifth case; no time limit that a loaded machine could hit.
    code = main(["fuzz", "--seconds", "86400", "--max-cases", "400", "--seed", "2",
                 "--out", str(tmp_path), "--inject-fault", "longest-hit-off-by-one"])
    out = capsys.readouterr().out
    assert code == 1
    (written,) = list(tmp_path.iterdir())
    assert f"written to {written}" in out and f"kvconform replay {written}" in out


def test_fuzz_usage_errors(tmp_path, capsys):
    assert main(["fuzz", "--seconds", "0"]) == 2
    assert main(["fuzz", "--max-cases", "0"]) == 2
    assert main(["fuzz", "--inject-fault", "nope"]) == 2
    bad = tmp_path / "fuzz.yaml"
    bad.write_text("blok_sizes: [4]\n")
    assert main(["fuzz", "--config", str(bad), "--seconds", "1"]) == 2
    assert "unknown fuzz config key" in capsys.readouterr().err


def test_fuzz_without_vllm_is_exit_3(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert main(["fuzz", "--seconds", "1"]) == 3
    assert "vLLM is not installed" in capsys.readouterr().err


def test_ray_verbs_without_ray_say_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["fuzz", "--ray", "--max-cases", "1"]) == 3
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
    assert main(["gate", "--ray", "--fuzz-seconds", "0"]) == 3
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
