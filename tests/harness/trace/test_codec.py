"""Round trip: write -> read gives back identical events, answers and notes."""

import pytest

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    CacheBlocks,
    Checkpoint,
    EvictBlocks,
    Free,
    Lookup,
    LoRA,
    MMFeature,
    Preempt,
    PromptEmbeds,
    RecordStats,
    ResetPrefixCache,
    Step,
)
from harness.trace import TraceWriter, open_trace
from harness.trace.codec import ModelShape, TraceHeader

HEADER = TraceHeader(
    "0.32.0", "hand",
    CacheConfig(num_blocks=64, groups=(GroupConfig(16),), hash_algo="xxhash_cbor",
                hash_seed="123", enable_caching=True, max_model_len=4096, watermark=0.01),
    description="every kind of event", model=ModelShape(2, 2, 64, "bfloat16"),
    tensors="tensors.safetensors",
)

EVENTS = [
    (AddRequest("a", [1, 2, 3], lora=LoRA("l", 3, "/p"), cache_salt="s",
                mm=(MMFeature("img", 0, 2),), session_id="sess"), {"block_hashes": []}, None),
    (AddRequest("b", [0, 0, 0, 0], prompt_embeds=PromptEmbeds(4, 9),
                skip_reading_prefix_cache=True), None, "a note"),
    (Lookup("a"), {"hit_tokens": 0, "block_ids": [[]]}, None),
    (Allocate("a", 3, num_lookahead_tokens=2, num_external_computed_tokens=1,
              delay_cache_blocks=True, num_encoder_tokens=4, full_sequence_must_fit=True,
              reserved_blocks=2, has_scheduled_reqs=False), {"refused": True}, None),
    (AppendTokens("a", [7, 8]), {"block_hashes": ["ab12"]}, None),
    (CacheBlocks("a", 4), {}, None),
    (RecordStats("a", 0), {}, None),
    (Preempt("a"), {}, None),
    (Step(), {}, None),
    (EvictBlocks([3, 1]), {}, None),
    (ResetPrefixCache(), {"ok": False}, None),
    (Checkpoint(("free_queue", "events")), {"free_queue": [1, 2], "events": []}, None),
    (Checkpoint(), None, None),
    (Free("a"), {}, None),
]


@pytest.mark.parametrize("suffix", ["jsonl", "yaml"])
def test_write_then_read_is_identical(tmp_path, suffix):
    path = str(tmp_path / f"t.{suffix}")
    with TraceWriter(path, HEADER) as w:
        for event, answer, note in EVENTS:
            w.write(event, answer, {"block_hashes": []} if note else None, note)
    trace = open_trace(path)
    assert trace.header == HEADER
    records = list(trace.records)
    assert [r.event for r in records] == [e for e, _, _ in EVENTS]
    assert [r.answer for r in records] == [a for _, a, _ in EVENTS]
    assert [r.note for r in records] == [n for _, _, n in EVENTS]


def test_writer_leaves_nothing_behind_when_aborted(tmp_path):
    path = tmp_path / "t.jsonl"
    with pytest.raises(RuntimeError):
        with TraceWriter(str(path), HEADER) as w:
            w.write(Step(), {})
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_defaults_are_left_out(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(str(path), TraceHeader("0.32.0", "hand", CacheConfig(num_blocks=8))) as w:
        w.write(Allocate("r", 5))
    lines = path.read_text().splitlines()
    assert lines[1] == '{"op":"allocate","req":"r","num_new_tokens":5}'
