"""The circular_buffer, rswa and sliding_window_mla groups and MLA cache roles
in the cache config, the trace format and the profiles: stated, round-tripped,
refused cleanly (one line, exit 2) for a release that lacks them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from harness.cli.main import main
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.configs import TEMPLATE_NEEDS, TEMPLATES, templates_for
from harness.trace.codec import cache_from_dict, cache_to_dict
from harness.trace.schema import load_schema
from impl.kv_cache_spec import (
    CircularBufferSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
)
from impl.profiles import get_profile

P32, P17 = get_profile("0.32"), get_profile("0.17")
V4 = CacheConfig(num_blocks=40, groups=(
    GroupConfig(4, "mla_attention"), GroupConfig(4, "mla_attention", cache_role="indexer"),
    GroupConfig(8, "sliding_window_mla", sliding_window=20), GroupConfig(4, "circular_buffer"),
    GroupConfig(4, "rswa", rswa_window=16)))


def _header(groups, version="0.32.0"):
    return {"format": "kvconform-trace/1", "vllm_version": version, "source": "hand",
            "cache": {"num_blocks": 8, "groups": groups}}


def test_groups_state_their_kind_fields():
    with pytest.raises(ValueError, match="needs rswa_window"):
        GroupConfig(4, "rswa")
    with pytest.raises(ValueError, match="needs sliding_window"):
        GroupConfig(4, "sliding_window_mla")
    with pytest.raises(ValueError, match="cache_role does not apply"):
        GroupConfig(4, cache_role="indexer")
    with pytest.raises(ValueError, match="not sparse or indexer"):
        GroupConfig(4, "mla_attention", cache_role="keys")
    with pytest.raises(ValueError, match="rswa_window does not apply"):
        GroupConfig(4, "circular_buffer", rswa_window=3)


def test_groups_become_impl_specs():
    specs = V4.kv_cache_specs()
    assert [type(s) for s in specs] == [MLAAttentionSpec, MLAAttentionSpec,
                                        SlidingWindowMLASpec, CircularBufferSpec, RSWASpec]
    assert specs[1].cache_role == "indexer" and specs[2].sliding_window == 20
    assert specs[4].rswa_window == 16
    # The ring is no cacheable group: hashes every 4 tokens (the GCD of 4, 8, 4).
    assert V4.block_sizes(P32) == (8, 4)


def test_header_round_trip_and_schema():
    d = cache_to_dict(V4)
    assert d["groups"][1] == {"block_size": 4, "kind": "mla_attention", "cache_role": "indexer"}
    assert d["groups"][3] == {"block_size": 4, "kind": "circular_buffer"}
    assert cache_from_dict(d) == V4
    jsonschema.validate({**_header(d["groups"])}, {"$ref": "#/definitions/header",
                                                   **load_schema()})


@pytest.mark.parametrize("group", [
    {"block_size": 4, "kind": "rswa"},
    {"block_size": 4, "rswa_window": 8},
    {"block_size": 4, "kind": "sliding_window_mla"},
    {"block_size": 4, "cache_role": "indexer"},
    {"block_size": 4, "kind": "mla_attention", "cache_role": "keys"},
    {"block_size": 4, "kind": "circular_buffer", "sliding_window": 8},
])
def test_schema_refuses_inconsistent_groups(group):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_header([group]), {"$ref": "#/definitions/header", **load_schema()})


@pytest.mark.parametrize("group,why", [
    ({"block_size": 4, "kind": "rswa", "rswa_window": 8}, "no rswa groups"),
    ({"block_size": 4, "kind": "circular_buffer"}, "no circular_buffer groups"),
    ({"block_size": 4, "kind": "sliding_window_mla", "sliding_window": 8},
     "no sliding_window_mla groups"),
    ({"block_size": 4, "kind": "mla_attention", "cache_role": "indexer"}, "no MLA cache roles"),
])
def test_a_release_without_the_kind_refuses_the_trace_in_one_line(tmp_path, capsys, group,
                                                                   why):
    trace = tmp_path / "old.jsonl"
    trace.write_text(json.dumps(_header([{"block_size": 4}, group], "0.17.1")) + "\n")
    assert main(["replay", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{trace}:1: cache.groups[1].kind: vLLM 0.17 has {why}"
                   + ("" if "roles" not in why else " (cache_role=indexer)")]
    # The same header for 0.32 opens.
    ok = tmp_path / "new.jsonl"
    ok.write_text(json.dumps(_header([{"block_size": 4}, group])) + "\n")
    assert main(["replay", str(ok)]) == 0


def test_fuzz_templates_follow_the_profile():
    assert set(templates_for(P32)) == set(TEMPLATES)
    assert not set(templates_for(P17)) & set(TEMPLATE_NEEDS)
    assert set(TEMPLATE_NEEDS) <= set(TEMPLATES)
