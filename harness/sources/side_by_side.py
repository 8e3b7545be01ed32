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

# What the process sends once its backend is built, before any batch.
_READY = "ready"
# Seconds to wait for the process at the end before it is killed.
_JOIN_S = 10.0


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
    """A forked process sending `batches()`'s items, one list of answers per
    batch (None: its backend failed somewhere in the batch, and nothing
    follows). `batches` runs in the child only: it opens its own trace and
    builds its backend when called, and returns the iterator of batches."""

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

    def next_batch(self) -> list | None:
        """The process's answers to its next batch, or None where it failed or
        ended first."""
        if not self.wait_ready():
            return None
        answers = self._receive()
        return answers if isinstance(answers, list) else None

    def _receive(self):
        try:
            return self._conn.recv()
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
        conn.send(_READY)
        for answers in it:
            conn.send(answers)
            if answers is None:
                return
    except BaseException:  # noqa: BLE001 - any failure: the parent reruns in-process
        try:
            conn.send(None)
        except (OSError, BrokenPipeError):
            pass
    finally:
        conn.close()
