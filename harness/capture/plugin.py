"""A vLLM general plugin that records traces from an unmodified `vllm serve`.

Registered as the entry point `kvconform_capture` in vLLM's group
`vllm.general_plugins` (pyproject.toml). vLLM loads general plugins in every
process it starts (API server, engine core, workers); `register()` does nothing
unless KVCONFORM_CAPTURE_DIR names an output folder. Then every vLLM Scheduler
created in the process (the engine core's) gets its KV cache manager
instrumented, and each engine run is one capture session:

    $KVCONFORM_CAPTURE_DIR/<yyyymmdd-hhmmss>-<pid>-<n>/part-000000.kvpart ...

joined into one trace by `kvconform capture join SESSION --out trace.jsonl`.

Settings (environment):
  KVCONFORM_CAPTURE_DIR         output folder; the plugin is off without it
  KVCONFORM_CAPTURE_MAX_EVENTS  events per part before rotating (default 1000000)
  KVCONFORM_CAPTURE_FREE_QUEUE  1: record the free queue after every free and
                                preemption (O(pool) each; off by default)
  KVCONFORM_CAPTURE_SOURCE      the header's `source` (default "production")
  KVCONFORM_CAPTURE_DESCRIPTION the header's `description` (the session's name is added)

The recorder is lenient here: whatever it cannot record ends the trace (with a
warning in vLLM's log) and the server carries on untouched.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import time

ENV_DIR = "KVCONFORM_CAPTURE_DIR"
ENV_MAX_EVENTS = "KVCONFORM_CAPTURE_MAX_EVENTS"
ENV_FREE_QUEUE = "KVCONFORM_CAPTURE_FREE_QUEUE"
ENV_SOURCE = "KVCONFORM_CAPTURE_SOURCE"
ENV_DESCRIPTION = "KVCONFORM_CAPTURE_DESCRIPTION"

log = logging.getLogger("kvconform.capture")
_sessions = itertools.count()


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    if not os.environ.get(ENV_DIR):
        return
    try:
        patch_scheduler()
    except Exception:  # noqa: BLE001 - a broken plugin must not stop vLLM
        log.exception("kvconform capture plugin could not install itself")


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
        header = header_of(scheduler, source, f"{about} (session {os.path.basename(session)})",
                           with_model=True)
        writer = SegmentWriter(session, header,
                               int(os.environ.get(ENV_MAX_EVENTS, "1000000")))
        recorder = Recorder(
            writer, header.cache.hash_block_size, strict=False,
            free_queue_checkpoints=os.environ.get(ENV_FREE_QUEUE) == "1",
            report_shared_prefix_boundary=header.cache.reports_shared_prefix_boundary)
        instrument(scheduler.kv_cache_manager, recorder)
        scheduler._kvconform_recorder = recorder
        # A server killed without shutdown still closes its part on exit.
        atexit.register(recorder.stop, "process exit")
        log.info("kvconform capture: recording into %s", session)
        return recorder
    except Exception:  # noqa: BLE001 - never stop the server
        log.exception("kvconform capture could not start; vLLM runs unrecorded")
        return None


def stop_capture(scheduler) -> None:
    recorder = getattr(scheduler, "_kvconform_recorder", None)
    if recorder is not None:
        recorder.stop("scheduler shutdown")
