"""Rotating trace files for a long-running server: one trace in numbered parts.

A replay must start from the empty pool the server started with, so a server's
trace cannot be cut into independent files: the parts of one session are one
trace. Part 0 starts with the header; every later part holds only event lines,
so the parts concatenated in order are the trace (`join`). A part being written
is named `*.partial`; it is flushed, fsynced and renamed when it reaches its
size, so finished parts can be shipped while the server runs. Parts are not
named .jsonl: a folder replay would take a lone part for a whole trace.

    SESSION/part-000000.kvpart   header + events
    SESSION/part-000001.kvpart   events
    SESSION/part-000002.kvpart.partial   (being written)
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.capture.sinks import encode_line
from harness.trace.codec import TraceHeader, header_to_dict

PART_SUFFIX = ".kvpart"
PARTIAL = ".partial"


def part_name(index: int) -> str:
    return f"part-{index:06d}{PART_SUFFIX}"


class SegmentWriter:
    """A Sink (harness.capture.recorder) writing `max_events` events a part."""

    def __init__(self, folder: str, header: TraceHeader, max_events: int = 1_000_000) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_events = max(1, max_events)
        self.index = 0
        self.num_events = 0
        self._in_part = 0
        self._f = None
        self._open()
        self._line(header_to_dict(header))

    def _open(self) -> None:
        self._path = self.folder / (part_name(self.index) + PARTIAL)
        self._f = open(self._path, "wb", buffering=1 << 16)

    def _line(self, obj: dict) -> None:
        self._f.write(encode_line(obj))

    def write(self, obj: dict) -> None:
        if self._f is None:
            return
        self._f.write(encode_line(obj))
        self.num_events += 1
        self._in_part += 1
        if self._in_part >= self.max_events:
            self._finish_part()
            self.index += 1
            self._in_part = 0
            self._open()

    def _finish_part(self) -> None:
        f = self._f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(self._path, self.folder / part_name(self.index))

    def close(self) -> None:
        if self._f is None:
            return
        self._finish_part()
        self._f = None


class JoinError(ValueError):
    """The parts do not make one trace (`file:line: field: message`)."""


def join(session: str, out: str, include_partial: bool = False) -> int:
    """Concatenate a session's parts into one trace at `out`; return its events.

    A `.partial` part (the server died while writing it) is taken only with
    `include_partial`, and its last line only if complete."""
    folder = Path(session)
    if not folder.is_dir():
        raise JoinError(f"{session}:0: (folder): not a capture session folder")
    done = sorted(p for p in folder.iterdir() if p.name.endswith(PART_SUFFIX))
    partial = sorted(p for p in folder.iterdir() if p.name.endswith(PART_SUFFIX + PARTIAL))
    if not done and not partial:
        raise JoinError(f"{session}:0: (folder): no {PART_SUFFIX} parts")
    for i, p in enumerate(done):
        if p.name != part_name(i):
            raise JoinError(f"{p}:0: (file): expected {part_name(i)}: a part is missing")
    parts = list(done)
    if partial:
        if not include_partial:
            raise JoinError(f"{partial[0]}:0: (file): part still being written, or the "
                            "server stopped without closing it (--include-partial takes it)")
        if partial[0].name != part_name(len(done)) + PARTIAL:
            raise JoinError(f"{partial[0]}:0: (file): does not follow the last complete part")
        parts.append(partial[0])
    tmp = f"{out}.partial"
    num_lines = 0
    with open(tmp, "wb") as w:
        for p in parts:
            data = p.read_bytes()
            if p.name.endswith(PARTIAL) and data and not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]  # the line being written when it died
            w.write(data)
            num_lines += data.count(b"\n")
        w.flush()
        os.fsync(w.fileno())
    os.replace(tmp, out)
    return max(0, num_lines - 1)


def sessions(folder: str) -> list[str]:
    """Session folders under a capture folder, oldest first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.iterdir()
                  if p.is_dir() and any(q.name.startswith("part-") for q in p.iterdir()))
