"""Where a recorder's trace lines go: one JSON Lines trace file, written as it comes.

The recorder hands over each event already in its JSON form (the canonical
form of harness/trace/codec.py, defaults left out), because building Event
objects and encoding them through the codec costs a server's step more than
recording may. Lines are encoded with msgspec (a tenth of json.dumps' time);
the file is `*.partial` until `close()` flushes, fsyncs and renames it.
"""

from __future__ import annotations

import json
import os

from harness.trace.codec import TraceHeader, header_to_dict

try:
    import msgspec

    _encode = msgspec.json.Encoder().encode
except ImportError:  # msgspec comes with vLLM; without it, the standard library
    def _encode(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


def encode_line(obj: dict) -> bytes:
    return _encode(obj) + b"\n"


class JsonlSink:
    """A Sink (harness.capture.recorder) writing one .jsonl trace."""

    def __init__(self, path: str, header: TraceHeader) -> None:
        if not path.endswith(".jsonl"):
            raise ValueError(f"{path}: captures are written as JSON Lines (.jsonl)")
        self.path = path
        self._tmp = f"{path}.partial"
        self._f = open(self._tmp, "wb", buffering=1 << 16)
        self._f.write(encode_line(header_to_dict(header)))
        self.num_events = 0

    def write(self, obj: dict) -> None:
        if self._f is not None:
            self._f.write(encode_line(obj))
            self.num_events += 1

    def commit(self) -> None:
        """Nothing to do: a capture tool's file is complete when it is closed."""

    def write_raw(self, line: bytes) -> None:
        """A line already encoded (encode_line), newline included."""
        if self._f is not None:
            self._f.write(line)
            self.num_events += 1

    def close(self) -> None:
        if self._f is None:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)
