"""A vLLM general plugin that records traces from an unmodified vLLM server.

Registered as the entry point `kvconform_capture` in vLLM's group
`vllm.general_plugins` (pyproject.toml). vLLM loads general plugins in every
process it starts (API server, engine core, workers); `register()` does nothing
unless KVCONFORM_CAPTURE_DIR names an output folder. Then every vLLM Scheduler
created in the process (the engine core's) gets its KV cache manager
instrumented, and each engine run is one capture session:

    $KVCONFORM_CAPTURE_DIR/<yyyymmdd-hhmmss>-<pid>-<n>/part-000000.kvpart ...

joined into one trace by `kvconform capture join SESSION --out trace.jsonl`.
`kvconform capture serve -- ARGS` starts vLLM's OpenAI server this way.

Settings (environment):
  KVCONFORM_CAPTURE_DIR         output folder; the plugin is off without it
  KVCONFORM_CAPTURE_MAX_EVENTS  events per part before rotating (default 1000000)
  KVCONFORM_CAPTURE_FREE_QUEUE  1: record the free queue after every free and
                                preemption (O(pool) each; off by default)
  KVCONFORM_CAPTURE_SOURCE      the header's `source` (default "production")
  KVCONFORM_CAPTURE_DESCRIPTION the header's `description` (the session's name is added)

What is on disk when (harness/capture/segments.py): a finished request before
its answer leaves the engine, everything else within half a second; at a stop
request from `kvconform capture serve` (made before it passes a Ctrl-C or
SIGTERM on to the server), and at SIGINT/SIGTERM in the engine-core process
when the handler gets to run before vLLM's SIGKILL, everything at once, the
part under its final name, and every later call as it happens; at the
scheduler's shutdown or process exit the part is closed.

The recorder is lenient here: whatever it cannot record ends the trace (with a
warning on stderr) and the server carries on untouched.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import sys
import threading
import time

ENV_DIR = "KVCONFORM_CAPTURE_DIR"
ENV_MAX_EVENTS = "KVCONFORM_CAPTURE_MAX_EVENTS"
ENV_FREE_QUEUE = "KVCONFORM_CAPTURE_FREE_QUEUE"
ENV_SOURCE = "KVCONFORM_CAPTURE_SOURCE"
ENV_DESCRIPTION = "KVCONFORM_CAPTURE_DESCRIPTION"
# The line a session's start prints (stderr of the engine-core process, which
# vLLM passes on to the server's): `kvconform capture serve` and tests read it.
READY = "kvconform capture: recording into "

log = logging.getLogger("kvconform.capture")
_sessions = itertools.count()


def _say(message: str) -> None:
    """A line on stderr: vLLM's loggers have no handler for ours."""
    print(message, file=sys.stderr, flush=True)


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    if not os.environ.get(ENV_DIR):
        return
    try:
        patch_scheduler()
    except Exception as e:  # noqa: BLE001 - a broken plugin must not stop vLLM
        _say(f"kvconform capture: the plugin could not install itself ({e!r}); "
             "vLLM runs unrecorded")


def patch_scheduler() -> None:
    """Instrument every vLLM Scheduler created from now on in this process."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, "_kvconform_patched", False):
        return
    original_init, original_shutdown = Scheduler.__init__, Scheduler.shutdown

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if getattr(self, "_kvconform_recorder", None) is None:
            start_capture(self)

    def shutdown(self):
        try:
            return original_shutdown(self)
        finally:
            stop_capture(self)

    Scheduler.__init__ = __init__
    Scheduler.shutdown = shutdown
    Scheduler._kvconform_patched = True


def start_capture(scheduler, folder: str | None = None):
    """Record `scheduler`'s KV cache manager into a new session folder."""
    try:
        from harness.capture.header import header_of
        from harness.capture.recorder import Recorder, instrument
        from harness.capture.segments import SegmentWriter

        root = folder or os.environ[ENV_DIR]
        session = os.path.join(
            root, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_sessions)}")
        source = os.environ.get(ENV_SOURCE, "production")
        about = os.environ.get(ENV_DESCRIPTION, "captured by the kvconform plugin")
        description = f"{about} (session {os.path.basename(session)})"

        def header():
            return header_of(scheduler, source, description, with_model=True)

        # Checked now (a config the trace cannot state is refused at once);
        # written at the first call, when vLLM has drawn its NONE_HASH.
        hash_block_size = header().cache.hash_block_size
        writer = SegmentWriter(session, header,
                               int(os.environ.get(ENV_MAX_EVENTS, "1000000")))
        recorder = Recorder(
            writer, hash_block_size, strict=False,
            free_queue_checkpoints=os.environ.get(ENV_FREE_QUEUE) == "1",
            report_shared_prefix_boundary=header().cache.reports_shared_prefix_boundary)
        instrument(scheduler.kv_cache_manager, recorder)
        scheduler._kvconform_recorder = recorder
        _on_stop_signals(writer)
        # A server killed without shutdown still closes its part on exit.
        atexit.register(recorder.stop, "process exit")
        _say(f"{READY}{session} (pid {os.getpid()}; join it with: kvconform capture join "
             f"{session} --out trace.jsonl)")
        return recorder
    except Exception as e:  # noqa: BLE001 - never stop the server
        log.debug("kvconform capture could not start", exc_info=True)
        _say(f"kvconform capture could not start ({e}); vLLM runs unrecorded")
        return None


def _on_stop_signals(writer) -> None:
    """At SIGINT/SIGTERM, put everything on disk before the handler vLLM (or
    Python) installed runs: a server stopped with Ctrl-C kills its engine core
    moments later."""
    if threading.current_thread() is not threading.main_thread():
        return  # handlers can only be installed from the main thread
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN:
            # The process was started ignoring it (a background job of a
            # non-interactive shell ignores SIGINT): hooking it would make the
            # capture act on a signal the server goes on running through.
            continue

        def handler(signum, frame, previous=previous):
            try:
                writer.stopping()
            except Exception:  # noqa: BLE001, S110 - whatever happens, vLLM's handler runs
                pass
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


def stop_capture(scheduler) -> None:
    recorder = getattr(scheduler, "_kvconform_recorder", None)
    if recorder is not None:
        recorder.stop("scheduler shutdown")
