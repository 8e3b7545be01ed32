"""Rotating parts of a server's trace, and joining them into one trace."""

import pytest

from harness.cache_config import CacheConfig, GroupConfig
from harness.capture.segments import JoinError, SegmentWriter, join, part_name
from harness.capture.sinks import JsonlSink
from harness.replay import check_trace
from harness.trace.codec import TraceHeader

HEADER = TraceHeader("0.32.0", "production", CacheConfig(8, (GroupConfig(4),)))


def _events(n):
    """n events of a valid trace: requests added, allocated and freed in turn."""
    out = []
    i = 0
    while len(out) < n:
        r = f"r{i}"
        out += [{"op": "step"}, {"op": "add_request", "req": r, "prompt": [i % 5, 1, 2, 3, 4]},
                {"op": "lookup", "req": r}, {"op": "allocate", "req": r, "num_new_tokens": 5},
                {"op": "free", "req": r}]
        i += 1
    return out[: n - n % 5]


def test_parts_rotate_and_join_into_the_same_trace(tmp_path):
    events = _events(53)
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=10)
    for e in events:
        w.write(e)
    w.close()
    parts = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert parts == [part_name(i) for i in range(6)]  # 50 events, 10 a part
    single = JsonlSink(str(tmp_path / "single.jsonl"), HEADER)
    for e in events:
        single.write(e)
    single.close()
    assert join(str(tmp_path / "s"), str(tmp_path / "joined.jsonl")) == 50
    assert (tmp_path / "joined.jsonl").read_bytes() == (tmp_path / "single.jsonl").read_bytes()
    assert check_trace(str(tmp_path / "joined.jsonl"), ["impl"]).exit_code == 0


def test_a_part_still_being_written_is_taken_only_on_request(tmp_path):
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=10)
    for e in _events(15):
        w.write(e)
    w._f.flush()
    # The server died mid-line.
    (tmp_path / "s" / (part_name(1) + ".partial")).open("ab").write(b'{"op":"ste')
    with pytest.raises(JoinError, match="--include-partial"):
        join(str(tmp_path / "s"), str(tmp_path / "j.jsonl"))
    assert join(str(tmp_path / "s"), str(tmp_path / "j.jsonl"), include_partial=True) == 15
    assert check_trace(str(tmp_path / "j.jsonl"), ["impl"]).exit_code == 0


def test_a_missing_part_is_refused(tmp_path):
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=5)
    for e in _events(20):
        w.write(e)
    w.close()
    (tmp_path / "s" / part_name(1)).unlink()
    with pytest.raises(JoinError, match="a part is missing"):
        join(str(tmp_path / "s"), str(tmp_path / "j.jsonl"))
