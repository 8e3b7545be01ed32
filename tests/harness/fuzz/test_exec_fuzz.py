"""`kvconform fuzz --backend exec:CMD`: the example Node.js backend beside
vLLM finds nothing on full attention, sliding windows and their hybrid; with
its injected bug the campaign finds a divergence, shrinks it and writes a
trace that replays as one; a
config outside its capabilities is "not covered" (never a pass); a backend
that cannot restart gets a process per case and a bounded shrink; a backend
that dies or hangs is one line. Campaigns are bounded by cases."""

import os
import shutil
import sys
import textwrap

import pytest

from harness.backends.base import BackendStopped
from harness.backends.exec_backend import TIMEOUT_ENV
from harness.core.exit_codes import ExitCode
from harness.fuzz.campaign import EXEC_SHRINK_CHECKS, UNCOVERED_STOP, fuzz
from harness.fuzz.generate import FuzzConfig
from harness.report.text import format_failure
from harness.sources.replay import check_trace
from impl.profiles import get_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
NODE_BACKEND = os.path.join(ROOT, "examples", "foreign-backend-node", "backend.js")
NODE = f"exec:node {NODE_BACKEND}"
BUG = "KVCONFORM_NODE_BUG"
P = get_profile("0.32")
NO_TIME_LIMIT = float("inf")
# What the example covers: full attention, sha256 and sha256_cbor.
COVERED = FuzzConfig(hash_algos=("sha256", "sha256_cbor"))

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(shutil.which("node") is None,
                                 reason="node (Node.js) is not installed: the example "
                                 "foreign backend cannot run")]


def _no_restart(tmp_path) -> str:
    """The node backend behind a proxy whose hello leaves out `restart`:
    a backend that serves one run per process."""
    script = tmp_path / "one_run.py"
    script.write_text(textwrap.dedent(f"""\
        import json, subprocess, sys, threading
        child = subprocess.Popen(["node", {NODE_BACKEND!r}], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
        hello = json.loads(child.stdout.readline())
        hello["capabilities"].pop("restart")
        sys.stdout.write(json.dumps(hello) + "\\n"); sys.stdout.flush()
        def down():
            for line in sys.stdin.buffer:
                child.stdin.write(line); child.stdin.flush()
            child.stdin.close()
        threading.Thread(target=down, daemon=True).start()
        for line in child.stdout:
            sys.stdout.buffer.write(line); sys.stdout.flush()
        """))
    return f"exec:{sys.executable} {script}"


@pytest.mark.parametrize("kind", ["full_attention", "sliding_window", "hybrid_sliding_window"])
def test_node_backend_finds_nothing_on_the_kinds_it_implements(tmp_path, kind):
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=40,
             fuzz_config=FuzzConfig(kinds=(kind,), hash_algos=COVERED.hash_algos),
             backend=NODE)
    assert r.finding is None, r.finding and format_failure(r.finding.failure)
    # (A hybrid of other block sizes or of three groups is not covered.)
    assert r.cases == 40 and r.checked >= (10 if kind.startswith("hybrid") else 35)
    assert r.ops >= (100 if kind.startswith("hybrid") else 300)
    assert r.processes_started == 1  # it restarts: one process for the campaign
    assert list(tmp_path.iterdir()) == []


def test_injected_bug_is_found_shrunk_and_replays_as_a_divergence(tmp_path, monkeypatch):
    monkeypatch.setenv(BUG, "eviction-order")
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=40,
             fuzz_config=COVERED, backend=NODE)
    f = r.finding
    assert f is not None, f"the bug was not found in {r.cases} cases"
    assert f.failure.exit_code == ExitCode.DIVERGED
    assert f.failure.field.startswith("free_queue") and f.num_calls <= 8
    assert f.replay_command() == f"kvconform replay --backend '{NODE}' {f.path}"
    bad = check_trace(f.path, [NODE])
    assert bad.exit_code == ExitCode.DIVERGED
    assert bad.divergence.event.kind == f.failure.event.kind == "checkpoint"
    monkeypatch.delenv(BUG)
    assert check_trace(f.path, [NODE]).exit_code == ExitCode.OK
    assert check_trace(f.path, ["vllm", NODE]).exit_code == ExitCode.OK


def test_a_backend_that_cannot_restart_gets_a_process_per_case(tmp_path, monkeypatch):
    backend = _no_restart(tmp_path)
    clean = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path / "clean"), max_cases=6,
                 fuzz_config=COVERED, backend=backend)
    assert clean.finding is None and clean.checked == 6
    # The hello's probe serves the start-up run; then one per case.
    assert clean.processes_started == 1 + clean.checked
    monkeypatch.setenv(BUG, "eviction-order")
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path / "bug"), max_cases=40,
             fuzz_config=COVERED, backend=backend)
    assert r.finding is not None and r.finding.failure.exit_code == ExitCode.DIVERGED
    # The shrink starts one per candidate, no more than its bound allows.
    assert r.processes_started <= 1 + r.checked + EXEC_SHRINK_CHECKS + 1


def test_a_config_it_does_not_cover_is_not_covered_not_a_pass(tmp_path):
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path),
             fuzz_config=FuzzConfig(kinds=("mamba",)), backend=NODE)
    assert r.covered_none and r.finding is None and not r.too_few_cases
    assert r.cases == UNCOVERED_STOP and r.ops == 0  # stopped, unstarted
    assert r.not_covered_why == {"kind mamba": UNCOVERED_STOP}
    assert r.processes_started == 1  # the hello, read once


def test_cases_it_covers_in_part_are_counted_by_reason(tmp_path):
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=30, backend=NODE)
    assert r.finding is None and 0 < r.checked < r.cases
    assert set(r.not_covered_why) >= {"hash algorithm xxhash", "hash algorithm xxhash_cbor"}
    assert r.not_covered == sum(r.not_covered_why.values())
    assert r.not_covered_text().startswith(f"{r.not_covered} not covered (hash algorithm")


def test_cli_says_what_it_covered_and_exits_3_when_nothing(tmp_path, capsys):
    from harness.cli.main import main

    config = tmp_path / "mamba.yaml"
    config.write_text("kinds: [mamba]\n")
    code = main(["fuzz", "--backend", NODE, "--config", str(config), "--out",
                 str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == ExitCode.ENVIRONMENT, out.out + out.err
    assert f"{NODE}: 0 cases covered, {UNCOVERED_STOP} not covered (kind mamba: " in out.out
    assert f"not covered by {NODE}: none of {UNCOVERED_STOP} cases" in out.err
    assert main(["fuzz", "--backend", NODE, "--ray"]) == ExitCode.BAD_INPUT


def _fake(tmp_path, body: str) -> str:
    script = tmp_path / "fake_backend.py"
    script.write_text(textwrap.dedent("""\
        import json, sys, time
        def say(m):
            sys.stdout.write(json.dumps(m) + "\\n"); sys.stdout.flush()
        CAPS = {"profiles": ["0.32"], "kinds": ["full_attention"],
                "hash_algos": ["sha256", "sha256_cbor"], "restart": True,
                "ops": ["add_request", "lookup", "allocate", "append_tokens", "free",
                        "checkpoint"], "checkpoint_fields": ["free_queue"]}
        say({"kvconform_foreign_backend": 1, "capabilities": CAPS})
        for line in sys.stdin:
            m = json.loads(line)
            if m["type"] == "start":
                say({"ok": True})
            elif m["type"] == "event":
        """) + textwrap.indent(textwrap.dedent(body), " " * 8))
    return f"exec:{sys.executable} {script}"


def test_a_backend_that_dies_ends_the_campaign_in_one_line(tmp_path, capsys):
    from harness.cli.main import main

    backend = _fake(tmp_path, """\
        print("fake backend: out of cheese", file=sys.stderr)
        sys.exit(9)
        """)
    with pytest.raises(BackendStopped) as e:
        fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=5,
             fuzz_config=COVERED, backend=backend)
    assert e.value.exit_code == ExitCode.ENVIRONMENT
    assert "exited with code 9 at event #0 (add_request)" in str(e.value)
    code = main(["fuzz", "--backend", backend, "--max-cases", "5", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == ExitCode.ENVIRONMENT
    assert "out of cheese" in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_a_backend_that_hangs_is_killed_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    backend = _fake(tmp_path, "time.sleep(3600)\n")
    with pytest.raises(BackendStopped) as e:
        fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=5,
             fuzz_config=COVERED, backend=backend)
    assert e.value.exit_code == ExitCode.ENVIRONMENT
    assert "no answer within 0.5 s at event #0 (add_request)" in str(e.value)
