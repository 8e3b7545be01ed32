"""A KV connector's lookups (get_computed_blocks_for_connector, Lookup with
for_connector; truncate_computed_blocks, TruncateComputedBlocks): the scenario
traces/scenarios/connector-lookup.yaml diffs conformant, a bug planted in
vLLM's truncate_computed_blocks or in its connector lookup fails the trace's
gate case (negative controls), the recorder writes both calls as these events
(the trace of a recorded run replays as the run answered), and a release
without them refuses the events in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.core.exit_codes import ExitCode
from harness.gate.cases import run_trace
from harness.sources.replay import check_trace
from harness.trace import open_trace

pytestmark = pytest.mark.vllm

TRACE = "traces/scenarios/connector-lookup.yaml"


def test_the_scenario_is_conformant():
    outcome = check_trace(TRACE, ["vllm", "impl"])
    assert outcome.exit_code == ExitCode.OK, outcome.error or outcome.divergence


def test_a_bug_in_vllms_truncate_fails_the_gate(monkeypatch):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    real = KVCacheManager.truncate_computed_blocks

    def keeps_one_block_more(self, blocks, num_computed_tokens):
        return real(self, blocks, num_computed_tokens + self.coordinator.single_type_managers[0]
                    .block_size)

    monkeypatch.setattr(KVCacheManager, "truncate_computed_blocks", keeps_one_block_more)
    case = run_trace(TRACE)
    assert case.exit_code == ExitCode.DIVERGED
    assert "truncate_computed_blocks" in case.report and "block_ids" in case.report


def test_a_bug_in_vllms_connector_lookup_fails_the_gate(monkeypatch):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    real = KVCacheManager.get_computed_blocks_for_connector

    def never_flags(self, request):
        return (*real(self, request)[:3], False)

    monkeypatch.setattr(KVCacheManager, "get_computed_blocks_for_connector", never_flags)
    case = run_trace(TRACE)
    assert case.exit_code == ExitCode.DIVERGED and "hit_diverged" in case.report


def test_the_recorder_writes_the_connector_calls_as_their_events():
    from harness.backends.vllm_backend import VllmBackend
    from harness.capture.recorder import Recorder, instrument, uninstrument

    trace = open_trace(TRACE)
    records = list(trace.records)
    backend = VllmBackend(trace.header.cache, trace.profile)
    lines: list[dict] = []
    sink = SimpleNamespace(write=lines.append, close=lambda: None, commit=lambda: None)
    instrument(backend.manager, Recorder(sink, trace.header.cache.hash_block_size))
    try:
        for r in records:
            backend.run(r.event)
    finally:
        uninstrument(backend.manager)
    recorded = {(d["op"], d.get("req")): d for d in lines
                if d["op"] in ("lookup", "truncate_computed_blocks")}
    lookup_b = next(r for r in records if r.event.kind == "lookup" and r.event.req == "b")
    truncate = next(r for r in records if r.event.kind == "truncate_computed_blocks")
    assert recorded[("lookup", "b")] == {"op": "lookup", "req": "b", "for_connector": True,
                                         "answer": lookup_b.answer}
    assert recorded[("truncate_computed_blocks", "b")] == {
        "op": "truncate_computed_blocks", "req": "b", "num_computed_tokens": 8,
        "answer": truncate.answer}
    # One lookup per scheduler call: the plain lookup vLLM makes inside is not recorded.
    assert sum(d["op"] == "lookup" for d in lines) == 2


def test_a_release_without_them_refuses_the_events(tmp_path):
    from dataclasses import replace

    from harness.backends import vllm_backend
    from harness.backends.base import BackendError
    from harness.core.events import AddRequest, Lookup

    trace = open_trace(TRACE)
    backend = vllm_backend.VllmBackend(trace.header.cache, trace.profile)
    backend.api = replace(backend.api, has_connector_lookup=False)
    backend.run(AddRequest("x", list(range(9))))
    with pytest.raises(BackendError, match="has no KV connector lookup") as e:
        backend.run(Lookup("x", for_connector=True))
    assert e.value.field == "for_connector"
