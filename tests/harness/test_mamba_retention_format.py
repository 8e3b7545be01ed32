"""The Mamba checkpoint / speculative / retention knobs in the trace format,
the backends and the fuzzer (specs/TRACE_FORMAT.md): round trips, the
lookup's shared-prefix boundary, and releases without a knob refusing it."""

from __future__ import annotations

import dataclasses

import jsonschema
import pytest

from harness.backends.base import BackendError
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import (
    AddRequest,
    Allocate,
    FinalizePartialTailOffloads,
    Lookup,
    Step,
    TakeBoundaryStateOffloads,
)
from harness.fuzz.configs import template_supported
from harness.sources.replay import check_trace
from harness.trace.codec import cache_from_dict, cache_to_dict, event_from_dict, event_to_dict
from harness.trace.schema import load_schema, validate_event
from impl.profiles import get_profile

P32, P17 = get_profile("0.32"), get_profile("0.17")
CHECKPOINTS = CacheConfig(num_blocks=20, groups=(
    GroupConfig(2), GroupConfig(8, "mamba", num_prefill_checkpoint_blocks=1,
                                prefill_checkpoint_alignment=2, num_speculative_blocks=1)),
    prefix_cache_retention_interval=0)
JUNCTION = CacheConfig(num_blocks=24, groups=(GroupConfig(4), GroupConfig(4, "mamba")),
                       prefix_cache_retention_interval=0)


def _header(cache: dict) -> dict:
    return {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
            "cache": cache}


def test_new_knobs_round_trip_through_the_header():
    d = cache_to_dict(CHECKPOINTS)
    assert d["groups"][1] == {"block_size": 8, "kind": "mamba", "num_speculative_blocks": 1,
                              "num_prefill_checkpoint_blocks": 1,
                              "prefill_checkpoint_alignment": 2}
    assert d["prefix_cache_retention_interval"] == 0
    assert cache_from_dict(d) == CHECKPOINTS
    jsonschema.validate(_header(d), {"$ref": "#/definitions/header", **load_schema()})
    # Unset, they stay out of the header (older traces are unchanged).
    assert "prefix_cache_retention_interval" not in cache_to_dict(
        dataclasses.replace(CHECKPOINTS, prefix_cache_retention_interval=None))


@pytest.mark.parametrize("group", [
    {"block_size": 4, "num_speculative_blocks": 1},
    {"block_size": 4, "kind": "sliding_window", "sliding_window": 4,
     "num_prefill_checkpoint_blocks": 1},
    {"block_size": 4, "prefill_checkpoint_alignment": 4},
])
def test_mamba_fields_belong_to_mamba_groups(group):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_header({"num_blocks": 4, "groups": [group]}),
                            {"$ref": "#/definitions/header", **load_schema()})
    with pytest.raises(ValueError, match="does not apply"):
        GroupConfig(**group)


def test_new_ops_validate_and_round_trip():
    for event, answer in ((TakeBoundaryStateOffloads(), {"offloads": {"p": [[1, 9, 14]]}}),
                          (FinalizePartialTailOffloads("p"), {"offloads": [[1, 9, 14]]})):
        d = event_to_dict(event, answer)
        validate_event(d)
        assert event_from_dict(d) == event
    with pytest.raises(ValueError):
        validate_event({"op": "take_boundary_state_offloads", "answer": {"offloads": [[1, 2]]}})


def _junction_lookup(config: CacheConfig) -> dict:
    backend = ImplBackend(config, P32, check=True)
    shared = [7] * 8
    backend.run(AddRequest("a", shared + [50] * 8))
    backend.run(Lookup("a"))
    backend.run(Allocate("a", 12))
    backend.run(Step())
    backend.run(AddRequest("b", shared + [60] * 8))
    return backend.run(Lookup("b")), backend.requests["b"].shared_prefix_boundary


def test_lookups_answer_the_junction_where_the_config_reads_it():
    assert _junction_lookup(JUNCTION) == ({"hit_tokens": 0, "block_ids": [[], []],
                                           "shared_prefix_boundary": 8}, 8)
    # Dense retention: the request keeps the boundary (the scheduler stores
    # it), but answers stay as traces recorded before the knob have them.
    dense = dataclasses.replace(JUNCTION, prefix_cache_retention_interval=None)
    assert _junction_lookup(dense) == ({"hit_tokens": 0, "block_ids": [[], []]}, 8)


def test_0_17_refuses_the_knobs_and_ops(tmp_path):
    with pytest.raises(ValueError, match="0.17 has no prefix_cache_retention_interval"):
        ImplBackend(JUNCTION, P17)
    with pytest.raises(ValueError, match="0.17 has no Mamba prefill checkpoint"):
        ImplBackend(dataclasses.replace(CHECKPOINTS, prefix_cache_retention_interval=None), P17)
    backend = ImplBackend(CacheConfig(num_blocks=8, groups=(GroupConfig(4, "mamba"),)), P17)
    backend.run(AddRequest("a", [1, 2, 3]))
    for event in (TakeBoundaryStateOffloads(), FinalizePartialTailOffloads("a")):
        with pytest.raises(BackendError, match="0.17 hands no boundary states"):
            backend.run(event)
    assert not template_supported("retention", P17)
    assert not template_supported("mamba_checkpoints", P17)
    assert template_supported("mamba_speculative", P17)
    # A 0.17 trace stating retention is bad input: one line, exit 2.
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"format":"kvconform-trace/1","vllm_version":"0.17.1","source":"hand",'
                     '"cache":{"num_blocks":8,"groups":[{"block_size":4,"kind":"sliding_window",'
                     '"sliding_window":4}],"prefix_cache_retention_interval":0}}\n'
                     '{"op":"step"}\n')
    o = check_trace(str(trace), ["impl"])
    assert o.exit_code == 2 and "prefix_cache_retention_interval" in str(o.error)


@pytest.mark.vllm017
def test_vllm_0_17_refuses_the_knobs():
    from harness.backends.vllm_backend import VllmBackend

    with pytest.raises(BackendError, match="no prefix-cache retention"):
        VllmBackend(JUNCTION, P17)
    with pytest.raises(BackendError, match="no Mamba prefill checkpoint"):
        VllmBackend(dataclasses.replace(CHECKPOINTS, prefix_cache_retention_interval=None), P17)


@pytest.mark.vllm017
def test_0_17_releases_mamba_blocks_late_as_vllm_0_17_does():
    """The profile field is what makes 0.17's speculative Mamba cases agree:
    with it turned off, a seeded case diverges from vLLM 0.17.1 (negative
    control of mamba_release_lags_speculative_blocks)."""
    from harness.fuzz.campaign import case_rng, run_case
    from harness.fuzz.generate import FuzzConfig, draw_case

    fc = FuzzConfig(kinds=("mamba_speculative",))
    early = dataclasses.replace(P17, mamba_release_lags_speculative_blocks=False)
    diverged = 0
    for i in range(30):
        config, actions = draw_case(case_rng(11, i), fc, 40)
        assert not run_case(config, actions, P17).failed, f"case {i}"
        diverged += run_case(config, actions, early).failed
    assert diverged > 0
