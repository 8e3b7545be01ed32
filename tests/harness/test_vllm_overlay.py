"""Overlays: a vLLM release's Python on this venv, and `kvconform --vllm`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.releases.vllm_overlay import OverlayError, _kept, activate, ensure

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "traces" / "scenarios"


def _kvconform(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})


def test_trimming_keeps_python_and_data_and_drops_compiled_code(tmp_path):
    files = {
        "vllm/__init__.py": b"", "vllm/v1/core/block_pool.py": b"x = 1",
        "vllm/transformers_utils/chat.jinja": b"{{ x }}", "vllm/config.json": b"{}",
        "vllm/_C.abi3.so": b"\x7fELF...", "vllm/vllm-rs": b"\x7fELF...",
        "vllm/third_party/cute/mma.hpp": b"//", "vllm/static/ui.js": b"//",
        "vllm-0.33.0.dist-info/METADATA": b"Version: 0.33.0",
        "vllm-0.33.0.dist-info/RECORD": b"...", "bin/vllm": b"#!",
    }
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    kept = sorted(str(p.relative_to(tmp_path)) for p in _kept(tmp_path))
    assert kept == ["vllm-0.33.0.dist-info/METADATA", "vllm/__init__.py", "vllm/config.json",
                    "vllm/transformers_utils/chat.jinja", "vllm/v1/core/block_pool.py"]


def test_the_017_overlay_is_small_and_imports_as_017():
    info = ensure("0.17.1", progress=False)
    assert info.bytes < 200e6 < info.wheel_bytes
    assert not list(info.path.rglob("*.so"))
    done = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                          env={**os.environ, "PYTHONPATH": str(info.path)},
                          capture_output=True, text=True, timeout=600)
    assert done.stdout.strip() == "0.17.1", done.stderr[-500:]


def test_activate_refuses_once_vllm_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", object())
    with pytest.raises(OverlayError, match="already imported"):
        activate("0.17.1", progress=False)


def test_kvconform_vllm_runs_a_verb_on_that_release():
    ensure("0.17.1", progress=False)
    done = _kvconform("--vllm", "0.17.1", "replay", "--backend", "vllm",
                      str(SCENARIOS / "documented-example-v0.17.yaml"))
    assert done.returncode == 0, done.stderr[-800:]
    assert "conformant, 18 events" in done.stdout


def test_the_environment_variable_works_like_the_option_and_a_minor_names_its_release():
    ensure("0.17.1", progress=False)
    done = _kvconform("replay", "--backend", "vllm", str(SCENARIOS / "documented-example.yaml"),
                      env={"KVCONFORM_VLLM": "0.17"})
    # The 0.32 trace on vLLM 0.17.1: the environment is wrong for it, one line, exit 3.
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"{SCENARIOS / 'documented-example.yaml'}:1: vllm_version: the trace wants vLLM 0.32 "
        "but vLLM 0.17.1 is installed"]


def test_an_unknown_release_is_one_line_exit_2():
    done = _kvconform("--vllm", "0.99", "replay", str(SCENARIOS / "documented-example.yaml"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "kvconform: --vllm: vLLM 0.99: no followed release of that minor (give the full "
        "version)"]
