"""Scheduler-driven capture: vLLM's real Scheduler, recorded; the trace replays on
impl and diffs against vLLM; what a trace cannot say stops the capture loudly."""

import json

import pytest

from harness.capture.errors import CaptureGap
from harness.capture.presets import load_preset
from harness.capture.recorder import _ALLOCATE_DEFAULTS, Recorder, instrument
from harness.capture.sinks import JsonlSink
from harness.core.events import Allocate
from harness.sources.replay import check_trace
from harness.trace import open_trace
from harness.trace.codec import event_from_dict, event_to_dict

from .conftest import GOLDEN, capture_cli

pytestmark = pytest.mark.vllm


def test_the_recorder_knows_allocates_defaults():
    from dataclasses import fields

    assert _ALLOCATE_DEFAULTS == {f.name: f.default for f in fields(Allocate)
                                  if f.name not in ("req", "num_new_tokens")}


def test_capture_replays_on_impl_and_diffs_against_vllm(tmp_path, small_preset, capsys):
    preset = small_preset("tight-memory-preemption", requests={"count": 10})
    out = tmp_path / "t.jsonl"
    assert capture_cli(["capture", "scheduler", "--preset", preset, "--out", str(out),
                        "--check"]) == 0
    assert "conformant" in capsys.readouterr().out
    ops = [json.loads(line)["op"] for line in out.read_text().splitlines()[1:]]
    # The scheduler's calls, in its order: preemptions under a tight pool included.
    for op in ("step", "add_request", "lookup", "allocate", "record_stats", "append_tokens",
               "free", "preempt", "checkpoint"):
        assert op in ops, op
    assert check_trace(str(out), ["vllm", "impl"]).exit_code == 0
    # The same preset gives the same trace.
    again = tmp_path / "again.jsonl"
    assert capture_cli(["capture", "scheduler", "--preset", preset, "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_lines_are_in_the_codecs_canonical_form():
    """The recorder writes JSON directly (for speed); it must be what the codec
    writes for the same event."""
    for path in sorted((GOLDEN / "v0.32").glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines()[1:200], 2):
            obj = json.loads(line)
            back = event_to_dict(event_from_dict(obj), obj.get("answer"), obj.get("expect"),
                                 obj.get("note"))
            assert back == obj, f"{path}:{n}"


def _scheduler(source: str, tmp_path):
    """A real Scheduler, its trace header, and a request for it."""
    from harness.capture.header import header_of
    from harness.capture.scheduler_capture import _Requests, build_scheduler, hash_seed_env
    from harness.capture.synth import NewRequest
    from harness.capture.tiny_model import TinyModel

    preset = load_preset("few-shot")
    with hash_seed_env("0"):
        scheduler = build_scheduler(preset, TinyModel().write(str(tmp_path / "model")))
        requests = _Requests(preset)
        header = header_of(scheduler, source)
    return scheduler, header, requests.make(NewRequest("a", list(range(40)), 4))


def test_a_call_the_trace_cannot_express_is_refused_loudly(tmp_path):
    scheduler, header, request = _scheduler("scheduler", tmp_path)
    sink = JsonlSink(str(tmp_path / "t.jsonl"), header)
    instrument(scheduler.kv_cache_manager, Recorder(sink, header.cache.hash_block_size))
    manager = scheduler.kv_cache_manager
    # Adopting cached tokens without a lookup: no trace event says that.
    with pytest.raises(CaptureGap, match="without a lookup"):
        manager.allocate_slots(request, 8, num_new_computed_tokens=16)
    sink.close()
    assert open_trace(str(tmp_path / "t.jsonl")).header.source == "scheduler"


def test_a_lenient_recorder_ends_the_trace_and_vllm_carries_on(tmp_path, capsys):
    scheduler, header, request = _scheduler("production", tmp_path)
    sink = JsonlSink(str(tmp_path / "t.jsonl"), header)
    recorder = Recorder(sink, header.cache.hash_block_size, strict=False)
    instrument(scheduler.kv_cache_manager, recorder)
    manager = scheduler.kv_cache_manager
    blocks, hit, *_ = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, 8, num_new_computed_tokens=16)
    assert new is not None  # vLLM answered as without recording
    assert not recorder.active and "adopts 16 tokens" in recorder.gap
    # On stderr: a server's loggers have no handler for kvconform's.
    assert "kvconform capture stopped: " in capsys.readouterr().err
    manager.free(request)  # unrecorded from here on
    o = check_trace(str(tmp_path / "t.jsonl"), ["impl"])
    assert o.exit_code == 0 and o.num_events == 2  # add_request, lookup
