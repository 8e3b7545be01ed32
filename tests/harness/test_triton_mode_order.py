"""Triton decides whether it is interpreted when it is first imported: a
kvconform process must make that choice before anything imports Triton
(vLLM's sizing code does, and the gate runs sizing cases and attention cases
in one worker). Each run is a fresh interpreter without the test suite's own
TRITON_INTERPRET (tests/conftest.py sets it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "golden" / "v0.32" / "engine-multi-turn-chat.jsonl"
_RUN = """
import sys
{first}
import triton  # what vLLM's sizing code and torch's inductor import
from harness.attention.differential import AttentionOptions, check_attention
o = check_attention(sys.argv[1], AttentionOptions(max_batches=1, vllm=False))
print(o.exit_code, o.error)
sys.exit(int(o.exit_code))
"""


def _attention_after(first: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", _RUN.format(first=first), str(TRACE)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="compiled Triton on a GPU")
def test_attention_runs_when_harness_is_imported_before_triton():
    done = _attention_after("import harness.gate.cases")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="compiled Triton on a GPU")
def test_negative_control_triton_imported_first_breaks_the_kernels():
    """What harness/__init__.py prevents: Triton imported before the choice,
    the kernels fail under the interpreter."""
    done = _attention_after("")
    assert done.returncode != 0 and "outside of the scope of a kernel" in done.stdout + \
        done.stderr, done.stdout + done.stderr[-2000:]
