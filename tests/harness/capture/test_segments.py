"""Rotating parts of a server's trace, kept on disk as they are written, and
joining them into one trace that says what it lacks."""

import json
import time

import pytest

from harness.capture.join import JoinError, join
from harness.capture.segments import PARTIAL, SegmentWriter, part_name, request_stop
from harness.capture.sinks import JsonlSink
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.sources.replay import check_trace
from harness.trace.codec import TraceHeader

from .conftest import capture_cli

HEADER = TraceHeader("0.32.0", "production", CacheConfig(8, (GroupConfig(4),)))


def _events(n, requests_left_running=0):
    """n events of a valid trace: requests added, allocated and freed in turn,
    each in its own step; the last ones left running."""
    out = []
    i = 0
    while len(out) < n:
        r = f"r{i}"
        out += [{"op": "step"}, {"op": "add_request", "req": r, "prompt": [i % 5, 1, 2, 3, 4]},
                {"op": "lookup", "req": r}, {"op": "allocate", "req": r, "num_new_tokens": 5},
                {"op": "free", "req": r}]
        i += 1
    out = out[: n - n % 5]
    for k in range(requests_left_running):
        out.pop(-1 - 4 * k)  # their frees
    return out


def _part(folder, i, partial=False):
    return folder / (part_name(i) + (PARTIAL if partial else ""))


def _lines(path):
    return path.read_bytes().decode().splitlines()


def test_parts_rotate_and_join_into_the_same_trace(tmp_path):
    events = _events(53)
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=10)
    for e in events:
        w.write(e)
    w.close()
    parts = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert parts == [part_name(i) for i in range(5)]  # 50 events, 10 a part
    single = JsonlSink(str(tmp_path / "single.jsonl"), HEADER)
    for e in events:
        single.write(e)
    single.close()
    report = join(str(tmp_path / "s"), str(tmp_path / "joined.jsonl"))
    assert report.num_events == 50 and report.num_parts == 5 and not report.cut
    assert report.never_freed == [] and report.truncated is None
    assert (tmp_path / "joined.jsonl").read_bytes() == (tmp_path / "single.jsonl").read_bytes()
    assert check_trace(str(tmp_path / "joined.jsonl"), ["impl"]).exit_code == 0


def test_a_finished_request_is_on_disk_before_the_writer_is_closed(tmp_path):
    """commit() (the recorder's, at a request's free) writes everything through:
    a server killed right after answering the request loses nothing of it."""
    w = SegmentWriter(str(tmp_path / "s"), HEADER, flush_seconds=3600)  # no timer help
    for e in _events(10):
        w.write(e)
    w.commit()
    assert len(_lines(_part(tmp_path / "s", 0, partial=True))) == 11
    w.close()


def test_the_timer_writes_a_quiet_servers_lines(tmp_path):
    """Without a commit or a close, lines still reach the file (every 0.5 s)."""
    w = SegmentWriter(str(tmp_path / "s"), HEADER)
    for e in _events(5)[:3]:
        w.write(e)
    part = _part(tmp_path / "s", 0, partial=True)
    for _ in range(200):  # bounded by count; a loaded machine may be slow
        if len(_lines(part)) == 4:
            break
        time.sleep(0.1)
    assert len(_lines(part)) == 4
    w.close()


def test_stopping_names_the_part_at_once_and_writes_what_follows_through(tmp_path):
    """What the plugin does at SIGINT/SIGTERM: the part gets its final name (a
    server killed moments later still joins without flags), and every later
    line is written at once."""
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=4, flush_seconds=3600)
    events = _events(10)
    for e in events[:6]:
        w.write(e)
    w.stopping()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [part_name(0), part_name(1)]
    for e in events[6:]:
        w.write(e)
    # Not closed (the server was killed): everything is there all the same.
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [part_name(i)
                                                                  for i in range(3)]
    assert join(str(tmp_path / "s"), str(tmp_path / "j.jsonl")).num_events == 10


def test_the_header_can_wait_for_the_first_call(tmp_path):
    """The plugin's header states the NONE_HASH vLLM draws after building the
    scheduler: it is made at the first write, and nothing exists before."""
    made = []

    def header():
        made.append(1)
        return HEADER

    w = SegmentWriter(str(tmp_path / "s"), header)
    w.flush()
    assert not made and not any((tmp_path / "s").iterdir())
    w.write({"op": "step"})
    w.close()
    assert made == [1]
    assert _lines(_part(tmp_path / "s", 0))[1] == '{"op":"step"}'


def _killed_session(tmp_path, cut: bytes = b'{"op":"ste', running: int = 0):
    """A session whose server died mid-line without closing its part."""
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=10, flush_seconds=3600)
    for e in _events(25, requests_left_running=running):
        w.write(e)
    w.flush()
    with _part(tmp_path / "s", w.index, partial=True).open("ab") as f:
        f.write(cut)
    return tmp_path / "s"


def test_a_part_never_closed_is_refused_then_taken_and_marked_truncated(tmp_path, capsys):
    session = _killed_session(tmp_path, running=2)
    out = tmp_path / "j.jsonl"
    with pytest.raises(JoinError, match="--repair"):
        join(str(session), str(out))
    assert capture_cli(["capture", "join", str(session), "--out", str(out)]) == 2
    assert "never closed" in capsys.readouterr().err

    report = join(str(session), str(out), include_partial=True)
    assert report.cut and report.cut_bytes == len(b'{"op":"ste')
    assert report.num_events == 23 and report.never_freed == ["r3", "r4"]
    header = json.loads(out.read_text().splitlines()[0])
    assert "SIGKILL" in header["truncated"] and "2 requests never freed" in header["truncated"]
    o = check_trace(str(out), ["impl"])
    assert o.exit_code == 0 and o.truncated == header["truncated"]

    assert capture_cli(["replay", str(out)]) == 0
    verdict = capsys.readouterr().out
    assert ": truncated, 23 events" in verdict and "conformant," not in verdict


def test_repair_ends_the_trace_at_the_last_complete_step(tmp_path, capsys):
    session = _killed_session(tmp_path, running=1)
    out = tmp_path / "j.jsonl"
    assert capture_cli(["capture", "join", str(session), "--out", str(out), "--repair",
                        "--check"]) == 0
    said = capsys.readouterr().out
    assert "incomplete" in said and "1 requests never freed" not in said  # r4's step is gone
    assert "repaired: 4 events of the unfinished last step left out" in said
    lines = out.read_text().splitlines()
    # Steps of five events; the last one (r4's, without its free) is left out.
    assert len(lines) == 1 + 20 and json.loads(lines[-1]) == {"op": "free", "req": "r3"}
    assert "--repair" in json.loads(lines[0])["truncated"]
    assert ": truncated, 20 events" in said


def test_a_missing_part_is_refused(tmp_path):
    w = SegmentWriter(str(tmp_path / "s"), HEADER, max_events=5)
    for e in _events(20):
        w.write(e)
    w.close()
    _part(tmp_path / "s", 1).unlink()
    with pytest.raises(JoinError, match="a part is missing"):
        join(str(tmp_path / "s"), str(tmp_path / "j.jsonl"))


def test_a_forked_child_writes_nothing(tmp_path):
    """vLLM forks workers from the engine core: their copies of the writer (and
    its exit hook) must not write the parent's file."""
    import os

    w = SegmentWriter(str(tmp_path / "s"), HEADER, flush_seconds=3600)
    w.write({"op": "step"})
    pid = os.fork()
    if pid == 0:  # the child: write, flush, close, and leave without cleanup
        try:
            w.write({"op": "step"})
            w.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    w.close()
    assert _lines(_part(tmp_path / "s", 0))[1:] == ['{"op":"step"}']


def test_a_stop_request_closes_the_part_from_the_timer_and_is_answered(tmp_path):
    """`kvconform capture serve` asks with a file before it passes a Ctrl-C
    on: the timer thread names the part, writes every later line at once and
    deletes the file (its answer). Without a request nothing changes."""
    folder = tmp_path / "s"
    w = SegmentWriter(str(folder), HEADER, flush_seconds=0.05)
    events = _events(10)
    for e in events[:6]:
        w.write(e)
    for _ in range(100):  # the timer has written the lines; no request, so still .partial
        if _part(folder, 0, partial=True).exists() and len(_lines(_part(folder, 0, True))) == 7:
            break
        time.sleep(0.05)
    assert sorted(p.name for p in folder.iterdir()) == [part_name(0) + PARTIAL]
    request = request_stop(str(folder))
    for _ in range(400):  # bounded by count: a loaded machine may be slow
        if not request.exists():
            break
        time.sleep(0.05)
    assert not request.exists()
    assert sorted(p.name for p in folder.iterdir()) == [part_name(0)]
    w.write(events[6])  # written at once: no flush, no close
    assert len(_lines(_part(folder, 0))) == 8
    for e in events[7:]:
        w.write(e)
    assert join(str(folder), str(tmp_path / "j.jsonl")).num_events == 10
    w.close()


def test_close_answers_a_stop_request(tmp_path):
    w = SegmentWriter(str(tmp_path / "s"), HEADER, flush_seconds=3600)
    w.write({"op": "step"})
    request = request_stop(str(tmp_path / "s"))
    w.close()
    assert not request.exists() and _part(tmp_path / "s", 0).exists()
