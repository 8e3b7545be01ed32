"""`kvconform capture serve`: run a recorded server and stop it without losing
the end of its trace.

vLLM's default `--shutdown-timeout 0` sends the engine core SIGTERM and then
SIGKILL at once. The plugin's signal handler closes the part only if it runs
before that SIGKILL: a race. It usually wins, but on a loaded machine it can
lose, and then the part stays `.partial` although the server was stopped with
a signal (specs/CAPTURE.md has the measurements).

So the server runs in a process group of its own, where a terminal's Ctrl-C
does not reach it, and this process stops it in two steps:

1. every capture session the server started gets a stop request
   (harness/capture/segments.py); its writer's timer thread puts everything on
   disk under the part's final name and writes every later call at once, then
   answers. We wait for every answer, or for the session's process to end, or
   for `STOP_WAIT_S`, or for another signal, whichever comes first;
2. the signal is passed on: SIGINT to the server's whole process group (as a
   terminal would), SIGTERM and SIGHUP to the API server (as a supervisor
   would). vLLM then stops as it always does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.capture.segments import STOP_REQUEST, request_stop

STOP_WAIT_S = 30.0
_POLL_S = 0.1
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _say(message: str) -> None:
    print(f"kvconform capture serve: {message}", file=sys.stderr, flush=True)


def _session_pid(session: Path) -> int | None:
    """The recording process's pid, from the name the plugin gives a session
    (`<date>-<time>-<pid>-<n>`)."""
    parts = session.name.split("-")
    return int(parts[-2]) if len(parts) >= 4 and parts[-2].isdigit() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True  # not a plugin's name: wait for its answer
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, but not ours to signal
    return True


def new_sessions(capture_dir: str, before: set[str]) -> list[Path]:
    """Session folders created since `before` was taken, parts or not (a
    session's first part appears at its first recorded call)."""
    root = Path(capture_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and str(p) not in before)


def close_sessions(sessions: list[Path], signals: list[int], wait_s: float) -> None:
    """Ask each session to close and wait for the answers, naming those that
    give none. A signal arriving meanwhile (`signals` grows) ends the wait:
    the user asked again."""
    asked = len(signals)
    waiting = []
    for s in sessions:
        try:
            request_stop(str(s))
            waiting.append(s)
        except OSError as e:
            _say(f"could not ask {s} to close ({e})")
    if waiting:
        _say(f"closing the capture of {len(waiting)} engine core(s) before the server stops "
             f"(at most {wait_s:.0f} s; a second signal stops it at once)")
    for _ in range(int(wait_s / _POLL_S)):
        waiting = [s for s in waiting
                   if (s / STOP_REQUEST).exists() and _alive(_session_pid(s))]
        if not waiting or len(signals) > asked:
            break
        time.sleep(_POLL_S)
    for s in waiting:
        _say(f"{s} did not answer its stop request; its last part may stay .partial")


def supervise(command: list[str], env: dict[str, str], capture_dir: str,
              wait_s: float = STOP_WAIT_S) -> int:
    """Run `command` (a server recording into `capture_dir`) until it exits;
    returns its exit status (negative: the signal that ended it)."""
    before = {str(p) for p in new_sessions(capture_dir, set())}
    signals: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: signals.append(signum))
                for sig in _STOP_SIGNALS}
    try:
        with subprocess.Popen(command, env=env, process_group=0) as proc:
            _say(f"server pid {proc.pid} (its own process group; Ctrl-C here stops it)")
            passed_on = 0
            while True:
                try:
                    return proc.wait(timeout=_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if passed_on < len(signals):
                    if passed_on == 0:
                        close_sessions(new_sessions(capture_dir, before), signals, wait_s)
                    for sig in signals[passed_on:]:
                        _pass_on(proc, sig)
                    passed_on = len(signals)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pass_on(proc: subprocess.Popen, sig: int) -> None:
    try:
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass  # it has just exited
