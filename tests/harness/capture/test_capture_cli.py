"""`kvconform capture` / `anonymize`: help for each source, exit codes, one-line errors."""

import pytest

from .conftest import capture_cli


def test_help_explains_every_source(capsys):
    with pytest.raises(SystemExit) as e:
        capture_cli(["capture", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for source in ("scheduler", "engine", "plugin", "join", "kv-events", "overhead",
                   "presets"):
        assert f"\n  {source}" in out
    for words in ("Scheduler, no model", "tiny random Qwen2", "vllm serve", "array or map"):
        assert words in out


def test_presets_are_listed(capsys):
    assert capture_cli(["capture", "presets"]) == 0
    out = capsys.readouterr().out
    assert "multi-turn-chat" in out and "lora-and-salts" in out


def test_usage_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        capture_cli(["capture", "teleport"])
    assert e.value.code == 2
    assert capture_cli(["capture", "engine", "--out", str(tmp_path / "t.yaml")]) == 2
    assert capture_cli(["capture", "scheduler", "--out", str(tmp_path / "t.jsonl")]) == 2
    assert capture_cli(["capture", "join", str(tmp_path), "--out", str(tmp_path / "j.jsonl")]) == 2
    assert capture_cli(["capture", "kv-events", "--out", str(tmp_path / "k.jsonl"),
                        "--vllm-version", "0.32.0"]) == 2
    assert capture_cli(["capture", "kv-events", "--from-stream", str(tmp_path / "none"),
                        "--out", str(tmp_path / "k.jsonl"), "--vllm-version", "0.8.0"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    # One line each (the unknown source's from argparse), no traceback.
    assert len(err) == 6 and all(line.startswith("kvconform: ") for line in err)


def test_a_saved_stream_with_a_bad_line_names_file_and_line(tmp_path, capsys):
    stream = tmp_path / "s.jsonl"
    stream.write_text('{"seq": 0, "ts": 0, "events": []}\nnot json\n')
    assert capture_cli(["capture", "kv-events", "--from-stream", str(stream), "--out",
                        str(tmp_path / "k.jsonl"), "--vllm-version", "0.32.0"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"kvconform: {stream}:2: (line): not a saved batch (Expecting value: line 1 column 1 " \
        "(char 0))"


def test_plugin_says_how_to_enable_it(capsys):
    assert capture_cli(["capture", "plugin"]) == 0
    out = capsys.readouterr().out
    assert "is registered" in out and "KVCONFORM_CAPTURE_DIR=DIR vllm serve" in out
