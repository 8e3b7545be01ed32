"""Rotating trace files for a long-running server: one trace in numbered parts,
kept on disk as it is recorded.

A replay must start from the empty pool the server started with, so a server's
trace cannot be cut into independent files: the parts of one session are one
trace. Part 0 starts with the header; every later part holds only event lines,
so the parts concatenated in order are the trace (harness/capture/join.py).
Parts are not named .jsonl: a folder replay would take a lone part for a whole
trace.

    SESSION/part-000000.kvpart           header + events, closed
    SESSION/part-000001.kvpart           events, closed
    SESSION/part-000002.kvpart.partial   being written (or its server was killed)

What reaches the disk, and when (a server may die at any moment, and vLLM's
default `--shutdown-timeout 0` kills the engine core right after SIGTERM):

- Lines are queued in memory by the recording thread (one list append: a
  server step must not wait for the disk) and written by whoever flushes:
  a timer thread every `flush_seconds` (0.5 s), and
- `commit()`, which the recorder calls when a request finishes (its `free`):
  the line is in the file before vLLM hands the request's output to the
  client, so every request a client got an answer for is in the trace, even
  after SIGKILL. Only calls of requests still running can be lost: at most
  the last `flush_seconds`.
- `stopping()` (the plugin calls it at SIGINT/SIGTERM): flushes, renames the
  part to its final name at once and writes every later line synchronously,
  so whatever vLLM does before it is killed is on disk, and a session stopped
  with Ctrl-C joins without --include-partial.
- A stop request: a file `stop-requested` in the session folder (what
  `kvconform capture serve` writes before it passes a Ctrl-C or SIGTERM on to
  the server). The timer thread sees it within `flush_seconds` and does what
  `stopping()` does, then deletes the file: its absence is the answer. Unlike
  a signal, it needs neither the main thread nor a head start on vLLM's
  SIGKILL, which under `--shutdown-timeout 0` follows the engine core's
  SIGTERM within microseconds.
- `close()` (scheduler shutdown, process exit): flush, fsync, final name.

A part still named `.partial` therefore means its server died without a
signal (SIGKILL, a crash): its last `flush_seconds` may be missing, and its
last line may be cut; `capture join` says so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from harness.capture.sinks import encode_line
from harness.trace.codec import TraceHeader, header_to_dict

PART_SUFFIX = ".kvpart"
PARTIAL = ".partial"
STOP_REQUEST = "stop-requested"
FLUSH_SECONDS = 0.5
# Queued in place of a line: the part ends here and the next one begins.
_ROTATE = None


def part_name(index: int) -> str:
    return f"part-{index:06d}{PART_SUFFIX}"


class SegmentWriter:
    """A Sink (harness.capture.recorder) writing `max_events` events a part.

    Thread-safe the way a server uses it: one recording thread calls write()
    and commit(); the timer thread, a signal handler (in the main thread,
    possibly interrupting the recording thread) and exit hooks flush.
    """

    def __init__(self, folder: str, header: TraceHeader | Callable[[], TraceHeader],
                 max_events: int = 1_000_000, flush_seconds: float = FLUSH_SECONDS) -> None:
        """`header` may be a function: called at the first write() (a live
        engine sets some of what the header states, NONE_HASH, only after its
        scheduler is built). Nothing is written before it."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_events = max(1, max_events)
        self.index = 0  # of the part lines are written to (the flusher's side)
        self.num_events = 0
        self._in_part = 0
        # Lines (bytes) and _ROTATE markers. The recording thread only appends;
        # a flusher writes a prefix and deletes exactly that prefix (list
        # append and slice deletion are atomic under the GIL).
        self._pending: list[bytes | None] = []
        self._header = header
        self._lock = threading.Lock()
        self._holder: int | None = None
        self._owner = os.getpid()  # a forked child must not write our file
        self._fd: int | None = None
        self._final_name = False  # the part already carries its final name
        self._sync = False  # after stopping(): every line written at once
        self._closed = False
        self._deferred: list[str] = []  # what a signal handler could not do itself
        if not callable(header):
            self._start()
        self._wake = threading.Event()
        self._timer = threading.Thread(target=self._run_timer, args=(flush_seconds,),
                                       name="kvconform-capture-flush", daemon=True)
        self._timer.start()

    # -- the recording thread ---------------------------------------------------------

    def _start(self) -> None:
        header, self._header = self._header, None
        if callable(header):
            header = header()
        self._pending.append(encode_line(header_to_dict(header)))
        self.flush()

    def write(self, obj: dict) -> None:
        if self._closed:
            return
        if self._header is not None:
            self._start()
        if self._in_part >= self.max_events:  # a full part ends when a line follows
            self._pending.append(_ROTATE)
            self._in_part = 0
        self._pending.append(encode_line(obj))
        self.num_events += 1
        self._in_part += 1
        if self._sync:
            self.flush()

    def commit(self) -> None:
        """A request finished: its lines reach the file before vLLM answers it."""
        self.flush()

    # -- flushing (any thread) --------------------------------------------------------

    def flush(self) -> None:
        if not self._acquire():
            return
        try:
            self._write_pending()
        finally:
            self._release()

    def stopping(self) -> None:
        """The process was told to stop (SIGINT/SIGTERM): everything so far on
        disk, the part under its final name, every later line written at once."""
        if not self._acquire():
            self._deferred.append("stopping")  # our own thread holds the lock
            return
        try:
            self._stopping_locked()
        finally:
            self._release()

    def close(self) -> None:
        if self._closed:
            return
        if not self._acquire():
            self._deferred.append("close")
            return
        try:
            self._close_locked()
        finally:
            self._release()

    def _close_locked(self) -> None:
        if self._closed or os.getpid() != self._owner:
            return
        self._write_pending()
        self._finish_part()
        self._closed = True
        self._wake.set()
        self._answer_stop_request()

    def _acquire(self) -> bool:
        if self._holder == threading.get_ident():
            return False  # a signal handler interrupting this thread's own flush
        if not self._lock.acquire(timeout=2.0):
            return False
        self._holder = threading.get_ident()
        return True

    def _release(self) -> None:
        deferred, self._deferred = self._deferred, []
        try:
            for what in deferred:
                if what == "stopping":
                    self._stopping_locked()
                else:
                    self._close_locked()
        finally:
            self._holder = None
            self._lock.release()

    def _run_timer(self, seconds: float) -> None:
        request = self.folder / STOP_REQUEST
        while not self._wake.wait(seconds):
            if request.exists():
                self.stopping()  # answers the request once it has run
            else:
                self.flush()

    def _answer_stop_request(self) -> None:
        try:
            os.unlink(self.folder / STOP_REQUEST)
        except FileNotFoundError:
            pass

    # -- the file (under the lock) ----------------------------------------------------

    def _part_path(self) -> Path:
        return self.folder / part_name(self.index)

    def _open(self) -> None:
        name = self._part_path() if self._sync else Path(f"{self._part_path()}{PARTIAL}")
        self._final_name = self._sync
        self._fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def _write_pending(self) -> None:
        if self._closed or os.getpid() != self._owner:
            return
        pending = self._pending
        n = len(pending)
        if not n:
            return
        if self._fd is None:
            self._open()
        chunk: list[bytes] = []
        for item in pending[:n]:
            if item is _ROTATE:
                _write_all(self._fd, b"".join(chunk))
                chunk = []
                self._finish_part()
                self.index += 1
                self._open()  # the next part exists as soon as the last one is full
            else:
                chunk.append(item)
        _write_all(self._fd, b"".join(chunk))
        del pending[:n]

    def _stopping_locked(self) -> None:
        if os.getpid() != self._owner:
            return
        self._write_pending()
        if self._fd is not None and not self._final_name:
            os.replace(f"{self._part_path()}{PARTIAL}", self._part_path())
            self._final_name = True
        self._sync = True  # and a part opened from now on gets its final name at once
        self._answer_stop_request()

    def _finish_part(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        os.fsync(fd)
        os.close(fd)
        if not self._final_name:
            os.replace(f"{self._part_path()}{PARTIAL}", self._part_path())
            self._final_name = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def request_stop(session: str) -> Path:
    """Ask the session's writer to do what `stopping()` does; the file it
    returns is deleted once that has run."""
    request = Path(session) / STOP_REQUEST
    request.touch()
    return request


def sessions(folder: str) -> list[str]:
    """Session folders under a capture folder, oldest first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.iterdir()
                  if p.is_dir() and any(q.name.startswith("part-") for q in p.iterdir()))


def holds_parts(folder: str) -> bool:
    """Whether `folder` is a capture folder or session (parts, not traces)."""
    root = Path(folder)
    if not root.is_dir():
        return False
    return any(q.name.startswith("part-") for q in root.iterdir()) or bool(sessions(folder))
