"""What recording costs a running engine: steps/s of the tiny engine with and without it.

One in-process engine runs the same preset traffic several times, alternately
bare and instrumented the way the server plugin instruments it (lenient
recorder, rotating parts, no free-queue checkpoints); the prefix cache is
reset between runs so that every run starts alike. Alternating spreads the
machine's noise over both sides; the medians are compared. Steps are counted
per second of this process's CPU time (all its threads): other processes
sharing the machine slow the wall clock, not that.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from harness.capture.presets import Preset
from harness.capture.recorder import Recorder


@dataclass(slots=True)
class _TimedRecorder(Recorder):
    """Also adds up the time spent recording (every hook runs through call)."""

    seconds: float = 0.0

    def call(self, hook, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return Recorder.call(self, hook, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


@dataclass(slots=True)
class Overhead:
    steps: int
    bare_steps_per_s: float
    recorded_steps_per_s: float
    runs: int
    events_per_run: int
    bare_runs: list[float]
    recorded_runs: list[float]
    # The same by the wall clock (noisier on a shared machine).
    bare_wall_steps_per_s: float = 0.0
    recorded_wall_steps_per_s: float = 0.0
    # Time inside the recorder per step, measured directly (robust to noise).
    recording_us_per_step: float = 0.0

    @property
    def best_percent(self) -> float:
        """The same from each side's fastest run (the least disturbed)."""
        return 100.0 * (max(self.bare_runs) / max(self.recorded_runs) - 1.0)

    @property
    def direct_percent(self) -> float:
        """Recording time per step in percent of the bare step time."""
        return 100.0 * self.recording_us_per_step * 1e-6 * self.bare_steps_per_s

    @property
    def percent(self) -> float:
        """Extra time per step with recording, in percent of the bare step time."""
        return 100.0 * (self.bare_steps_per_s / self.recorded_steps_per_s - 1.0)


def measure(preset: Preset, runs: int = 3, block_size: int = 32) -> Overhead:
    """The model and the recorded parts live in a temp folder removed at the end."""
    with tempfile.TemporaryDirectory(prefix="kvconform-overhead-") as scratch:
        return _measure(preset, runs, block_size, scratch)


def _measure(preset: Preset, runs: int, block_size: int, scratch: str) -> Overhead:
    from harness.capture.engine_capture import _env, build_llm, drive, engine_preset
    from harness.capture.header import header_of
    from harness.capture.recorder import instrument, uninstrument
    from harness.capture.scheduler_capture import hash_seed_env
    from harness.capture.segments import SegmentWriter
    from harness.capture.tiny_model import TinyModel

    preset = engine_preset(preset, block_size)
    model_dir = TinyModel(vocab_size=max(preset.requests.vocab, 16)).write(
        os.path.join(scratch, "model"))
    bare: list[float] = []
    recorded: list[float] = []
    wall: dict[bool, list[float]] = {False: [], True: []}
    steps = events = 0
    recording: list[float] = []
    with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
              VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")), \
            hash_seed_env(preset.engine.hash_seed):
        llm = build_llm(preset, model_dir)
        try:
            engine = llm.llm_engine
            scheduler = engine.engine_core.engine_core.scheduler
            manager = scheduler.kv_cache_manager
            # A first run warms caches and allocators; it is not counted.
            drive(engine, preset, progress=False)
            for i in range(2 * runs):
                engine.reset_prefix_cache()
                record = i % 2 == 1
                writer = recorder = None
                if record:
                    header = header_of(scheduler, "engine")
                    writer = SegmentWriter(os.path.join(scratch, f"run-{i}"), header)
                    recorder = _TimedRecorder(
                        writer, header.cache.hash_block_size, strict=False,
                        report_shared_prefix_boundary=header.cache.reports_shared_prefix_boundary)
                    instrument(manager, recorder)
                before = scheduler.current_step if hasattr(scheduler, "current_step") else 0
                t0, c0 = time.perf_counter(), time.process_time()
                drive(engine, preset, progress=False)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                n = (scheduler.current_step - before) if hasattr(scheduler, "current_step") \
                    else recorder.num_steps
                steps = n
                (recorded if record else bare).append(n / cpu)
                wall[record].append(n / seconds)
                if record:
                    recording.append(recorder.seconds / n)
                    recorder.stop()
                    uninstrument(manager)
                    events = writer.num_events
        finally:
            engine.engine_core.shutdown()
    return Overhead(steps, statistics.median(bare), statistics.median(recorded), runs, events,
                    bare, recorded, statistics.median(wall[False]),
                    statistics.median(wall[True]), 1e6 * statistics.median(recording))
