"""Issue 20's proof that an attention kind is one row of harness/core/kinds.py.

(a) A new row, an existing kind's manager under a new name and field (a
full-attention spec subclass carrying `tag_tokens`, on both sides, which the
managers' registries keep with FullAttentionManager through the class
hierarchy), added with nothing else: the schema accepts it, both backends
build it, the capture names it, the peer adapters convert it, the fuzzer
draws it.

(b) A kind as a platform plugin registers one with vLLM (a FullAttentionSpec
subclass with its own manager in vLLM's KVCacheSpecRegistry, the way
`Platform.register_custom_kv_cache_specs` does) and with impl (its own spec
and manager by impl.managers.register_manager): a row and the registrations,
all in this file (no repo file outside tests changes), then fuzzed live
against vLLM for KVCONFORM_PLUGIN_FUZZ_SECONDS seconds (default 5; the issue's
check is 60) with no divergence.
"""

from __future__ import annotations

import os
import random
from dataclasses import KW_ONLY, dataclass
from functools import cache

import pytest

from harness.core import kinds
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.generate import FuzzConfig, draw_case
from harness.trace import schema
from harness.trace.codec import cache_from_dict, cache_to_dict
from impl import kv_cache_spec as ispec
from impl.managers import manager_class_for
from impl.managers.full_attention import FullAttentionManager
from impl.managers.registry import register_manager
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P32 = get_profile("0.32")
FUZZ_SECONDS = float(os.environ.get("KVCONFORM_PLUGIN_FUZZ_SECONDS", "5"))


# -- impl's side of both kinds ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TaggedAttentionSpec(ispec.FullAttentionSpec):
    """(a): full attention with a field of its own (a label no manager reads)."""

    kind = "full_attention"  # as vLLM's KV events name every FullAttentionSpec
    _: KW_ONLY
    tag_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PluginAttentionSpec(ispec.FullAttentionSpec):
    """(b): a platform's full-attention kind, kept by a manager of its own.
    Without naming the event kind impl would call it "plugin_attention" (after
    the class): the live fuzz below finds that at the first checkpoint."""

    kind = "full_attention"


class PluginAttentionManager(FullAttentionManager):
    """(b)'s manager: full attention's rules; counts the managers built, so
    the test sees it is the one that ran."""

    built = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        type(self).built += 1


# -- vLLM's side: defined (and registered) once vLLM is imported ------------------------

@cache
def vllm_plugin() -> dict:
    """vLLM's spec classes of both kinds and (b)'s manager, registered as a
    platform plugin registers them; set as this module's attributes, where
    the rows name them."""
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.core.single_type_kv_cache_manager import (
        FullAttentionManager as VllmFullAttentionManager,
    )
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    @dataclass(frozen=True, kw_only=True)
    class VllmTaggedAttentionSpec(kvi.FullAttentionSpec):
        tag_tokens: int = 0

    @dataclass(frozen=True, kw_only=True)
    class VllmPluginAttentionSpec(kvi.FullAttentionSpec):
        pass

    class PluginAttentionManager(VllmFullAttentionManager):
        built = 0

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            type(self).built += 1

    # A lookup first: vLLM registers its own kinds on the first one (a
    # registry already holding a row would skip them).
    KVCacheSpecRegistry.get_manager_class(kvi.FullAttentionSpec(
        block_size=1, num_kv_heads=1, head_size=1, dtype=kvi.torch.float32))
    KVCacheSpecRegistry.register(VllmPluginAttentionSpec, PluginAttentionManager,
                                 uniform_type_base_spec=VllmPluginAttentionSpec)
    out = {"VllmTaggedAttentionSpec": VllmTaggedAttentionSpec,
           "VllmPluginAttentionSpec": VllmPluginAttentionSpec,
           "manager": PluginAttentionManager}
    globals().update((k, v) for k, v in out.items() if k != "manager")
    return out


def _tag(rng: random.Random, bs: int) -> int:
    return rng.choice((1, bs, 2 * bs + 1))


TAGGED = kinds.KindRow("tagged_attention", TaggedAttentionSpec,
                       f"{__name__}:VllmTaggedAttentionSpec", "FullAttentionManager",
                       ("tag_tokens",), (_tag,), prefix_scan=True)
PLUGIN = kinds.KindRow("plugin_attention", PluginAttentionSpec,
                       f"{__name__}:VllmPluginAttentionSpec", "PluginAttentionManager",
                       prefix_scan=True)


@pytest.fixture
def tagged():
    vllm_plugin()
    kinds.register(TAGGED)
    yield TAGGED
    kinds.unregister(TAGGED.name)


@pytest.fixture
def plugin():
    """(b): the registrations a plugin makes, then its row."""
    vllm_plugin()
    register_manager(PluginAttentionSpec, PluginAttentionManager)
    kinds.register(PLUGIN)
    yield PLUGIN
    kinds.unregister(PLUGIN.name)


def _header(group: dict) -> dict:
    return {"format": schema.FORMAT, "vllm_version": "0.32.0", "source": "hand",
            "cache": {"num_blocks": 16, "groups": [group]}}


def _backends(config: CacheConfig):
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.vllm_backend import VllmBackend

    return VllmBackend(config, P32), ImplBackend(config, P32)


def _managers(backend) -> list:
    return list(backend.manager.coordinator.single_type_managers)


def _check_row_end_to_end(row: kinds.KindRow, group: GroupConfig, manager_name: str) -> None:
    """Schema, codec, both backends, capture, peer conversion, fuzzer."""
    from harness.capture.header import group_config_of
    from harness.peer.convert import to_impl_spec

    config = CacheConfig(num_blocks=16, groups=(group,))
    as_dict = cache_to_dict(config)
    schema.validate_header(_header(as_dict["groups"][0]))
    assert cache_from_dict(as_dict) == config
    vllm, impl = _backends(config)
    (vllm_manager,), (impl_manager,) = _managers(vllm), _managers(impl)
    assert type(vllm_manager).__name__ == manager_name
    assert type(impl_manager) is manager_class_for(config.kv_cache_spec(group))
    vllm_group = vllm.manager.kv_cache_config.kv_cache_groups[0]
    assert type(vllm_group.kv_cache_spec) is kinds.vllm_class(row)
    assert group_config_of(vllm_group, vllm_manager) == group
    assert to_impl_spec(vllm_group.kv_cache_spec) == config.kv_cache_spec(group)
    fc = FuzzConfig.from_dict({"kinds": [row.name]})
    drawn, _ = draw_case(random.Random(1), fc, 20)
    assert [g.kind for g in drawn.groups] == [row.name]


def test_a_new_row_alone_is_a_new_kind_end_to_end(tagged):
    group = GroupConfig.make(4, "tagged_attention", tag_tokens=5)
    assert group.value("tag_tokens") == 5
    _check_row_end_to_end(tagged, group, "FullAttentionManager")


def test_without_its_row_the_kind_is_refused_everywhere():
    """The negative control: the same group, no row."""
    from harness.capture.errors import CaptureGap
    from harness.capture.header import group_config_of
    from harness.peer.convert import to_impl_spec

    plugin = vllm_plugin()
    with pytest.raises(schema.SchemaViolation):
        schema.validate_header(_header({"block_size": 4, "kind": "tagged_attention",
                                        "tag_tokens": 5}))
    with pytest.raises(ValueError, match="unknown attention kind 'tagged_attention'"):
        GroupConfig.make(4, "tagged_attention", tag_tokens=5)
    with pytest.raises(ValueError, match="unknown fuzz kind"):
        FuzzConfig.from_dict({"kinds": ["tagged_attention"]})
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    spec = plugin["VllmTaggedAttentionSpec"](block_size=4, num_kv_heads=1, head_size=1,
                                             dtype=_float32(), tag_tokens=5)
    with pytest.raises(CaptureGap, match="VllmTaggedAttentionSpec"):
        group_config_of(KVCacheGroupSpec(["layer.0"], spec))
    # The peer adapters read it as its nearest kind, and impl lacks its field.
    assert type(to_impl_spec(spec)) is ispec.FullAttentionSpec


def _float32():
    import torch

    return torch.float32


def test_a_plugin_kind_with_its_own_managers_end_to_end(plugin):
    _check_row_end_to_end(plugin, GroupConfig(4, "plugin_attention"), "PluginAttentionManager")


def test_a_plugin_kind_fuzzed_live_against_vllm(plugin, tmp_path):
    from harness.fuzz.campaign import fuzz
    from harness.report.text import format_failure

    vllm_manager = vllm_plugin()["manager"]
    before = (vllm_manager.built, PluginAttentionManager.built)
    fc = FuzzConfig(kinds=("plugin_attention",), block_sizes=(1, 2, 4, 16))
    result = fuzz(P32, FUZZ_SECONDS, seed=20, out_dir=str(tmp_path), fuzz_config=fc,
                  min_cases=20)
    print(f"plugin kind: {result.cases} cases, {result.ops} ops in {result.seconds:.1f} s")
    assert result.finding is None, result.finding and format_failure(result.finding.failure)
    assert result.cases >= 20 and result.refused == 0
    # Every case ran the plugin's managers, on both sides.
    assert vllm_manager.built - before[0] >= result.cases
    assert PluginAttentionManager.built - before[1] >= result.cases
