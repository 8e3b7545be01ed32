"""replay / diff / record over traces, and the divergence report."""

import shutil
from pathlib import Path

import pytest
import yaml

from harness.replay import check_trace
from harness.report import format_divergence, outcome_json
from harness.trace import find_traces, open_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
EXAMPLE = TRACES / "scenarios" / "documented-example.yaml"


def test_replay_passes_on_every_bundled_trace():
    for path in find_traces([str(TRACES)]):
        o = check_trace(path, ["impl"])
        assert o.exit_code == 0, (path, o.error, o.divergence and format_divergence(o))
        assert o.num_events > 0


@pytest.mark.vllm
def test_diff_passes_on_every_bundled_trace_of_the_installed_version():
    checked = 0
    for path in find_traces([str(TRACES)]):
        o = check_trace(path, ["vllm", "impl"], explicit=False)
        assert o.exit_code == 0, (path, o.error, o.divergence and format_divergence(o))
        checked += o.skipped is None
    assert checked >= 12


def _edit_first_allocation(src: Path, dst: Path) -> int:
    """Change one recorded block id; return the line of the edited answer."""
    lines = src.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() == "answer: {block_ids: [[6, 7]]}":
            lines[i] = line.replace("[[6, 7]]", "[[6, 9]]")
            dst.write_text("".join(lines))
            return i + 1
    raise AssertionError("no allocation answer to edit")


def test_edited_answer_is_the_first_divergence(tmp_path):
    copy = tmp_path / "edited.yaml"
    line = _edit_first_allocation(EXAMPLE, copy)
    o = check_trace(str(copy), ["impl"])
    assert o.exit_code == 1
    d = o.divergence
    assert (d.line, d.field) == (line, "block_ids[0][1]")
    assert d.answers == {"recorded": {"block_ids": [[6, 9]]}, "impl": {"block_ids": [[6, 7]]}}
    text = format_divergence(o)
    assert f"{copy}:{line}: diverged at event #9 (allocate)" in text
    # The blocks involved, before and after, and the events that led there.
    c = o.context
    assert c.involved_blocks == [1, 2, 6, 7, 9]
    before = {s["block_id"]: s for s in c.before["impl"]}
    after = {s["block_id"]: s for s in c.after["impl"]}
    assert before[1]["ref_cnt"] == 1 and after[1]["ref_cnt"] == 2  # req1's hit
    assert before[7]["free"] and not after[7]["free"]
    assert [r["event"]["op"] for r in c.related][-2:] == ["add_request", "lookup"]
    assert outcome_json(o)["divergence"]["line"] == line


def test_expectation_mismatch_is_reported_with_its_line(tmp_path):
    copy = tmp_path / "expect.yaml"
    doc = yaml.safe_load(EXAMPLE.read_text())
    for e in doc["events"]:
        e.pop("answer", None)
    doc["events"][8]["expect"] = {"hit_tokens": 12}
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    o = check_trace(str(copy), ["impl"])
    assert o.exit_code == 1 and o.divergence.field == "hit_tokens"
    assert o.divergence.answers["expected"] == {"hit_tokens": 12}


def test_jsonl_copy_replays_identically(tmp_path):
    from harness.trace import TraceWriter

    src = open_trace(str(EXAMPLE))
    out = tmp_path / "example.jsonl"
    with TraceWriter(str(out), src.header) as w:
        for r in src.records:
            w.write(r.event, r.answer, r.expect, r.note)
    o = check_trace(str(out), ["impl"])
    assert o.exit_code == 0 and o.num_events == 18


@pytest.mark.vllm
def test_record_fills_answers_equal_to_the_recorded_ones(tmp_path):
    doc = yaml.safe_load(EXAMPLE.read_text())
    for e in doc["events"]:
        e.pop("answer", None)
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "recorded.jsonl"
    o = check_trace(str(bare), ["vllm"], writer_path=str(out))
    assert o.exit_code == 0 and o.recorded == str(out)
    fresh = [r.answer for r in open_trace(str(out)).records]
    bundled = [r.answer for r in open_trace(str(EXAMPLE)).records]
    assert fresh == bundled


def test_find_traces_walks_folders_in_order(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "b.yaml")
    (tmp_path / "sub").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "sub" / "a.yaml")
    (tmp_path / "notes.txt").write_text("x")
    assert find_traces([str(tmp_path)]) == [str(tmp_path / "b.yaml"),
                                           str(tmp_path / "sub" / "a.yaml")]
