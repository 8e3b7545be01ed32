"""ci/gpu_check.py keeps working: its toy-size CPU run (interpreter) prints the
documented table and passes; without a GPU the real run is a no-op."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "gpu_check.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_tiny_cpu_run_prints_the_documented_table(tmp_path):
    r = _run("--device", "cpu", "--tiny", "--json", str(tmp_path / "rows.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("kvconform gpu-check: ") and "copy bandwidth" in lines[0]
    assert lines[1].split()[:3] == ["kernel", "case", "dtype"]
    assert lines[-1].endswith(" s") and " 0 failed" in lines[-1]
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    kernels = {row["kernel"] for row in rows}
    assert {"reshape_and_cache", "unified_attention", "torch_sdpa (dense)", "copy_blocks",
            "swap_blocks"} <= kernels
    assert all(row["result"] in ("ok", "timing") for row in rows)
    assert len(lines) == 2 + len(rows) + 1


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="a GPU is here: the real run is `make gpu-check` itself")
def test_without_a_gpu_it_does_nothing_and_succeeds():
    r = _run("--no-pytest")
    assert r.returncode == 0 and "no CUDA GPU" in r.stdout
