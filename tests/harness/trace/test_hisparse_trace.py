"""HiSparse in the trace format: its header fields and events read, write and
round-trip; bad HiSparse input is one TraceError naming the field (exit 2)."""

import json

import pytest

from harness.core.events import Checkpoint, Free, HiSparseAck, HiSparseStep
from harness.trace import TraceError, open_trace
from harness.trace.codec import event_from_dict, event_to_dict, header_from_dict, header_to_dict

GROUPS = [{"block_size": 16, "role": "hisparse_source"},
          {"block_size": 16, "role": "hisparse_indexer"},
          {"block_size": 16, "kind": "hisparse_resident"},
          {"block_size": 16, "kind": "hisparse_hot", "blocks_per_request": 2}]
HEADER = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
          "cache": {"num_blocks": 8, "groups": GROUPS, "max_model_len": 128,
                    "hisparse_host_num_blocks": 40}}
ADD = {"op": "add_request", "req": "r", "prompt": list(range(20))}
STEP = {"op": "hisparse_step", "scheduled": [["r", 0, 20]]}
ACK = {"op": "hisparse_ack", "finished_imports": ["r"], "failed_imports": ["r"],
       "copies_done": [3], "enqueued": [[0, 2]], "completed": [[0, 1]]}


def write(tmp_path, *lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def error_of(path) -> TraceError:
    with pytest.raises(TraceError) as e:
        list(open_trace(path).records)
    return e.value


def test_header_round_trips_with_roles_kinds_and_the_host_pool():
    header = header_from_dict(HEADER)
    cache = header.cache
    assert cache.hisparse and cache.hisparse_host_num_blocks == 40
    assert [g.role for g in cache.groups] == ["hisparse_source", "hisparse_indexer", None, None]
    assert cache.groups[3].blocks_per_request == 2
    assert header_to_dict(header)["cache"] == HEADER["cache"]


def test_events_round_trip():
    for obj, cls in ((STEP, HiSparseStep), (ACK, HiSparseAck)):
        event = event_from_dict(obj)
        assert isinstance(event, cls)
        assert event_to_dict(event) == obj
    step = event_from_dict(STEP)
    assert step.scheduled == (("r", 0, 20),)
    checkpoint = event_from_dict({"op": "checkpoint", "fields": ["hisparse"]})
    assert checkpoint.fields == ("hisparse",)


def test_a_default_checkpoint_does_not_ask_for_hisparse():
    assert "hisparse" not in Checkpoint().fields
    with pytest.raises(ValueError, match="unknown checkpoint field"):
        Checkpoint(("hisparse", "host"))


def test_a_trace_with_every_hisparse_op_reads(tmp_path):
    answered = {**STEP, "answer": {"transfers": [], "host_copies": [], "mirrors": {"r": []},
                                   "all_resident": True, "residency": {}}}
    path = write(tmp_path, HEADER, ADD, answered, ACK,
                 {"op": "checkpoint", "fields": ["hisparse"]}, {"op": "free", "req": "r"})
    records = list(open_trace(path).records)
    assert [type(r.event) for r in records][1:4] == [HiSparseStep, HiSparseAck, Checkpoint]
    assert isinstance(records[-1].event, Free)


def test_source_group_answers_are_host_block_ids(tmp_path):
    """Host block ids may exceed the device pool; beyond the host pool they
    are refused like any out-of-range id."""
    ok = {"op": "lookup", "req": "r", "answer": {"hit_tokens": 16,
                                                 "block_ids": [[33], [], [], []]}}
    list(open_trace(write(tmp_path, HEADER, ADD, ok)).records)
    bad = {"op": "lookup", "req": "r", "answer": {"hit_tokens": 16,
                                                  "block_ids": [[40], [], [], []]}}
    e = error_of(write(tmp_path, HEADER, ADD, bad, name="bad.jsonl"))
    assert (e.line, e.field) == (3, "answer.block_ids[0][0]")
    assert "hisparse_host_num_blocks 40" in e.message


PLAIN = {**HEADER, "cache": {"num_blocks": 8, "groups": [{"block_size": 16}]}}
CASES = {
    "host pool without a source group": (
        ({**HEADER, "cache": {**PLAIN["cache"], "hisparse_host_num_blocks": 9}},),
        1, "cache", "hisparse_host_num_blocks"),
    "source group without a host pool": (
        ({**HEADER, "cache": {"num_blocks": 8, "groups": GROUPS}},), 1, "cache",
        "hisparse_host_num_blocks"),
    "hot group without its region size": (
        ({**HEADER, "cache": {**HEADER["cache"], "groups": GROUPS[:3] + [
            {"block_size": 16, "kind": "hisparse_hot"}]}},), 1, "cache.groups.3",
        "blocks_per_request"),
    "role on another kind": (
        ({**HEADER, "cache": {**HEADER["cache"], "groups": [
            {"block_size": 16, "kind": "mamba", "role": "hisparse_source"}] + GROUPS[1:]}},),
        1, "cache.groups.0.kind", "full_attention"),
    "hisparse op without hisparse groups": ((PLAIN, ADD, STEP), 3, "op", "no HiSparse groups"),
    "hisparse checkpoint without hisparse groups": (
        (PLAIN, {"op": "checkpoint", "fields": ["hisparse"]}), 2, "fields", "no HiSparse"),
    "unknown request scheduled": ((HEADER, {**STEP, "scheduled": [["ghost", 0, 1]]}), 2,
                                  "scheduled[0]", "no request 'ghost'"),
    "malformed scheduled entry": ((HEADER, ADD, {**STEP, "scheduled": [["r", 0]]}), 3,
                                  "scheduled[0]", "must contain"),
    "unknown ack field": ((HEADER, {**ACK, "acked": []}), 2, "acked", "unknown field"),
    "0.17 has no HiSparse": (({**HEADER, "vllm_version": "0.17.1"},), 1, "cache.groups",
                             "no HiSparse"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_hisparse_input_is_one_error_naming_the_field(tmp_path, case):
    lines, line, field, message = CASES[case]
    e = error_of(write(tmp_path, *lines))
    assert (e.line, e.field) == (line, field), e
    assert message in e.message, e
    assert e.exit_code == 2
