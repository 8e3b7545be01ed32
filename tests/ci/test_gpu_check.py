"""ci/gpu_check.py keeps working: `make gpu-check DRY=1` (vLLM's Triton
kernels copied into a bundle, then impl's and vLLM's kernels run side by side
under the interpreter at toy sizes) prints the documented table and passes,
importing vLLM from the bundle only; without a GPU the real run is a no-op."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "gpu_check.py"


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_the_bundle_holds_vllms_kernels_and_stand_ins_only(tmp_path):
    bundle = tmp_path / "vllm_kernels"
    r = _run(ROOT / "ci" / "vllm_triton_bundle.py", bundle)
    assert r.returncode == 0, r.stdout + r.stderr
    ops = bundle / "vllm" / "v1" / "attention" / "ops"
    assert {p.name for p in ops.glob("*.py")} >= {
        "triton_unified_attention.py", "triton_reshape_and_cache_flash.py"}
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < 1 << 20
    manifest = (bundle / "MANIFEST.txt").read_text()
    assert manifest.startswith("vLLM 0.32") and "stand-in" in manifest


def test_make_gpu_check_dry_compares_impl_with_vllms_kernels_from_the_bundle(tmp_path):
    """`make gpu-check DRY=1`: builds .gpu-check/vllm_kernels, then runs both
    kernels side by side under the interpreter (the venv's install stamp is
    taken as up to date: `make test` has just made it)."""
    rows_json = tmp_path / "rows.json"
    r = subprocess.run(["make", "-s", "-o", ".venv/.kvconform-installed", "gpu-check", "DRY=1",
                        f"GPU_CHECK_ARGS=--json {rows_json}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bundle = ROOT / ".gpu-check" / "vllm_kernels"
    assert (bundle / "MANIFEST.txt").exists()
    lines = [line for line in r.stdout.strip().splitlines()
             if not line.startswith("vllm_triton_bundle:")]
    assert lines[0].startswith("kvconform gpu-check: ") and str(bundle) in lines[0]
    assert lines[1].split()[:3] == ["kernel", "op", "case"]
    assert lines[-1].endswith(" s") and " 0 failed" in lines[-1]
    doc = json.loads(rows_json.read_text())
    assert doc["vllm_kernels"].startswith(str(bundle))
    rows = doc["rows"]
    pairs = {(row["kernel"], row["op"], row["case"], row["kv"]) for row in rows}
    for row in rows:
        if row["op"] in ("attention", "reshape_and_cache"):
            other = "vllm" if row["kernel"] == "impl" else "impl"
            assert (other, row["op"], row["case"], row["kv"]) in pairs
    attention = [row for row in rows if row["op"] == "attention"]
    assert {row["kv"] for row in attention} == {"float32", "fp8_e4m3"}
    assert {row["case"].split()[0] for row in attention} == {"decode", "prefill"}
    assert all(row["result"] == "ok" and row["worst_ratio"] <= 1 for row in attention)
    assert len(lines) == 2 + len(rows) + 1


def test_the_real_run_needs_vllms_kernels(tmp_path):
    """Pointed at a bundle that is not there, vLLM is imported from wherever
    it is installed and refused: exit 3 (environment), no table."""
    env_missing = tmp_path / "nowhere"
    r = _run(SCRIPT, "--device", "cpu", "--tiny", "--vllm-kernels", env_missing,
             "--no-pytest")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "UNAVAILABLE" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="a GPU is here: the real run is `make gpu-check` itself")
def test_without_a_gpu_it_does_nothing_and_succeeds():
    r = _run(SCRIPT, "--no-pytest")
    assert r.returncode == 0 and "no CUDA GPU" in r.stdout
