"""A backend in another process, in any language: `--backend exec:CMD`
(specs/FOREIGN_BACKEND.md).

The foreign process gets the trace's cache config and events as JSON lines on
its stdin and answers on its stdout, in the answer shapes harness/backends/base.py
builds; this class only carries them. Every wait is bounded: a process that
dies, hangs or speaks another protocol stops the run with one line naming the
event (ForeignBackendFailure), never a hang and never a divergence. What its
capabilities do not cover stops the run as NotCovered.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import fields
from enum import Enum
from typing import Any

from harness.backends.base import BackendError, BackendStopped
from harness.core.cache_config import CacheConfig
from harness.core.events import Checkpoint, Event
from harness.core.exit_codes import ExitCode
from impl.profiles import VersionProfile

PREFIX = "exec:"
PROTOCOL = 1
HELLO_KEY = "kvconform_foreign_backend"
# Seconds one answer may take (the hello included); the environment may say more.
DEFAULT_TIMEOUT = 30.0
TIMEOUT_ENV = "KVCONFORM_EXEC_TIMEOUT"
_STDERR_LINES = 12


def is_exec(name: str) -> bool:
    return name.startswith(PREFIX)


def timeout_seconds() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT


class ForeignBackendFailure(BackendStopped):
    """The foreign process died, hung or broke the protocol."""


class NotCovered(BackendStopped):
    """What the trace needs is outside the foreign backend's capabilities."""

    exit_code = ExitCode.OK


def profile_json(profile: VersionProfile) -> dict[str, Any]:
    """Every profile field, enums by value: what the foreign side reads."""
    out: dict[str, Any] = {}
    for f in fields(profile):
        value = getattr(profile, f.name)
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


class LineChannel:
    """A child process's stdout read line by line, each read bounded; its
    stderr drained by a thread into the last few lines (a full pipe would
    block the child)."""

    def __init__(self, argv: list[str], label: str, timeout: float) -> None:
        self.label = label
        self.timeout = timeout
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0)
        except OSError as e:
            raise ForeignBackendFailure(f"{label}: cannot start: {e}",
                                        ExitCode.ENVIRONMENT) from None
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_LINES)
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._buffer = bytearray()

    def _read_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def stderr_text(self) -> str:
        time.sleep(0.05)  # let the drain thread catch a dying process's last words
        lines = list(self.stderr_tail)
        return ("; its stderr ends: " + " | ".join(lines)) if lines else "; no stderr"

    def send(self, message: dict, where: str) -> None:
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        except (BrokenPipeError, OSError):
            self.fail_dead(where)

    def fail_dead(self, where: str):
        code = self.proc.wait(timeout=self.timeout)
        raise ForeignBackendFailure(f"{self.label}: exited with code {code} {where}"
                                    f"{self.stderr_text()}", ExitCode.ENVIRONMENT)

    def receive(self, where: str) -> dict:
        """The next line as a JSON object; the failures are one line each."""
        deadline = time.monotonic() + self.timeout
        while True:
            cut = self._buffer.find(b"\n")
            if cut >= 0:
                line = bytes(self._buffer[:cut])
                del self._buffer[:cut + 1]
                return self._decode(line, where)
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                self.kill()
                raise ForeignBackendFailure(
                    f"{self.label}: no answer within {self.timeout:g} s {where} (killed; "
                    f"{TIMEOUT_ENV} sets the limit){self.stderr_text()}", ExitCode.ENVIRONMENT)
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.fail_dead(where)
            self._buffer += chunk

    def _decode(self, line: bytes, where: str) -> dict:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            shown = line[:120].decode("utf-8", "replace")
            raise ForeignBackendFailure(f"{self.label}: wrote a line that is not a JSON object "
                                        f"{where}: {shown!r}{self.stderr_text()}")
        return message

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Ask it to end, then make sure it does."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"type":"close"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=min(self.timeout, 5.0))
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._selector.close()
        self.proc.stdout.close()


def start_channel(command: str, hello_key: int | str, version: int, label: str,
                  timeout: float) -> tuple[LineChannel, dict]:
    """The child started and its hello checked: (channel, hello)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise ForeignBackendFailure(f"{label}: cannot parse the command: {e}") from None
    if not argv:
        raise ForeignBackendFailure(f"{label}: empty command")
    channel = LineChannel(argv, label, timeout)
    try:
        hello = channel.receive("before its hello")
        got = hello.get(hello_key)
        if got != version:
            raise ForeignBackendFailure(
                f"{label}: speaks protocol {got!r} ({hello_key!r} in its hello); kvconform "
                f"speaks {version} (specs/FOREIGN_BACKEND.md){channel.stderr_text()}")
    except BaseException:
        channel.kill()
        raise
    return channel, hello


def coverage_gap(capabilities: dict, config: CacheConfig,
                 profile: VersionProfile) -> str | None:
    """What of a cache config the hello's capabilities leave out (the
    profile, a group's kind, the hash algorithm), or None: known before the
    process is asked anything, so a fuzz campaign skips such cases unstarted."""
    if profile.name not in (capabilities.get("profiles") or ()):
        return f"profile {profile.name}"
    kinds = set(capabilities.get("kinds") or ())
    for g in config.groups:
        if g.kind not in kinds:
            return f"kind {g.kind}"
    if config.hash_algo not in (capabilities.get("hash_algos") or ()):
        return f"hash algorithm {config.hash_algo}"
    return None


class ForeignProcesses:
    """Where the runs of a fuzz campaign get their foreign process: one kept
    for every run when its hello declares `"restart": true` (each run sends
    a new `start`, which discards all state), else a fresh one per run.
    `started` counts the processes started."""

    def __init__(self, command: str, timeout: float | None = None) -> None:
        self.command = command
        self.timeout = timeout or timeout_seconds()
        self.started = 0
        self._kept: tuple[LineChannel, dict] | None = None
        self.capabilities = self._hello(self._start())

    @staticmethod
    def _hello(pair: tuple[LineChannel, dict]) -> dict:
        return pair[1].get("capabilities") or {}

    @property
    def restartable(self) -> bool:
        return bool(self.capabilities.get("restart"))

    def _start(self) -> tuple[LineChannel, dict]:
        pair = start_channel(self.command, HELLO_KEY, PROTOCOL, PREFIX + self.command,
                             self.timeout)
        self.started += 1
        self._kept = pair
        return pair

    def take(self) -> tuple[LineChannel, dict]:
        """A process that has said its hello and answers no run."""
        pair, self._kept = self._kept, None
        if pair is not None and pair[0].proc.poll() is None:
            return pair
        pair = self._start()
        self._kept = None
        return pair

    def give_back(self, channel: LineChannel) -> None:
        """A run is over: its process kept for the next one, or closed."""
        if self.restartable and channel.proc.poll() is None and self._kept is None:
            self._kept = (channel, {"capabilities": self.capabilities})
        else:
            channel.close()

    def close(self) -> None:
        if self._kept is not None:
            self._kept[0].close()
            self._kept = None


class ExecBackend:
    """The driver protocol of harness/backends/base.py, answered by a
    foreign process. `encode` writes an event as the trace format does; the
    layer that reads traces hands it in (this layer does not know traces)."""

    def __init__(self, command: str, config: CacheConfig, profile: VersionProfile,
                 cache_json: dict, vllm_version: str, encode: Callable[[Event], dict],
                 timeout: float | None = None,
                 processes: ForeignProcesses | None = None) -> None:
        self.name = PREFIX + command
        self.config = config
        self.profile = profile
        self.requests: dict[str, None] = {}  # live request ids, for reports
        self._encode = encode
        self._seq = 0
        self.none_hash = None
        self._processes = processes
        if processes is not None:
            self.channel, hello = processes.take()
        else:
            self.channel, hello = start_channel(command, HELLO_KEY, PROTOCOL, self.name,
                                                timeout or timeout_seconds())
        try:
            self.capabilities = hello.get("capabilities") or {}
            self._check_covered(config, profile)
            reply = self._ask({"type": "start", "vllm_version": vllm_version,
                               "profile": profile_json(profile), "cache": cache_json},
                              "at start", seq=None)
            if "rejected" in reply:
                r = reply["rejected"] or {}
                raise BackendError(str(r.get("message", "rejected")),
                                   str(r.get("field", "cache")))
        except BaseException:
            if processes is not None:
                processes.give_back(self.channel)  # kept only if it is still well
            else:
                self.channel.kill()
            raise
        self._ops = set(self.capabilities.get("ops") or ())
        self._fields = set(self.capabilities.get("checkpoint_fields") or ())

    # -- coverage -------------------------------------------------------------

    def _not_covered(self, what: str) -> NotCovered:
        return NotCovered(f"not covered by {self.name}: {what}")

    def _check_covered(self, config: CacheConfig, profile: VersionProfile) -> None:
        gap = coverage_gap(self.capabilities, config, profile)
        if gap is not None:
            raise self._not_covered(gap)

    # -- the protocol ---------------------------------------------------------

    def _ask(self, message: dict, where: str, seq: int | None) -> dict:
        self.channel.send(message, where)
        reply = self.channel.receive(where)
        if seq is not None and reply.get("seq") != seq:
            raise ForeignBackendFailure(f"{self.name}: answered seq {reply.get('seq')!r} "
                                        f"{where}, expected {seq}")
        if "not_covered" in reply:
            raise self._not_covered(f"{reply['not_covered']} ({where})")
        if not ({"answer", "rejected", "ok"} & reply.keys()):
            raise ForeignBackendFailure(f"{self.name}: an answer without answer, rejected or "
                                        f"not_covered {where}: {json.dumps(reply)[:200]}")
        return reply

    def run(self, event: Event) -> dict:
        seq = self._seq
        self._seq += 1
        where = f"at event #{seq} ({event.kind})"
        if event.kind not in self._ops:
            raise self._not_covered(f"op {event.kind} ({where})")
        if event.__class__ is Checkpoint:
            missing = [f for f in event.fields if f not in self._fields]
            if missing:
                raise self._not_covered(f"checkpoint field {missing[0]} ({where})")
        reply = self._ask({"type": "event", "seq": seq, "event": self._encode(event)}, where, seq)
        if "rejected" in reply:
            r = reply["rejected"] or {}
            raise BackendError(str(r.get("message", "rejected")), str(r.get("field", "req")))
        req = getattr(event, "req", None)
        if event.kind == "add_request":
            self.requests[req] = None
        elif event.kind == "free":
            self.requests.pop(req, None)
        return reply["answer"]

    # -- what the runs around the protocol ask of every backend -----------------

    def start(self) -> None:
        pass

    def free_queue(self) -> list[int]:
        return self.run(Checkpoint(("free_queue",)))["free_queue"]

    def _inspect(self, what: str, **args) -> Any:
        if not self.capabilities.get("inspect"):
            return None
        seq = self._seq
        self._seq += 1
        try:
            reply = self._ask({"type": "inspect", "seq": seq, "what": what, **args},
                              f"at inspect #{seq} ({what})", seq)
        except BackendStopped:
            return None
        return reply.get("answer")

    def block_table(self, req: str) -> list[list[int]]:
        return self._inspect("block_table", req=req) or [[] for _ in self.config.groups]

    def block_state(self, block_id: int) -> dict:
        return self._inspect("block_state", block_id=block_id) or {
            "block_id": block_id, "ref_cnt": None, "hash": None, "free": None}

    def pending_kv_events(self) -> list | None:
        return None  # a foreign queue cannot be read without draining it

    def close(self) -> None:
        if self._processes is not None:
            self._processes.give_back(self.channel)
        else:
            self.channel.close()

    def __del__(self) -> None:
        channel = getattr(self, "channel", None)
        if (channel is not None and getattr(self, "_processes", None) is None
                and channel.proc.poll() is None):
            channel.kill()
