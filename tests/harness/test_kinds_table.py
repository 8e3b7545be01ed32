"""The kinds table (harness/core/kinds.py) holds together: every row's impl
spec builds and gets a manager, its vLLM spec builds on the installed vLLM
(0.32.0) and vLLM keeps it with the row's manager, the capture names vLLM's
group back as the trace's, the peer conversion gives impl's spec, the schema's
kind enum is the table's and every row is drawn by the fuzzer. Each check
has a negative control: a broken row it must catch."""

import copy
import dataclasses
import json
import random

import pytest

from harness.backends.base import BackendError
from harness.core import kinds
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.configs import draw_groups, templates
from harness.trace import schema
from impl.kv_cache_spec import FullAttentionSpec
from impl.managers import manager_class_for
from impl.profiles import PROFILES, get_profile

P32 = get_profile("0.32")


def group_of(row: kinds.KindRow, bs: int = 4, seed: int = 0) -> GroupConfig:
    """A group of `row`'s kind, its fields drawn as the fuzzer draws them."""
    rng = random.Random(seed)
    return GroupConfig.make(bs, row.name, **{f: d(rng, bs) for f, d in
                                             zip(row.fields, row.draws, strict=True)})


def config_of(g: GroupConfig) -> CacheConfig:
    return CacheConfig(num_blocks=16, groups=(g,))


ROWS = [pytest.param(r, id=r.name) for r in kinds.BUILTIN]
# A row whose impl spec has no field for the kind's field.
BROKEN_FIELD = dataclasses.replace(kinds.kind_row("rswa"), name="broken_rswa",
                                   impl_spec=FullAttentionSpec)
# A row naming a vLLM class that does not exist.
BROKEN_VLLM = dataclasses.replace(kinds.kind_row("full_attention"), name="broken_vllm",
                                  vllm_spec="NoSuchAttentionSpec")


@pytest.fixture
def registered():
    """Register rows for one test; dropped again after it."""
    added = []

    def add(row):
        kinds.register(row)
        added.append(row.name)
    yield add
    for name in added:
        kinds.unregister(name)


def test_rows_are_unique_and_complete():
    assert len(set(kinds.names())) == len(kinds.names())
    for row in kinds.BUILTIN:
        assert row.since is None or hasattr(P32, row.since), row.name
        assert len(row.draws) == len(row.fields), row.name


def first_profile_with(flag: str | None) -> str:
    """The first profile (in release order) whose `flag` is set."""
    return next(name for name, p in PROFILES.items() if flag is None or getattr(p, flag))


@pytest.mark.parametrize("row", ROWS)
def test_release_is_where_the_profile_flag_turns_on(row):
    assert first_profile_with(row.since) == row.release


def test_release_check_catches_a_wrong_release():
    wrong = dataclasses.replace(kinds.kind_row("rswa"), release="0.25")
    assert first_profile_with(wrong.since) != wrong.release


@pytest.mark.parametrize("row", ROWS)
def test_impl_spec_builds_and_has_a_manager(row):
    g = group_of(row)
    spec = config_of(g).kv_cache_spec(g)
    assert type(spec) is row.impl_spec
    for f in row.fields:
        assert getattr(spec, f) == g.value(f)
    assert manager_class_for(spec) is not None


def test_a_spec_without_the_kinds_field_is_refused(registered):
    registered(BROKEN_FIELD)
    g = GroupConfig(4, "broken_rswa", rswa_window=2)
    with pytest.raises(kinds.SpecFieldMissing, match="FullAttentionSpec has no field rswa_window"):
        config_of(g).kv_cache_spec(g)


@pytest.mark.vllm
@pytest.mark.parametrize("row", ROWS)
def test_vllm_spec_builds_and_vllm_keeps_it_with_the_rows_manager(row):
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from harness.backends.vllm_api import api_for
    from harness.backends.vllm_backend import _vllm_spec

    assert getattr(P32, row.since or "name")  # 0.32 has every built-in kind
    g = group_of(row)
    spec = _vllm_spec(config_of(g), g, api_for("0.32.0"))
    assert type(spec) is kinds.vllm_class(row)
    for f in row.fields:
        assert getattr(spec, f) == g.value(f)
    assert KVCacheSpecRegistry.get_manager_class(spec).__name__ == row.vllm_manager


@pytest.mark.vllm
def test_a_vllm_class_the_release_lacks_is_refused(registered):
    from harness.backends.vllm_api import api_for
    from harness.backends.vllm_backend import _vllm_spec

    registered(BROKEN_VLLM)
    g = GroupConfig(4, "broken_vllm")
    assert kinds.vllm_class(BROKEN_VLLM) is None
    with pytest.raises(BackendError, match="has no NoSuchAttentionSpec"):
        _vllm_spec(config_of(g), g, api_for("0.32.0"))


def _vllm_group(g: GroupConfig):
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from harness.backends.vllm_api import api_for
    from harness.backends.vllm_backend import _vllm_spec

    return KVCacheGroupSpec(["layer.0"], _vllm_spec(config_of(g), g, api_for("0.32.0")))


@pytest.mark.vllm
@pytest.mark.parametrize("row", ROWS)
def test_capture_names_vllms_group_back(row):
    from harness.capture.header import group_config_of

    g = group_of(row)
    captured = group_config_of(_vllm_group(g))
    # (A Mamba group's capture states the cache mode the config resolved.)
    assert captured.kind == g.kind and captured.params == g.params
    assert config_of(captured).kv_cache_spec(captured) == config_of(g).kv_cache_spec(g)


@pytest.mark.vllm
def test_capture_refuses_a_spec_without_a_row():
    from vllm.v1.kv_cache_interface import FullAttentionSpec as VllmFull
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from harness.capture.errors import CaptureGap
    from harness.capture.header import group_config_of

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class UnknownSpec(VllmFull):
        pass

    spec = UnknownSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=_float32())
    with pytest.raises(CaptureGap, match="KV cache group of UnknownSpec"):
        group_config_of(KVCacheGroupSpec(["layer.0"], spec))


def _float32():
    import torch

    return torch.float32


@pytest.mark.vllm
@pytest.mark.parametrize("row", ROWS)
def test_peer_conversion_gives_impls_spec(row):
    from harness.peer.convert import to_impl_spec

    g = group_of(row)
    assert to_impl_spec(_vllm_group(g).kv_cache_spec) == config_of(g).kv_cache_spec(g)


@pytest.mark.vllm
def test_peer_conversion_catches_a_field_copied_wrong(monkeypatch):
    from harness.peer import convert

    g = GroupConfig(4, "sliding_window", sliding_window=3)
    vllm_spec = _vllm_group(g).kv_cache_spec
    real = convert._same_fields

    def drops_the_window(cls, spec, common):
        return dataclasses.replace(real(cls, spec, common), sliding_window=1)

    monkeypatch.setattr(convert, "_same_fields", drops_the_window)
    assert convert.to_impl_spec(vllm_spec) != config_of(g).kv_cache_spec(g)


def _file_schema() -> dict:
    return json.loads(schema.SCHEMA_PATH.read_text())


def test_schema_file_states_the_table():
    """specs/trace.schema.json is what write_schema writes from the table (its
    kind enum the table's names): rewrite it after adding a row."""
    on_disk = _file_schema()
    assert schema.group_schema(on_disk)["properties"]["kind"]["enum"] == list(kinds.names())
    assert schema.derived(copy.deepcopy(on_disk)) == on_disk


def test_schema_check_catches_a_kind_missing_from_the_file():
    stale = _file_schema()
    schema.group_schema(stale)["properties"]["kind"]["enum"].remove("rswa")
    clauses = schema.group_schema(stale)["allOf"]
    clauses[:] = [c for c in clauses if c.get("then") != {"required": ["rswa_window"]}]
    assert schema.derived(copy.deepcopy(stale)) != stale


def test_loaded_schema_follows_the_table(registered):
    group = {"block_size": 4, "kind": "broken_vllm"}
    header = {"format": schema.FORMAT, "vllm_version": "0.32.0", "source": "hand",
              "cache": {"num_blocks": 8, "groups": [group]}}
    with pytest.raises(schema.SchemaViolation, match="kind"):
        schema.validate_header(header)
    registered(BROKEN_VLLM)
    schema.validate_header(header)


def test_every_row_is_drawn_by_the_fuzzer():
    drawn = set()
    for template in templates():
        for seed in range(40):
            groups, _ = draw_groups(template, random.Random(seed), 4, seed % 2 == 0)
            drawn |= {g.kind for g in groups}
    assert drawn == set(kinds.names())
    alone = {r.name for r in kinds.BUILTIN if r.fuzz is not None}
    assert alone <= set(templates())
