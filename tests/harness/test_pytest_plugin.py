"""`pytest traces/` collects and runs every bundled trace (and only traces)."""

import subprocess
import sys
from pathlib import Path

from harness.trace import open_trace

ROOT = Path(__file__).resolve().parents[2]


def test_collects_every_bundled_trace():
    traces = sorted(p for p in (ROOT / "traces").rglob("*")
                    if p.suffix in (".jsonl", ".yaml", ".yml")
                    and "kvconform-trace/1" in p.read_text(errors="replace")[:4096])
    proc = subprocess.run([sys.executable, "-m", "pytest", "traces", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    # A sizing corpus (traces/sizing/) is a case per model shape, no trace.
    shapes = [c for c in collected if c.startswith("traces/sizing/")]
    collected = [c for c in collected if not c.startswith("traces/sizing/")]
    assert len(shapes) >= 40
    # Each trace once, again as a worker case, and as an attention case and a
    # sizing case when it has a model header.
    with_model = [p for p in traces if open_trace(str(p)).header.model is not None]
    plain = [c for c in collected if not c.endswith(("[attention]", "[sizing]", "[worker]"))]
    assert len(plain) == len(traces) >= 14
    assert sorted(c.split("::")[0] for c in collected if c.endswith("[worker]")) == sorted(
        str(p.relative_to(ROOT)) for p in traces)
    for suffix in ("[attention]", "[sizing]"):
        assert sorted(c.split("::")[0] for c in collected if c.endswith(suffix)) == sorted(
            str(p.relative_to(ROOT)) for p in with_model)
    assert len(with_model) >= 3


def test_a_failing_trace_fails_with_the_report(tmp_path):
    src = ROOT / "traces" / "scenarios" / "exact-block-multiple.yaml"
    text = src.read_text().replace("answer: {hit_tokens: 4, block_ids: [[1]]}",
                                   "answer: {hit_tokens: 8, block_ids: [[1, 2]]}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pytest", str(bad), "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{bad}:" in proc.stdout and "hit_tokens" in proc.stdout
