"""What recording costs the tiny real engine: steps/s with and without the
capture instrumentation (the server plugin's), same traffic, alternating runs."""

import pytest

from harness.capture.overhead import measure
from harness.capture.presets import load_preset


@pytest.mark.benchmark(group="capture-overhead")
def test_capture_overhead_tiny_engine(benchmark):
    o = benchmark.pedantic(measure, args=(load_preset("long-generations"),),
                           kwargs={"runs": 3}, rounds=1, iterations=1)
    benchmark.extra_info.update(
        overhead_pct=o.percent,
        direct_pct=o.direct_percent,
        bare_steps_per_s=o.bare_steps_per_s,
        recorded_steps_per_s=o.recorded_steps_per_s,
        recording_us_per_step=o.recording_us_per_step,
        detail=(f"{o.bare_steps_per_s:.0f} vs {o.recorded_steps_per_s:.0f} steps/CPU-s; "
                f"{o.recording_us_per_step:.0f} us recording a step = "
                f"{o.direct_percent:.2f} % measured directly"),
    )
