"""`--backend exec:CMD` (specs/FOREIGN_BACKEND.md): the example Node.js backend
is conformant, against vLLM, on every bundled trace its capabilities cover;
its injected bug is caught by the gate (exit 1, naming the event); a backend
that crashes, hangs or speaks another protocol is a clear error, never a hang
nor a divergence; a trace outside its capabilities is "not covered"."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from harness.backends.exec_backend import TIMEOUT_ENV
from harness.core.exit_codes import ExitCode
from harness.report.text import verdict_of
from harness.sources.replay import check_trace
from harness.trace import find_traces

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_BACKEND = os.path.join(ROOT, "examples", "foreign-backend-node", "backend.js")
NODE = f"exec:node {NODE_BACKEND}"
EXAMPLE = os.path.join(ROOT, "traces", "scenarios", "documented-example.yaml")
MAMBA = os.path.join(ROOT, "traces", "scenarios", "mamba-align.yaml")

needs_node = pytest.mark.skipif(shutil.which("node") is None,
                                reason="node (Node.js) is not installed: the example "
                                "foreign backend cannot run")


def _fake(tmp_path, body: str) -> str:
    """A foreign backend in Python that misbehaves as `body` says."""
    script = tmp_path / "fake_backend.py"
    script.write_text(textwrap.dedent("""\
        import json, sys, time
        def say(m):
            sys.stdout.write(json.dumps(m) + "\\n"); sys.stdout.flush()
        CAPS = {"profiles": ["0.32"], "kinds": ["full_attention"], "hash_algos": ["sha256"],
                "ops": ["add_request", "lookup", "allocate", "append_tokens", "free",
                        "checkpoint"],
                "checkpoint_fields": ["free_queue"]}
        """) + textwrap.dedent(body))
    return f"exec:{sys.executable} {script}"


# -- conformance against vLLM --------------------------------------------------------


@needs_node
@pytest.mark.vllm
def test_node_backend_is_conformant_on_every_trace_it_covers():
    """Every bundled trace of the installed vLLM's release is diffed (vLLM
    beside the Node backend); the ones it covers agree with vLLM and with the
    recorded answers, the others are 'not covered', never a pass."""
    covered, not_covered = [], []
    for path in find_traces([os.path.join(ROOT, "traces")]):
        o = check_trace(path, ["vllm", NODE], explicit=False)
        if o.skipped:
            continue
        if o.not_covered:
            assert verdict_of(o) == f"not covered by {NODE}"
            assert o.exit_code == ExitCode.OK and o.divergence is None
            not_covered.append(path)
            continue
        assert o.exit_code == ExitCode.OK, (path, o.error, o.divergence)
        assert o.num_events > 0
        covered.append(path)
    # Full attention with sha256 / sha256_cbor: the golden 0.32 captures and
    # the plain scenarios (21 of them when this was written).
    assert len(covered) >= 15 and not_covered
    assert any("golden" in p for p in covered)
    assert any(p.endswith("hash-sha256_cbor.yaml") for p in covered)


def _table(out: str) -> dict[str, str]:
    """The gate table's rows by case name (the table comes before the reports)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case "))
    rows: dict[str, str] = {}
    for line in lines[start + 2:]:
        if line.strip():
            rows.setdefault(line.split()[0], line)
    return rows


@needs_node
@pytest.mark.vllm
def test_gate_catches_the_injected_eviction_order_bug(tmp_path):
    """Negative control: the bug frees a request's blocks head first; the
    gate exits 1 and names the event, in the trace and in the fuzz slices of
    full attention (through the Node backend); without the bug it passes,
    the slices of kinds it does not implement "not covered"."""
    cmd = [sys.executable, "-m", "harness.cli.main", "gate", "--backend", NODE, "--jobs", "1",
           "--fuzz-seconds", "1", "--fuzz-out", str(tmp_path), "--no-workloads",
           EXAMPLE, MAMBA]
    env = {**os.environ, "PYTHONPATH": ROOT}
    good = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    rows = _table(good.stdout)
    assert rows["fuzz[full_attention,seed=0]"].endswith("conformant")
    assert rows["fuzz[mamba,seed=0]"].endswith(f"not covered by {NODE}")
    assert "TOO FEW CASES" not in good.stdout
    assert "not covered by" in rows[os.path.relpath(MAMBA, ROOT)]
    bad = subprocess.run(cmd, cwd=ROOT, env={**env, "KVCONFORM_NODE_BUG": "eviction-order"},
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == ExitCode.DIVERGED, bad.stdout + bad.stderr
    assert "diverged at event #11 (checkpoint), field free_queue[4]" in bad.stdout
    rows = _table(bad.stdout)
    assert rows["fuzz[full_attention,seed=0]"].endswith("DIVERGED")
    assert f"replay it: kvconform replay --backend '{NODE}' {tmp_path}" in bad.stdout


# -- what the foreign backend's capabilities leave out -----------------------------------


@needs_node
def test_a_kind_it_does_not_implement_is_not_covered():
    o = check_trace(MAMBA, [NODE])
    assert o.not_covered == f"not covered by {NODE}: kind mamba"
    assert o.exit_code == ExitCode.OK and o.num_events == 0


@needs_node
def test_replay_that_covers_nothing_is_exit_3():
    cmd = [sys.executable, "-m", "harness.cli.main", "replay", "--backend", NODE, MAMBA]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == ExitCode.ENVIRONMENT, r.stdout + r.stderr
    assert "covers none of them" in r.stderr


# -- a foreign process that fails --------------------------------------------------------


def test_a_backend_that_crashes_is_an_error_naming_the_event(tmp_path):
    backend = _fake(tmp_path, """\
        say({"kvconform_foreign_backend": 1, "capabilities": CAPS})
        for line in sys.stdin:
            m = json.loads(line)
            if m["type"] == "start":
                say({"ok": True})
            else:
                print("fake backend: out of cheese", file=sys.stderr)
                sys.exit(9)
        """)
    o = check_trace(EXAMPLE, [backend])
    assert o.exit_code == ExitCode.ENVIRONMENT and o.divergence is None
    message = str(o.error)
    assert "exited with code 9 at event #0 (add_request)" in message
    assert "out of cheese" in message  # its stderr, kept for the report
    assert message.startswith(f"{EXAMPLE}:") and ": backend: " in message


def test_a_backend_that_hangs_is_killed_after_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    backend = _fake(tmp_path, """\
        say({"kvconform_foreign_backend": 1, "capabilities": CAPS})
        for line in sys.stdin:
            m = json.loads(line)
            if m["type"] == "start":
                say({"ok": True})
            else:
                time.sleep(3600)
        """)
    o = check_trace(EXAMPLE, [backend])
    assert o.exit_code == ExitCode.ENVIRONMENT and o.divergence is None
    assert "no answer within 0.5 s at event #0 (add_request)" in str(o.error)


def test_a_wrong_protocol_version_is_bad_input(tmp_path):
    backend = _fake(tmp_path, """\
        say({"kvconform_foreign_backend": 2, "capabilities": CAPS})
        sys.stdin.read()
        """)
    o = check_trace(EXAMPLE, [backend])
    assert o.exit_code == ExitCode.BAD_INPUT
    assert "speaks protocol 2" in str(o.error) and "kvconform speaks 1" in str(o.error)


def test_a_line_that_is_not_json_is_bad_input(tmp_path):
    backend = _fake(tmp_path, """\
        say({"kvconform_foreign_backend": 1, "capabilities": CAPS})
        for line in sys.stdin:
            m = json.loads(line)
            if m["type"] == "start":
                say({"ok": True})
            else:
                sys.stdout.write("hello there\\n"); sys.stdout.flush()
        """)
    o = check_trace(EXAMPLE, [backend])
    assert o.exit_code == ExitCode.BAD_INPUT
    assert "not a JSON object at event #0 (add_request)" in str(o.error)


def test_a_command_that_does_not_exist_is_the_environment(tmp_path):
    o = check_trace(EXAMPLE, [f"exec:{tmp_path}/no-such-backend"])
    assert o.exit_code == ExitCode.ENVIRONMENT
    assert "cannot start" in str(o.error)
