"""What a capture keeps when its process is stopped or killed (specs/CAPTURE.md,
"The plugin for running servers"): at SIGINT everything, the part closed under
its name; at SIGKILL all but at most the last second, and `join` says what is
missing. Each runs the plugin in a process of its own."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.capture.join import JoinError, join
from harness.capture.segments import PARTIAL, part_name, sessions
from harness.sources.replay import check_trace

from .conftest import capture_cli

REPO = Path(__file__).resolve().parents[3]

# A writer with the plugin's signal hooks, writing as fast as it can until
# SIGINT; then one more line, and out without closing anything (as vLLM's
# engine core is killed right after the signal).
WRITER = """
import itertools, os, sys
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.capture import plugin
from harness.capture.segments import SegmentWriter
from harness.trace.codec import TraceHeader

w = SegmentWriter(sys.argv[1], TraceHeader("0.32.0", "production",
                  CacheConfig(8, (GroupConfig(4),))), max_events=5000, flush_seconds=3600)
plugin._on_stop_signals(w)
print("ready", flush=True)
try:
    for i in itertools.count():
        w.write({"op": "step"})
except KeyboardInterrupt:
    w.write({"op": "reset_prefix_cache"})
    print(w.num_events, flush=True)
    os._exit(0)
"""

# vLLM's real Scheduler on a preset's traffic, recorded through the plugin
# exactly as in a server's engine core; after STEPS steps it says what it has
# recorded, then idles until killed.
SCHEDULER = """
import json, sys, time
from harness.capture import plugin
from harness.capture.fake_model import FakeModel
from harness.capture.presets import load_preset
from harness.capture.scheduler_capture import _Requests, build_scheduler
from harness.capture.synth import SyntheticWorkload
from harness.capture.tiny_model import TinyModel

folder, model_dir, preset_path, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
preset = load_preset(preset_path)
TinyModel(vocab_size=max(preset.requests.vocab, 16)).write(model_dir)
scheduler = build_scheduler(preset, model_dir, None)
requests = _Requests(preset)
recorder = plugin.start_capture(scheduler, folder)
workload, model = SyntheticWorkload(preset), FakeModel(preset.requests.vocab, preset.seed)
live, freed = {}, []
for _ in range(steps):
    for new in workload.arrivals():
        live[new.req_id] = r = requests.make(new)
        scheduler.add_request(r)
    if scheduler.get_num_unfinished_requests() > 0:
        out = scheduler.schedule()
        scheduler.update_from_output(out, model.execute(scheduler, out))
    for rid in [rid for rid, r in live.items() if r.is_finished()]:
        workload.finished(rid, list(live.pop(rid).all_token_ids))
        freed.append(rid)
print(json.dumps({"events": recorder.sink.num_events, "freed": freed,
                  "running": sorted(live)}), flush=True)
time.sleep(3600)
"""

# A server as vLLM's --shutdown-timeout 0 leaves it at its worst: it records N
# events into a session named as the plugin names one, says so, idles, and
# dies at once at any stop signal, before any handler could close its part.
# With argv[3] == "deaf" its writer's timer never runs (an engine core too
# busy to answer a stop request).
SERVER = """
import os, signal, sys, time
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.capture.segments import SegmentWriter
from harness.trace.codec import TraceHeader

for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
session = os.path.join(sys.argv[1], time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-0")
w = SegmentWriter(session, TraceHeader("0.32.0", "production",
                  CacheConfig(8, (GroupConfig(4),))),
                  flush_seconds=3600 if sys.argv[3] == "deaf" else 0.5)
for _ in range(int(sys.argv[2])):
    w.write({"op": "step"})
print("ready", flush=True)
while True:
    time.sleep(1)
"""

# `kvconform capture serve`'s supervision around any server command.
SUPERVISOR = """
import sys
from harness.capture.serve import supervise
print("exit", supervise(sys.argv[3:], None, sys.argv[1], wait_s=float(sys.argv[2])), flush=True)
"""


# Generous: the children print within a minute on a loaded 2-core machine.
LINE_TIMEOUT_S = 300


def _as_from_a_terminal() -> None:
    # A child inherits an ignored SIGINT (pytest run as a background job of a
    # script): these children stand for programs a user stops with Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(script: str, *args: str, sigint_ignored: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")
    reset = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored \
        else _as_from_a_terminal
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            text=True, env=env, preexec_fn=reset)


def _state(proc: subprocess.Popen) -> str:
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return f"pid {proc.pid}, state {fields.get('State', '?').strip()}"
    except OSError:
        return f"pid {proc.pid}, exit code {proc.poll()}"


def _line(proc: subprocess.Popen) -> str:
    """The child's next line, within LINE_TIMEOUT_S: a child that neither
    prints nor exits fails the test with its state, never hangs it. A thread
    reads the pipe (a timed select would miss lines already buffered)."""
    lines = getattr(proc, "_lines", None)
    if lines is None:
        lines = proc._lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in iter(proc.stdout.readline, "")]
                         + [lines.put("")], daemon=True).start()
    try:
        line = lines.get(timeout=LINE_TIMEOUT_S)
    except queue.Empty:
        pytest.fail(f"the child said nothing for {LINE_TIMEOUT_S} s ({_state(proc)})")
    assert line, f"the child exited ({proc.wait(timeout=60)}) before saying anything"
    return line


def test_a_process_that_ignores_sigint_keeps_ignoring_it(tmp_path):
    """A server started ignoring SIGINT (a background job of a script) runs
    on through one: the plugin hooks only the signals the process acts on, so
    the capture does not act on a stop that never comes."""
    probe = "import signal\nfrom harness.capture import plugin\n" \
        "plugin._on_stop_signals(type('W', (), {'stopping': lambda self: None})())\n" \
        "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, " \
        "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)\n"
    for ignored, expected in ((True, "True False"), (False, "False False")):
        proc = _start(probe, sigint_ignored=ignored)
        try:
            assert _line(proc).strip() == expected
        finally:
            proc.kill()
            proc.wait(timeout=60)


def test_at_sigint_everything_is_on_disk_and_the_part_is_closed(tmp_path):
    folder = tmp_path / "s"
    proc = _start(WRITER, str(folder))
    try:
        assert _line(proc).strip() == "ready"
        part = folder / (part_name(0) + PARTIAL)
        for _ in range(600):  # until it has written something (bounded by count)
            if part.exists() or (folder / part_name(1)).exists():
                break
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        written = int(_line(proc))
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # Every part under its final name, nothing lost, the line after the signal too.
    names = sorted(p.name for p in folder.iterdir())
    assert names and not any(n.endswith(PARTIAL) for n in names)
    report = join(str(folder), str(tmp_path / "t.jsonl"))
    assert not report.cut and report.num_events >= written > 0
    assert (tmp_path / "t.jsonl").read_text().splitlines()[-1] == \
        '{"op":"reset_prefix_cache"}'


@pytest.mark.vllm
def test_after_sigkill_at_most_the_last_second_is_lost_and_join_says_so(
        tmp_path, small_preset, capsys):
    preset = small_preset("multi-turn-chat", requests={"count": 16})
    folder = tmp_path / "capture"
    proc = _start(SCHEDULER, str(folder), str(tmp_path / "model"), preset, "40")
    try:
        said = json.loads(_line(proc))
        time.sleep(1.0)  # the claim: one second after a call, it is on disk
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert said["freed"] and said["running"], said  # the kill finds requests running
    (session,) = sessions(str(folder))

    out = tmp_path / "t.jsonl"
    # As it is: every call recorded up to the kill is there.
    report = join(session, str(out), include_partial=True)
    assert report.cut and report.cut_bytes == 0
    assert report.num_events == said["events"]
    assert sorted(report.never_freed) == said["running"]
    lines = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    assert {x["req"] for x in lines if x["op"] == "free"} == set(said["freed"])

    # Plain join refuses it and says how; --repair ends it at the last complete step.
    assert capture_cli(["capture", "join", session, "--out", str(out)]) == 2
    assert "--repair" in capsys.readouterr().err
    assert capture_cli(["capture", "join", session, "--out", str(out), "--repair"]) == 0
    told = capsys.readouterr().out
    assert "incomplete: the last part was never closed" in told
    assert "requests never freed" in told
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0 and o.truncated and "--repair" in o.truncated


def _wait_for(path: Path, text: str, proc: subprocess.Popen) -> None:
    for _ in range(1200):  # bounded by count; a loaded machine may take minutes
        if text in path.read_text():
            return
        assert proc.poll() is None, path.read_text()
        time.sleep(0.1)
    pytest.fail(f"{text!r} never appeared in {path}:\n{path.read_text()}")


def _supervised(tmp_path, events: int, stop, deaf: bool = False) -> tuple[str, str]:
    """The supervisor running SERVER in a session of its own (a terminal's
    foreground process group), stopped by `stop(proc, stderr_path)` once the
    server is ready; what it printed on stdout and stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0")
    err, out = tmp_path / "supervisor.err", tmp_path / "supervisor.out"
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path / "capture"), "120",
         sys.executable, "-c", SERVER, str(tmp_path / "capture"), str(events),
         "deaf" if deaf else "-"],
        env=env, stdout=out.open("w"), stderr=err.open("w"), start_new_session=True,
        preexec_fn=_as_from_a_terminal)
    try:
        _wait_for(out, "ready", proc)
        stop(proc, err)
        assert proc.wait(timeout=600) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return out.read_text(), err.read_text()


def _ctrl_c(proc, _err):
    os.killpg(proc.pid, signal.SIGINT)


def _sigterm(proc, _err):
    proc.send_signal(signal.SIGTERM)


def _sigterm_twice(proc, err):
    proc.send_signal(signal.SIGTERM)
    _wait_for(err, "closing the capture of 1 engine core(s)", proc)
    proc.send_signal(signal.SIGTERM)


@pytest.mark.parametrize("stop", [_ctrl_c, _sigterm])
def test_capture_serve_closes_the_part_before_the_server_hears_the_signal(tmp_path, stop):
    """Ctrl-C (SIGINT to the terminal's process group) or a supervisor's
    SIGTERM to `capture serve`: the part is closed under its name, everything
    in it, although the server dies the moment the signal reaches it."""
    out, err = _supervised(tmp_path, 37, stop)
    assert "closing the capture of 1 engine core(s)" in err and "did not answer" not in err
    assert out.splitlines()[-1] == f"exit {-signal.SIGKILL}"  # it died at the signal
    (session,) = sessions(str(tmp_path / "capture"))
    assert sorted(p.name for p in Path(session).iterdir()) == [part_name(0)]
    report = join(session, str(tmp_path / "t.jsonl"))  # no flags: the part was closed
    assert report.num_events == 37 and not report.cut


def test_without_capture_serve_the_same_server_leaves_its_part_partial(tmp_path):
    """The negative control: the same server, the signal sent to it directly."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path), "37", "-"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert _line(proc).strip() == "ready"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=600) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait(timeout=60)
    (session,) = sessions(str(tmp_path))
    assert sorted(p.name for p in Path(session).iterdir()) == [part_name(0) + PARTIAL]
    with pytest.raises(JoinError, match="never closed"):
        join(session, str(tmp_path / "t.jsonl"))


def test_a_session_that_does_not_answer_is_named_and_a_second_signal_stops_the_wait(tmp_path):
    out, err = _supervised(tmp_path, 5, _sigterm_twice, deaf=True)
    (session,) = sessions(str(tmp_path / "capture"))
    assert f"{session} did not answer its stop request" in err
    assert out.splitlines()[-1] == f"exit {-signal.SIGKILL}"
    assert sorted(p.name for p in Path(session).iterdir()) == [part_name(0) + PARTIAL,
                                                               "stop-requested"]
