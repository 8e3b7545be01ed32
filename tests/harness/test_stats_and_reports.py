"""`kvconform stats` and `kvconform report`: the traffic of a trace (hand-derived
here), pages with unique names, an index over all traces, a page for a refused
trace, and truncated traces said to be truncated; the CLI's own manners."""

import json
import re
import shutil
from pathlib import Path

import pytest

from harness.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "traces" / "scenarios" / "documented-example.yaml"
HEADER = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
          "cache": {"num_blocks": 3, "groups": [{"block_size": 4}]}}
PROMPT = list(range(8))
# Two usable blocks of 4 tokens. a fills both and is freed (both stay cached,
# freed tail first: the free queue is [2, 1]); b has a's prompt: its lookup hits
# block 1 (at most 7 of its 8 tokens can hit: one block), and its 4 new tokens
# take block 2 from the queue's head, evicting a's second block; then b is
# preempted, and never freed.
EVENTS = [{"op": "step"}, {"op": "add_request", "req": "a", "prompt": PROMPT},
          {"op": "lookup", "req": "a"}, {"op": "allocate", "req": "a", "num_new_tokens": 8},
          {"op": "step"}, {"op": "free", "req": "a"},
          {"op": "step"}, {"op": "add_request", "req": "b", "prompt": PROMPT},
          {"op": "lookup", "req": "b"}, {"op": "allocate", "req": "b", "num_new_tokens": 4},
          {"op": "step"}, {"op": "preempt", "req": "b"}]


def _trace(path: Path, header=HEADER, events=EVENTS) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(x) for x in [header, *events]) + "\n")
    return str(path)


def test_stats_is_the_traffic_derived_by_hand(tmp_path, capsys):
    path = _trace(tmp_path / "t.jsonl")
    assert main(["stats", "--json", path]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["traffic"] == {
        "events": 12, "steps": 4, "requests": 2, "never_freed": 1, "lookups": 2,
        "queried_tokens": 16, "hit_tokens": 4, "hit_rate": 0.25, "preemptions": 1,
        "evicted_blocks": 1, "peak_usage": 1.0}
    assert [(s["step"], s["hit_tokens"], s["evicted_blocks"], s["preemptions"], s["usage"])
            for s in r["steps"]] == [(0, 0, 0, 0, 1.0), (1, 0, 0, 0, 0.0),
                                     (2, 4, 1, 0, 1.0), (3, 0, 0, 1, 0.0)]
    assert r["requests"] == [
        {"req": "a", "prompt": 8, "hit_tokens": 0, "peak_blocks": 2, "first_step": 0,
         "last_step": 1, "preemptions": 0},
        {"req": "b", "prompt": 8, "hit_tokens": 4, "peak_blocks": 2, "first_step": 2,
         "last_step": None, "preemptions": 1}]
    assert main(["stats", path]) == 0
    text = capsys.readouterr().out
    assert "hit rate 25.0% (4 of 16 tokens looked up)" in text
    assert "preemptions: 1; evicted blocks: 1" in text and "1 never freed" in text


def test_stats_without_kv_events_does_not_pretend_to_count_evictions(tmp_path, capsys):
    header = {**HEADER, "cache": {**HEADER["cache"], "enable_kv_cache_events": False}}
    assert main(["stats", "--json", _trace(tmp_path / "t.jsonl", header)]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["traffic"]["evicted_blocks"] is None


def test_report_writes_unique_pages_an_index_and_a_page_for_a_refused_trace(tmp_path, capsys):
    a = _trace(tmp_path / "x" / "t.jsonl")
    b = _trace(tmp_path / "y" / "t.jsonl")
    refused = _trace(tmp_path / "old.jsonl", {**HEADER, "vllm_version": "0.8.5"})
    diverged = _trace(tmp_path / "bad.jsonl", events=EVENTS[:3] + [
        {**EVENTS[3], "answer": {"block_ids": [[2, 1]]}}])
    out = tmp_path / "report"
    assert main(["report", a, b, refused, diverged, "--out", str(out)]) == 3
    names = sorted(p.name for p in out.iterdir())
    assert {"x-t.html", "y-t.html", "old.html", "bad.html", "index.html"} <= set(names)
    assert {"x-t.png", "y-t.png", "bad.png"} <= set(names) and "old.png" not in names
    index = (out / "index.html").read_text()
    rows = re.findall(r"<tr><td>(.*?)</tr>", index)
    assert len(rows) == 4
    assert 'href="x-t.html"' in index and 'href="y-t.html"' in index
    for row in rows[:2]:  # verdict, events, steps, requests, hit rate, preemptions, evicted
        cells = re.findall(r"<td>(.*?)</td>", "<td>" + row)
        assert [re.sub("<.*?>", "", c) for c in cells[1:]] == [
            "conformant", "12", "4", "2", "25.0%", "1", "1", "100.0%"]
    old = (out / "old.html").read_text()
    assert "not checked (environment)" in old and "0.8.5 has no profile" in old
    assert "Not run: the environment cannot check it" in old
    assert "DIVERGED" in (out / "bad.html").read_text()


def test_a_truncated_trace_is_never_plainly_conformant(tmp_path, capsys):
    header = {**HEADER, "truncated": "the server died without closing its capture"}
    path = _trace(tmp_path / "t.jsonl", header)
    assert main(["replay", path]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"{path}: truncated, 12 events") and "conformant," not in line
    assert main(["report", path, "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "t.html").read_text()
    assert ">truncated<" in page and "the server died without closing" in page
    assert ">truncated<" in (tmp_path / "r" / "index.html").read_text()


def test_version_and_a_description_for_every_verb(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.match(r"kvconform \S+; vLLM \S+ installed", capsys.readouterr().out)
    parser = build_parser()
    verbs = next(a for a in parser._actions if a.dest == "verb").choices
    missing = [name for name, p in verbs.items() if not p.description]
    assert not missing and {"replay", "diff", "report", "conform", "stats"} <= set(verbs)


def test_a_missing_path_and_a_folder_of_capture_parts_are_one_line_each(tmp_path, capsys):
    parts = tmp_path / "cap" / "20260101-000000-1-0"
    parts.mkdir(parents=True)
    (parts / "part-000000.kvpart").write_text("{}\n")
    nope = tmp_path / "nope.jsonl"
    assert main(["replay", str(nope), str(tmp_path / "cap"), str(EXAMPLE)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"kvconform: {nope}: no such file or folder",
        f"kvconform: {tmp_path / 'cap'}: holds capture parts, not traces: join them into one "
        f"first (kvconform capture join {tmp_path / 'cap'} --out trace.jsonl)"]
    assert f"{EXAMPLE}: conformant" in out


@pytest.mark.vllm
def test_a_diff_that_checked_nothing_is_exit_3(tmp_path, capsys):
    """A folder of traces for another vLLM version is skipped by diff: that is
    no pass (issue 15, 7c)."""
    folder = tmp_path / "v017"
    folder.mkdir()
    shutil.copy(ROOT / "traces" / "scenarios" / "documented-example-v0.17.yaml", folder)
    assert main(["diff", str(folder)]) == 3
    out, err = capsys.readouterr()
    assert "skipped" in out and "no trace was checked" in err


@pytest.mark.vllm
def test_the_gate_shows_a_truncated_trace_as_truncated(tmp_path):
    from harness.gate.cases import run_trace
    from harness.gate.run import format_table

    header = {**HEADER, "truncated": "the server died without closing its capture"}
    case = run_trace(_trace(tmp_path / "t.jsonl", header))
    assert case.exit_code == 0 and case.verdict == "truncated"
    assert "lacks its end" in case.report
    assert format_table([case]).splitlines()[2].endswith("truncated")
