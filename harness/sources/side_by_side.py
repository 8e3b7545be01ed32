"""One backend of a batched diff in a process of its own.

A diff runs two backends over the same events. In one process their times add
up (the serial bound); with the reference in a forked process of its own, each
process reads the trace and runs its backend at once, and the diff takes as
long as the slower of the two. The forked process answers batch by batch; the
parent compares each of its batches with its own. What the diff reports does
not change: a batch that disagrees (or a process that fails) makes the caller
run the trace again event by event, in one process, from fresh backends, as a
batch failure in one process does.

Only where the machine has the cores and the OS forks: elsewhere the caller
runs both backends in its own process, with the same answers.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator

import msgspec

# What the process sends once its backend is built, before any batch, and in
# place of a batch where its backend failed (nothing follows). An encoded
# batch is a MessagePack array, which never reads as either.
_READY = b"r"
_FAILED = b""
# Seconds to wait for the process at the end before it is killed.
_JOIN_S = 10.0
# A batch of answers as bytes: cheap to make and to compare, where pickling
# and unpickling both sides' answers cost the parent more than comparing them.
# Keys in sorted order, so two equal answers built in different orders still
# encode alike.
_encode = msgspec.msgpack.Encoder(order="deterministic").encode
_decode = msgspec.msgpack.Decoder().decode


def available() -> bool:
    """Whether a backend can run beside this process: fork, and two cores to
    run on (on one core the processes would only take turns)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2


class BatchProcess:
    """A forked process running `batches()`: one list of answers per batch, or
    None where its backend failed somewhere in the batch (nothing follows).
    `batches` runs in the child only: it opens its own trace and builds its
    backend when called, and returns the iterator of batches."""

    def __init__(self, batches: Callable[[], Iterator[list | None]]) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_serve, args=(batches, child_end), daemon=True,
                                 name="kvconform-side-by-side")
        self._proc.start()
        child_end.close()
        self._ready = False

    def wait_ready(self) -> bool:
        """Whether the process built its backend (False: it failed first)."""
        if not self._ready:
            self._ready = self._receive() == _READY
        return self._ready

    def agrees(self, mine: list) -> bool:
        """Whether the process's answers to its next batch equal `mine` (as
        `==` has it: 1 and 1.0 agree though they encode apart). The last batch
        of a trace with bad input in it is cut short at the bad line on the
        parent's side only: its answers need only begin the process's."""
        if not self.wait_ready():
            return False
        theirs = self._receive()
        if not theirs:  # failed, or ended first
            return False
        if _encode(mine) == theirs:
            return True
        answers = _decode(theirs)
        return len(mine) <= len(answers) and answers[:len(mine)] == mine

    def _receive(self) -> bytes | None:
        try:
            return self._conn.recv_bytes()
        except (EOFError, OSError):
            return None

    def close(self) -> None:
        self._conn.close()
        self._proc.join(_JOIN_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(_JOIN_S)


def _serve(batches: Callable[[], Iterator[list | None]], conn) -> None:
    try:
        it = batches()  # builds the backend (eagerly: see BatchProcess)
        conn.send_bytes(_READY)
        for answers in it:
            if answers is None:
                conn.send_bytes(_FAILED)
                return
            conn.send_bytes(_encode(answers))
    except BaseException:  # noqa: BLE001 - any failure: the parent reruns in-process
        try:
            conn.send_bytes(_FAILED)
        except (OSError, BrokenPipeError):
            pass
    finally:
        conn.close()
