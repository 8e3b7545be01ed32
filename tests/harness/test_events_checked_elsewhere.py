"""reader.events_checked_elsewhere, the diff's second reader of a trace: the
same events as the checking reader for every bundled trace, and it stops, rather
than raises, at a line no reader accepts."""

import pytest

from harness.trace import find_traces, open_trace
from harness.trace.reader import events_checked_elsewhere


@pytest.mark.parametrize("path", [p for p in find_traces(["traces"]) if p.endswith(".jsonl")])
def test_the_same_events_as_the_checking_reader(path):
    checked = [r.event for r in open_trace(path).records]
    assert list(events_checked_elsewhere(path)) == checked


def test_a_line_no_reader_accepts_ends_the_events(tmp_path):
    path = tmp_path / "t.jsonl"
    src = "traces/golden/v0.32/tight-memory-preemption.jsonl"
    with open(src) as f:
        lines = [next(f) for _ in range(11)]
    path.write_text("".join(lines) + "{not json\n" + lines[1])
    assert len(list(events_checked_elsewhere(str(path)))) == 10
