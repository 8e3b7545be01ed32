"""replay / diff / record over traces, and the divergence report."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from harness.report.text import format_failure, outcome_json
from harness.sources.replay import check_trace
from harness.trace import find_traces, open_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
EXAMPLE = TRACES / "scenarios" / "documented-example.yaml"


def _bundled() -> list[str]:
    """Every bundled trace but the reproducers of vLLM's own bugs
    (traces/upstream/: the gate runs those on vLLM alone)."""
    from harness.gate.cases import is_known_upstream

    return [p for p in find_traces([str(TRACES)]) if not is_known_upstream(p)]


def test_replay_passes_on_every_bundled_trace():
    for path in _bundled():
        o = check_trace(path, ["impl"])
        assert o.exit_code == 0, (path, o.error,
                                  o.divergence and format_failure(o.divergence, o.context))
        assert o.num_events > 0


@pytest.mark.vllm
def test_diff_passes_on_every_bundled_trace_of_the_installed_version():
    checked = 0
    for path in _bundled():
        o = check_trace(path, ["vllm", "impl"], explicit=False)
        assert o.exit_code == 0, (path, o.error,
                                  o.divergence and format_failure(o.divergence, o.context))
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
    text = format_failure(o.divergence, o.context)
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


HEADER = ('{"format":"kvconform-trace/1","vllm_version":"0.32.0","source":"hand",'
          '"cache":{"num_blocks":8,"groups":[{"block_size":4}]}}\n')


@pytest.mark.vllm
@pytest.mark.parametrize("rules", ["on", "off"])
def test_a_call_vllm_rejects_is_one_line_exit_2_and_the_run_goes_on(tmp_path, capsys, rules,
                                                                     monkeypatch):
    """Caught up front by harness/trace/rules.py, or, for a call no rule
    foresees (here: the rules switched off), around the backend call."""
    from harness.cli.main import main
    from harness.trace.rules import TraceRules

    if rules == "off":
        monkeypatch.setattr(TraceRules, "check", lambda self, line, obj: None)
    bad = tmp_path / "lora.jsonl"
    bad.write_text(HEADER + '{"op":"add_request","req":"a","prompt":[1,2,3,4,5],'
                   '"lora":{"name":"x","int_id":1}}\n{"op":"lookup","req":"a"}\n')
    assert main(["diff", "--no-attention", str(bad), str(EXAMPLE)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{bad}:2: lora.path: vLLM rejects this: a LoRA request needs its adapter's path"
        if rules == "on" else
        f"{bad}:2: add_request: vLLM rejects this: AssertionError: lora_path cannot be empty"]
    assert f"{EXAMPLE}: conformant" in out and "Traceback" not in out + err
    assert main(["diff", "--no-attention", "--json", str(bad), str(EXAMPLE)]) == 2
    results = json.loads(capsys.readouterr().out)
    assert [r["exit_code"] for r in results] == [2, 0]
    assert results[0]["error"]["message"].startswith("vLLM rejects this")


def _impl_raises_at_lookup(monkeypatch):
    from harness.backends.impl_backend import ImplBackend

    def boom(self, request, max_cache_hit_length=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(ImplBackend, "_get_computed_blocks", boom)


def test_impl_raising_on_a_call_vllm_answered_is_a_divergence(monkeypatch):
    _impl_raises_at_lookup(monkeypatch)
    o = check_trace(str(EXAMPLE), ["impl"])
    assert o.exit_code == 1 and o.error is None
    d = o.divergence
    assert d.event.kind == "lookup" and d.answers["impl"] == "impl rejects this: RuntimeError: boom"
    assert "recorded" in d.answers


def test_impl_raising_on_an_input_only_call_is_a_rejection(tmp_path, monkeypatch):
    _impl_raises_at_lookup(monkeypatch)
    bare = tmp_path / "bare.jsonl"
    bare.write_text(HEADER + '{"op":"add_request","req":"a","prompt":[1,2,3,4,5]}\n'
                    '{"op":"lookup","req":"a"}\n')
    o = check_trace(str(bare), ["impl"])
    assert o.exit_code == 2 and o.divergence is None
    assert str(o.error) == f"{bare}:3: lookup: impl rejects this: RuntimeError: boom"


def test_a_config_a_backend_refuses_to_build_is_one_line(tmp_path, monkeypatch):
    from harness.backends.impl_backend import ImplBackend

    def refuse(self, *args, **kwargs):
        raise ValueError("no such layout")

    monkeypatch.setattr(ImplBackend, "__init__", refuse)
    o = check_trace(str(EXAMPLE), ["impl"])
    assert o.exit_code == 2
    assert str(o.error) == f"{EXAMPLE}:1: cache: impl rejects this: ValueError: no such layout"


def test_an_invariant_violation_is_a_divergence_of_its_own_kind(monkeypatch):
    from harness.core.compare import FailureKind
    from impl.invariants import InvariantChecker, InvariantViolation

    def broken(self, manager):
        raise InvariantViolation("ref_cnt 3 but 2 requests")

    monkeypatch.setattr(InvariantChecker, "check", broken)
    o = check_trace(str(EXAMPLE), ["impl"], check_invariants=True)
    assert o.exit_code == 1 and o.divergence.kind is FailureKind.INVARIANT
    assert o.divergence.index == 0
    assert format_failure(o.divergence).startswith(f"{EXAMPLE}:")
    assert "invariant violated at event #0 (add_request)" in format_failure(o.divergence)


def _workload_trace(path: Path, num_requests: int = 6) -> list[dict]:
    """A recorded scheduler-workload trace; its event lines as dicts."""
    from harness.backends.impl_backend import ImplBackend
    from harness.core.cache_config import CacheConfig, GroupConfig
    from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
    from harness.trace import TraceWriter
    from harness.trace.codec import TraceHeader
    from impl.profiles import get_profile

    profile, config = get_profile("0.32"), CacheConfig(num_blocks=24, groups=(GroupConfig(16),))
    backend = ImplBackend(config, profile)
    spec = WorkloadSpec(seed=5, block_size=16, num_requests=num_requests)
    with TraceWriter(str(path), TraceHeader("0.32.0", "scheduler", config, "t")) as w:
        for event, answer in drive(SchedulerWorkload(spec, profile, config.num_blocks).events(),
                                   backend.run):
            w.write(event, answer)
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def _rewrite(path: Path, events: list[dict]) -> None:
    header = path.read_text().splitlines()[0]
    path.write_text(header + "\n" + "".join(json.dumps(e) + "\n" for e in events))


def _edit_allocation_after(events: list[dict], start: int) -> int:
    """Changes the first allocation's answer from event `start` on; its index."""
    for i in range(start, len(events)):
        ids = events[i].get("answer", {}).get("block_ids")
        if events[i]["op"] == "allocate" and ids and ids[0]:
            ids[0][0] += 1 if ids[0][0] == 1 else -1  # another id of the pool
            return i
    raise AssertionError("no allocation to edit")


def test_a_failure_inside_a_batch_is_reported_as_event_by_event(tmp_path):
    """The batched run only proves a pass: a failure in the middle of a batch
    is reported from backends that stopped at it, as the event-by-event run
    (observe) reports it."""
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.lockstep import run_lockstep
    from harness.sources import replay

    path = tmp_path / "w.jsonl"
    events = _workload_trace(path)
    # An allocation inside a batch whose request is freed later in that batch:
    # the rest of the batch changes the blocks the report shows.
    def end(k: int) -> int:
        return (k // replay.BATCH + 1) * replay.BATCH

    i = next(k for k in range(1, len(events)) if events[k]["op"] == "allocate"
             and k % replay.BATCH and events[k].get("answer", {}).get("block_ids", [[]])[0]
             and any(e["op"] == "free" and e["req"] == events[k]["req"]
                     for e in events[k + 1:end(k)]))
    assert _edit_allocation_after(events, i) == i
    _rewrite(path, events)
    batched, stepped = check_trace(str(path), ["impl"]), check_trace(str(path), ["impl"],
                                                                      observe=True)
    assert batched.exit_code == stepped.exit_code == 1
    assert batched.num_events == stepped.num_events == i + 1
    assert (batched.divergence.line, batched.divergence.field) == (i + 2, "block_ids[0][0]")
    assert batched.divergence.answers == stepped.divergence.answers
    assert batched.context == stepped.context
    # The backend's state after the diverging event, as a fresh run to it has
    # it; the rest of its batch would change it (this test would see that).
    trace = open_trace(str(path))
    records = list(trace.records)
    fresh = ImplBackend(trace.header.cache, trace.profile)
    run_lockstep([r.event for r in records[:i + 1]], [fresh])
    blocks = batched.context.involved_blocks
    assert batched.context.after["impl"] == [fresh.block_state(b) for b in blocks]
    run_lockstep([r.event for r in records[i + 1:end(i)]], [fresh])
    assert batched.context.after["impl"] != [fresh.block_state(b) for b in blocks]


def test_bad_input_after_a_divergence_in_the_same_batch_comes_second(tmp_path):
    """The reader's error is held until the events before it ran: the earlier
    divergence is what the run reports; alone, the bad line is exit 2."""
    from harness.sources import replay

    path = tmp_path / "w.jsonl"
    events = _workload_trace(path)
    bad = replay.BATCH + 40
    events[bad] = {"op": "no_such_op"}
    _rewrite(path, events)
    o = check_trace(str(path), ["impl"])
    assert o.exit_code == 2 and o.error.line == bad + 2 and o.error.field == "op"
    i = _edit_allocation_after(events, replay.BATCH + 1)
    assert i < bad
    _rewrite(path, events)
    o = check_trace(str(path), ["impl"])
    assert o.exit_code == 1 and o.divergence.line == i + 2 and o.error is None
