"""End to end, as an SRE would: vLLM's real OpenAI server on 127.0.0.1, started by
`kvconform capture serve` with the plugin on and KV events published to a
`kvconform capture kv-events --bind` subscriber on the loopback interface;
token-id requests with shared prefixes; Ctrl-C (SIGINT to the process group)
under vLLM's default --shutdown-timeout 0. Then every request a client got an
answer for is in the joined trace (plain `join`, no flags), the trace replays
conformant on vLLM and impl, and the subscriber recorded every batch.

One server start for the module (1-4 minutes on a loaded 2-core machine):
every limit below is for a hung process only."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from harness.capture.join import JoinError, join
from harness.capture.segments import sessions
from harness.capture.tiny_model import TinyModel
from harness.sources.replay import check_trace

pytestmark = pytest.mark.vllm

NUM_REQUESTS = 24
STARTUP_LIMIT_S = 1200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kvconform(*args: str, log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli.main", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_for(log: Path, text: str, proc: subprocess.Popen, limit_s: float) -> None:
    for _ in range(int(limit_s / 0.5)):
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"{text!r} never appeared in {log}:\n{log.read_text(errors='replace')[-4000:]}")


def _kill_a_hung_server(server_log: Path) -> None:
    """`capture serve` runs the server in a process group of its own: a hung
    one outlives `capture serve` killed."""
    found = re.search(r"server pid (\d+)", server_log.read_text(errors="replace"))
    if found:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(found[1]), signal.SIGKILL)


def _join(session: str, out: Path, server_log: str):
    """A plain join; if it fails, the server's log says why."""
    try:
        return join(session, str(out))
    except JoinError as e:
        pytest.fail(f"{e}\nthe server's log ends:\n{server_log[-6000:]}")


def _complete(port: int, i: int) -> str:
    """One completion of a token-id prompt sharing an 80-token prefix."""
    prompt = list(range(100, 180)) + [i % 7, i] * (5 + i % 4)
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 8,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["id"]


@pytest.fixture(scope="module")
def stopped_server(tmp_path_factory):
    """Run the server, its traffic and Ctrl-C; what they left behind."""
    tmp = tmp_path_factory.mktemp("server")
    model = TinyModel().write(str(tmp / "model"))
    http, events, replay = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1",
               VLLM_RPC_BASE_PATH=str(tmp))  # the engine core's sockets
    kv_log, server_log = tmp / "kv-events.log", tmp / "server.log"
    subscriber = _kvconform(
        "capture", "kv-events", "--bind", f"tcp://127.0.0.1:{events}",
        "--replay-endpoint", f"tcp://127.0.0.1:{replay}", "--wait", str(STARTUP_LIMIT_S),
        "--out", str(tmp / "kv.jsonl"), log=kv_log, env=env)
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://127.0.0.1:{events}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    server = _kvconform(
        "capture", "serve", "--dir", str(tmp / "capture"), "--",
        "--model", model, "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", str(http), "--load-format", "dummy", "--skip-tokenizer-init",
        "--enforce-eager", "--dtype", "bfloat16", "--block-size", "32",
        "--max-model-len", "1024", "--max-num-seqs", "4", "--enable-prefix-caching",
        "--kv-events-config", json.dumps(config), log=server_log, env=env)
    answered: list[str] = []
    try:
        _wait_for(server_log, "Application startup complete", server, STARTUP_LIMIT_S)
        lock = threading.Lock()

        def client(ids):
            for i in ids:
                rid = _complete(http, i)
                with lock:
                    answered.append(rid)

        clients = [threading.Thread(target=client, args=(range(k, NUM_REQUESTS, 4),))
                   for k in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=900)
        # Ctrl-C: SIGINT to the whole foreground process group.
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=600)
        subscriber.send_signal(signal.SIGTERM)  # a supervisor stopping it: keeps what came
        subscriber.wait(timeout=300)
    finally:
        for p in (server, subscriber):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        _kill_a_hung_server(server_log)
    return tmp, answered, server_log.read_text(errors="replace"), kv_log.read_text(
        errors="replace"), subscriber.returncode


def test_after_ctrl_c_every_answered_request_is_in_the_trace_and_it_conforms(stopped_server):
    tmp, answered, server_log, _, _ = stopped_server
    assert len(answered) == NUM_REQUESTS
    assert "kvconform capture: recording into" in server_log  # a sign of life
    # Ctrl-C reached `capture serve`, which closed the capture, then the server.
    assert "closing the capture of 1 engine core(s)" in server_log, server_log[-4000:]
    assert "did not answer" not in server_log, server_log[-4000:]
    (session,) = sessions(str(tmp / "capture"))
    out = tmp / "trace.jsonl"
    report = _join(session, out, server_log)  # no --include-partial: the part was closed
    assert not report.cut and not report.never_freed
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    added = [x["req"] for x in lines[1:] if x["op"] == "add_request"]
    freed = {x["req"] for x in lines[1:] if x["op"] == "free"}
    # vLLM's request ids start with the id of the answer the client got.
    for rid in answered:
        (req,) = [r for r in added if r.startswith(rid)]
        assert req in freed
    assert lines[0]["cache"]["hash_seed"] is None and "none_hash" in lines[0]["cache"]
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0 and o.truncated is None, o.divergence
    assert any(x["op"] == "lookup" and x["answer"]["hit_tokens"] >= 64 for x in lines[1:])


def test_the_kv_event_subscriber_on_loopback_recorded_every_batch(stopped_server):
    tmp, _, server_log, kv_log, code = stopped_server
    assert code == 0, kv_log
    assert "listening on tcp://127.0.0.1:" in kv_log
    stream = [json.loads(x) for x in (tmp / "kv.kvstream").read_text().splitlines()]
    assert [b["seq"] for b in stream] == list(range(len(stream))) and len(stream) > 5
    events = [e for b in stream for e in b["events"]]
    assert {e["type"] for e in events} >= {"BlockStored"}
    o = check_trace(str(tmp / "kv.jsonl"), ["impl"])
    assert o.exit_code == 0, o.divergence
    # The server's own trace drained the same events, in the same order.
    (session,) = sessions(str(tmp / "capture"))
    _join(session, tmp / "trace-for-events.jsonl", server_log)
    plugin_trace = [json.loads(x) for x in
                    (tmp / "trace-for-events.jsonl").read_text().splitlines()[1:]]
    drained = [e for x in plugin_trace if x["op"] == "checkpoint" and "events" in x["answer"]
               for e in x["answer"]["events"]]
    assert [e["block_hashes"] for e in drained if e["type"] == "BlockStored"] == \
        [e["block_hashes"] for e in events if e["type"] == "BlockStored"]
