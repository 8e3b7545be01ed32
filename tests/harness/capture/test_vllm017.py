"""Capture from vLLM 0.17.1 (through its overlay, ci/vllm-overlay.sh; `make test` runs these):
its Scheduler recorded, its KV events in the older array encoding."""

import pytest

from harness.sources.replay import check_trace

pytestmark = pytest.mark.vllm017


def test_a_017_scheduler_capture_replays_with_the_017_profile(tmp_path, small_preset):
    from harness.capture.kv_event_stream import Listen, subscribe
    from harness.capture.kv_event_trace import EventTraceBuilder
    from harness.capture.overlay_platform import use_cpu_platform_without_kernels
    from harness.capture.presets import load_preset
    from harness.capture.scheduler_capture import capture_preset

    use_cpu_platform_without_kernels()
    preset = load_preset(small_preset("tight-memory-preemption", requests={"count": 12}))
    out = tmp_path / "t.jsonl"
    publish = {"endpoint": f"ipc://{tmp_path}/pub", "replay_endpoint": f"ipc://{tmp_path}/rep"}
    batches = []
    capture_preset(preset, str(out), progress=False, publish=publish, before_shutdown=lambda:
                   batches.extend(subscribe(Listen(
                       publish["endpoint"], replay_endpoint=publish["replay_endpoint"],
                       idle_seconds=3.0, wait_seconds=60.0))))
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.profile == "0.17" and o.exit_code == 0
    assert batches and {b.encoding for b in batches} == {"array"}
    builder = EventTraceBuilder("0.17.1")
    for b in batches:
        builder.add_batch(b)
    builder.write(str(tmp_path / "ev.jsonl"), "0.17 events")
    assert not builder.skipped
    assert check_trace(str(tmp_path / "ev.jsonl"), ["impl"]).exit_code == 0
