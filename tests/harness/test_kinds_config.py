"""Attention kinds in the cache config, the trace format and the fuzzer's draw."""

from __future__ import annotations

import jsonschema
import pytest

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.actions import New, Schedule, StepBoundary
from harness.fuzz.campaign import case_rng
from harness.fuzz.configs import TEMPLATES
from harness.fuzz.generate import FuzzConfig, draw_case
from harness.fuzz.shrink import shrink
from harness.trace.codec import cache_from_dict, cache_to_dict
from harness.trace.schema import SchemaViolation, load_schema, validate_event
from impl.profiles import get_profile

P32, P17 = get_profile("0.32"), get_profile("0.17")
GEMMA = CacheConfig(num_blocks=40, groups=(
    GroupConfig(16), GroupConfig(32, "sliding_window", sliding_window=100)))


def test_group_fields_are_checked():
    with pytest.raises(ValueError, match="needs sliding_window"):
        GroupConfig(4, "sliding_window")
    with pytest.raises(ValueError, match="does not apply"):
        GroupConfig(4, sliding_window=8)
    with pytest.raises(ValueError, match="unknown attention kind"):
        GroupConfig(4, "linear")


def test_block_sizes_follow_the_profile():
    # 0.32: LCM for the scheduler, GCD for hashes; 0.17: the cache block size.
    assert GEMMA.block_sizes(P32) == (32, 16) == (GEMMA.scheduler_block_size,
                                                   GEMMA.hash_block_size)
    assert GEMMA.block_sizes(P17) == (32, 16)
    cp = CacheConfig(num_blocks=8, groups=(GroupConfig(16),), dcp_world_size=2,
                     pcp_world_size=2)
    assert cp.block_sizes(P32) == (32, 32) and cp.block_sizes(P17) == (64, 64)


def test_fine_grained_hits_need_mamba_align_and_a_finer_hash():
    mamba = CacheConfig(num_blocks=8, groups=(GroupConfig(8), GroupConfig(8, "mamba")))
    assert not mamba.fine_grained_hits(P32)
    fine = CacheConfig(num_blocks=8, groups=mamba.groups, prefix_match_unit=4)
    assert fine.fine_grained_hits(P32) and not fine.fine_grained_hits(P17)


def test_cache_round_trips_through_the_trace_header():
    config = CacheConfig(num_blocks=40, groups=(
        GroupConfig(16), GroupConfig(16, "mamba", mamba_cache_mode="align"),
        GroupConfig(16, "chunked_local_attention", attention_chunk_size=64),
        GroupConfig(16, "sink_full_attention", sink_len=32)),
        prefix_match_unit=8, dcp_world_size=2, max_in_flight_tokens=100)
    d = cache_to_dict(config)
    assert d["groups"][0] == {"block_size": 16}
    assert d["groups"][2] == {"block_size": 16, "kind": "chunked_local_attention",
                              "attention_chunk_size": 64}
    assert cache_from_dict(d) == config
    header = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
              "cache": d}
    jsonschema.validate(header, {"$ref": "#/definitions/header", **load_schema()})


@pytest.mark.parametrize("group", [
    {"block_size": 4, "kind": "sliding_window"},
    {"block_size": 4, "sliding_window": 8},
    {"block_size": 4, "kind": "mamba", "mamba_cache_mode": "all"},
    {"block_size": 4, "mamba_cache_mode": "none"},
    {"block_size": 4, "kind": "linear"},
])
def test_schema_refuses_inconsistent_groups(group):
    header = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
              "cache": {"num_blocks": 4, "groups": [group]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(header, {"$ref": "#/definitions/header", **load_schema()})


def test_take_block_copies_op():
    validate_event({"op": "take_block_copies", "answer": {"copies": [[3, 6]]}})
    with pytest.raises(SchemaViolation):
        validate_event({"op": "take_block_copies", "answer": {"copies": [[3]]}})


def test_fuzz_kinds_are_checked_and_drawn():
    assert FuzzConfig.from_dict({"kinds": "mamba"}).kinds == ("mamba",)
    with pytest.raises(ValueError, match="unknown fuzz kind"):
        FuzzConfig.from_dict({"kinds": ["gated_delta"]})
    for kind in TEMPLATES:
        fc = FuzzConfig(kinds=(kind,))
        cases = [draw_case(case_rng(3, i), fc, 40) for i in range(30)]
        assert cases[0] == draw_case(case_rng(3, 0), fc, 40)
        kinds = {g.kind for c, _ in cases for g in c.groups}
        if kind.startswith("hybrid"):
            assert all(len(c.groups) > 1 for c, _ in cases)
        if kind == "cross_attention":
            assert "cross_attention" in kinds
            assert all(not c.enable_caching for c, _ in cases)
            assert any(a.encoder_tokens for _, acts in cases for a in acts if isinstance(a, New))
        if kind in ("cross_attention", "mamba", "hybrid_mamba"):
            # No connector (external) tokens for encoder-decoder or Mamba models.
            assert not any(a.external for _, acts in cases for a in acts
                           if isinstance(a, Schedule))


def test_shrinking_keeps_multi_group_configs_valid():
    config = CacheConfig(num_blocks=64, groups=(
        GroupConfig(8), GroupConfig(16, "sliding_window", sliding_window=5),
        GroupConfig(8, "sink_full_attention", sink_len=16)))
    actions = [New(0, tuple(range(9))), Schedule(0, 4096), StepBoundary()]

    def fails(c, a):  # "fails" while a window group is there
        return any(g.kind == "sliding_window" for g in c.groups)

    small, _ = shrink(config, actions, fails)
    assert [g.kind for g in small.groups] == ["sliding_window"]
    assert small.groups[0].block_size == 1 and small.num_blocks == 2
