"""KV-event ingestion: both wire encodings decode alike, and a live stream from a
real vLLM scheduler becomes a trace the impl must reproduce, event for event."""

import json

import msgspec
import pytest

from harness.capture.kv_event_stream import StreamError, decode_payload
from harness.capture.kv_event_trace import EventTraceBuilder
from harness.report.text import format_failure
from harness.sources.replay import check_trace

from .conftest import capture_cli


# vLLM 0.17's wire form (array_like structs) and 0.32's (tagged maps), rebuilt
# here so that the decoder is checked against both without either vLLM.
class Ev017(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class BlockStored(Ev017, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object
    lora_name: object = None
    extra_keys: object = None


class BlockRemoved(Ev017, tag="BlockRemoved"):
    block_hashes: list
    medium: object


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: object = None


STORED = {"type": "BlockStored", "block_hashes": [11, 12], "token_ids": [1, 2, 3, 4],
          "block_size": 2, "medium": "GPU"}
REMOVED = {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}


def test_array_and_map_encodings_decode_to_the_same_events():
    array = msgspec.msgpack.encode(Batch(1.5, [
        BlockStored([11, 12], None, [1, 2, 3, 4], 2, None, "GPU"),
        BlockRemoved([12], "GPU")]))
    as_map = msgspec.msgpack.encode([1.5, [
        {**STORED, "parent_block_hash": None, "lora_id": None, "lora_name": None,
         "group_idx": 0},
        {**REMOVED, "group_idx": 0}]])
    a, m = decode_payload(array, 7), decode_payload(as_map, 8)
    assert a.encoding == "array" and m.encoding == "map"
    assert a.events == [STORED, REMOVED]
    assert m.events == [{**STORED, "group_idx": 0}, {**REMOVED, "group_idx": 0}]
    assert a.ts == m.ts == 1.5 and a.seq == 7


def test_byte_hashes_become_hex_as_in_checkpoints():
    payload = msgspec.msgpack.encode([0.0, [["BlockRemoved", [b"\x01\xff"], "GPU"]]])
    assert decode_payload(payload).events == [{"type": "BlockRemoved",
                                               "block_hashes": ["01ff"], "medium": "GPU"}]


@pytest.mark.parametrize("payload", [b"\xc1", msgspec.msgpack.encode({"a": 1}),
                                     msgspec.msgpack.encode([0.0, [["Teleported", 1]]])])
def test_what_is_not_a_batch_is_refused(payload):
    with pytest.raises(StreamError):
        decode_payload(payload)


@pytest.mark.vllm
def test_a_live_stream_becomes_a_trace_the_impl_reproduces(tmp_path, small_preset, capsys):
    from harness.capture.kv_event_stream import Listen, subscribe
    from harness.capture.kv_event_trace import StreamFile
    from harness.capture.presets import load_preset
    from harness.capture.scheduler_capture import capture_preset

    # LoRA adapters and salts, preemptions and evictions (BlockRemoved).
    preset = load_preset(small_preset("lora-and-salts", engine={"num_blocks": 48},
                                      requests={"count": 24}))
    sock = tmp_path / "ev"
    publish = {"endpoint": f"ipc://{sock}.pub", "replay_endpoint": f"ipc://{sock}.replay"}
    batches = []

    def grab():  # vLLM's replay socket serves every batch published so far
        batches.extend(subscribe(Listen(publish["endpoint"],
                                        replay_endpoint=publish["replay_endpoint"],
                                        idle_seconds=3.0, wait_seconds=60.0)))

    capture_preset(preset, str(tmp_path / "src.jsonl"), progress=False, publish=publish,
                   before_shutdown=grab)
    assert batches and {b.encoding for b in batches} == {"map"}
    assert [b.seq for b in batches] == list(range(len(batches)))
    kinds = {e["type"] for b in batches for e in b.events}
    assert {"BlockStored", "BlockRemoved"} <= kinds

    builder = EventTraceBuilder("0.32.0", lora_paths={
        n: f"/loras/{n}" for n in ("sql-adapter", "chat-adapter")})
    for b in batches:
        builder.add_batch(b)
    builder.write(str(tmp_path / "ev.jsonl"), "test")
    assert not builder.skipped
    o = check_trace(str(tmp_path / "ev.jsonl"), ["impl"])
    assert o.exit_code == 0, o.divergence and format_failure(o.divergence)
    # The server's events are the answers, all of them.
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()[1:]]
    published = [e for b in batches for e in b.events]
    assert [e for x in lines if x["op"] == "checkpoint" for e in x["answer"]["events"]] == \
        published

    # Without the adapters' paths, LoRA blocks cannot be rebuilt: left out, counted.
    saved = StreamFile(str(tmp_path / "stream.jsonl"))
    for b in batches:
        saved.write(b)
    saved.close()
    assert capture_cli(["capture", "kv-events", "--from-stream", str(tmp_path / "stream.jsonl"),
                        "--out", str(tmp_path / "nolora.jsonl"), "--hash-seed", "0",
                        "--check"]) == 0
    out = capsys.readouterr().out
    assert "LoRA block without --lora-path" in out and "conformant" in out

    # A wrong hash seed is caught by the replay: the hashes differ.
    assert capture_cli(["capture", "kv-events", "--from-stream", str(tmp_path / "stream.jsonl"),
                        "--out", str(tmp_path / "bad.jsonl"), "--hash-seed", "1",
                        "--check"]) == 1
