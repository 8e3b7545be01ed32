"""vLLM's KV cache sizing (kv_cache_utils' grouping and sizing functions, the
specs' page_size_bytes / max_memory_usage_bytes) over impl.kv_cache_sizing.

vLLM's functions take a whole VllmConfig; the adapter reads the few fields
impl's functions take (max_model_len, DCP size, the KV layout, the block
override, ...) and converts specs and groups both ways. Where vLLM's function
has no impl counterpart (multi-worker configs, the memory check, max model
length estimation, tensor-parallel replicas), the adapter says so
(MissingImplAPI) rather than composing an answer.

The spec classes are rebound too: `spec.page_size_bytes` and
`spec.max_memory_usage_bytes(...)` of a spec a test builds are impl's.
"""

from __future__ import annotations

import dataclasses

from harness.peer import convert
from harness.peer import features as F
from harness.peer.lacks import MissingImplAPI, require
from impl import eagle as ieagle
from impl import kv_cache_sizing as isizing

REBOUND = (
    "get_kv_cache_groups",
    "get_kv_cache_config_from_groups",
    "is_kv_cache_spec_uniform",
    "unify_kv_cache_spec_page_size",
    "get_max_concurrency_for_kv_cache_config",
    "get_kv_cache_capacity",
    "estimate_max_model_len",
    "check_enough_kv_cache_memory",
    "generate_scheduler_kv_cache_config",
    "kv_cache_groups_tp_replicas",
    "unify_hybrid_kv_cache_specs",
    "get_kv_cache_configs",
    "resolve_kv_cache_block_sizes",
    "resolve_dcp_kv_block_size",
)
# kv_cache_interface's module functions rebound too.
INTERFACE_REBOUND = ("get_kv_cache_spec_kind", "get_kv_cache_spec_sliding_window")

# vLLM spec classes rebound to subclasses whose sizing answers are impl's.
SPEC_CLASSES = (
    "FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec", "SlidingWindowSpec",
    "ChunkedLocalAttentionSpec", "CrossAttentionSpec", "MambaSpec",
)

# -- reading a VllmConfig --------------------------------------------------------------


def _field(obj, *path):
    """A nested config field, None where a test's stand-in config has none."""
    for name in path:
        obj = getattr(obj, name, None)
    return obj


def _max_model_len(vllm_config) -> int:
    return vllm_config.model_config.max_model_len


def _dcp(vllm_config) -> int:
    return _field(vllm_config, "parallel_config", "decode_context_parallel_size") or 1


def _max_in_flight(vllm_config) -> int | None:
    return _field(vllm_config, "max_in_flight_tokens")


def _encoder_tokens(vllm_config) -> int:
    return _field(vllm_config, "scheduler_config", "max_num_encoder_input_tokens") or 0


def _layout(vllm_config) -> str:
    cache = _field(vllm_config, "cache_config")
    if cache is None:
        return "LBNHC"  # a stand-in config without a cache config: vLLM's default
    layout = cache.get_resolved_kv_cache_layout()
    if not hasattr(layout, "name") and hasattr(layout, "is_block_outermost"):
        # A test's stand-in layout says only whether blocks are outermost,
        # all that grouping reads of it: a layout name of that kind.
        return "BLHNC" if layout.is_block_outermost else "LBNHC"
    return getattr(layout, "name", str(layout))


def _check_config(vllm_config) -> None:
    if _field(vllm_config, "scheduler_config", "disable_hybrid_kv_cache_manager"):
        raise MissingImplAPI("impl.kv_cache_sizing", "unify_hybrid_kv_cache_specs")
    hisparse = getattr(getattr(vllm_config, "attention_config", None), "hisparse_config", None)
    require(not hisparse, F.HISPARSE, "attention_config.hisparse_config")


# -- specs and groups back to vLLM's types -------------------------------------------------


# The spec fields impl's grouping and sizing decide (unified block sizes,
# padded pages, merged windows); the others are the template's as they were.
_COMPUTED_FIELDS = ("block_size", "page_size_padded", "sliding_window", "attention_chunk_size")


def to_vllm_spec(spec, template):
    """impl's spec as vLLM's, from the vLLM spec it was made of (the
    template keeps the fields impl does not model, e.g. the torch dtype)."""
    from vllm.v1 import kv_cache_interface as v

    if isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        specs = template.kv_cache_specs if isinstance(template, v.UniformTypeKVCacheSpecs) else {}
        return v.UniformTypeKVCacheSpecs(
            block_size=spec.block_size,
            kv_cache_specs={n: to_vllm_spec(s, specs.get(n, template))
                            for n, s in spec.kv_cache_specs.items()},
        )
    cls = type(template) if type(template).__name__ == type(spec).__name__ else getattr(
        v, type(spec).__name__)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {f.name: getattr(template, f.name) for f in dataclasses.fields(template)
              if f.name in names}
    for name in _COMPUTED_FIELDS:
        if name in names and hasattr(spec, name):
            values[name] = getattr(spec, name)
    return cls(**values)


def to_vllm_groups(groups, specs_by_layer):
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    out = []
    for g in groups:
        template = specs_by_layer[g.layer_names[0]]
        if isinstance(g.kv_cache_spec, isizing.UniformTypeKVCacheSpecs):
            from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

            template = UniformTypeKVCacheSpecs(
                block_size=g.kv_cache_spec.block_size,
                kv_cache_specs={n: specs_by_layer[n] for n in g.layer_names})
        out.append(KVCacheGroupSpec(list(g.layer_names), to_vllm_spec(g.kv_cache_spec, template),
                                    is_eagle_group=g.is_eagle_group))
    return out


# -- the functions ---------------------------------------------------------------------


def get_kv_cache_groups(vllm_config, kv_cache_spec):
    _check_config(vllm_config)
    groups = isizing.get_kv_cache_groups(convert.to_impl_specs(kv_cache_spec),
                                         convert.PROFILE.unify_pads_pages, _layout(vllm_config))
    spec_config = _field(vllm_config, "speculative_config")
    if spec_config is not None and spec_config.use_eagle_block_drop():
        # vLLM's grouping also flags the drafter's groups; impl does that in
        # a function of its own, given the speculative method's facts.
        model_type = _field(vllm_config, "model_config", "hf_config", "model_type")
        trailing = spec_config.use_eagle() and ieagle.uses_trailing_draft_layers(
            spec_config.method, model_type)
        groups = ieagle.annotate_draft_groups(groups, list(kv_cache_spec), trailing)
    return to_vllm_groups(groups, kv_cache_spec)


def get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

    plan = isizing.get_kv_cache_config_from_groups(
        [convert.to_impl_group(g) for g in kv_cache_groups], available_memory,
        convert.PROFILE.kv_cache_tensor_plan, _layout(vllm_config),
        vllm_config.cache_config.num_gpu_blocks_override,
    )
    return KVCacheConfig(
        num_blocks=plan.num_blocks,
        kv_cache_tensors=[KVCacheTensor(size=t.size, layers=list(t.layers),
                                        layer_stride=t.layer_stride,
                                        block_stride=t.block_stride, offset=t.offset)
                          for t in plan.kv_cache_tensors],
        kv_cache_groups=list(kv_cache_groups),
    )


def is_kv_cache_spec_uniform(kv_cache_spec) -> bool:
    # impl says "not uniform" by refusing to merge the specs into one.
    try:
        isizing.merge_specs(list(convert.to_impl_specs(kv_cache_spec).values()))
    except isizing.MergeError:
        return False
    return True


def unify_kv_cache_spec_page_size(kv_cache_spec):
    unified = isizing.unify_kv_cache_spec_page_size(convert.to_impl_specs(kv_cache_spec),
                                                    convert.PROFILE.unify_pads_pages)
    return {n: to_vllm_spec(s, kv_cache_spec[n]) for n, s in unified.items()}


def _groups_of(kv_cache_config):
    return [convert.to_impl_group(g) for g in kv_cache_config.kv_cache_groups]


def get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config) -> float:
    return isizing.get_max_concurrency(
        _groups_of(kv_cache_config), kv_cache_config.num_blocks, _max_model_len(vllm_config),
        dcp_world_size=_dcp(vllm_config), max_in_flight_tokens=_max_in_flight(vllm_config),
        max_num_encoder_input_tokens=_encoder_tokens(vllm_config),
    )


def get_kv_cache_capacity(vllm_config, kv_cache_config):
    return isizing.get_kv_cache_capacity(
        _groups_of(kv_cache_config), kv_cache_config.num_blocks, _max_model_len(vllm_config),
        dcp_world_size=_dcp(vllm_config), max_in_flight_tokens=_max_in_flight(vllm_config),
        max_num_encoder_input_tokens=_encoder_tokens(vllm_config),
    )


def resolve_kv_cache_block_sizes(kv_cache_config, vllm_config):
    cache = vllm_config.cache_config
    specs = [convert.to_impl_spec(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups]
    return isizing.resolve_kv_cache_block_sizes(
        specs, cache.enable_prefix_caching, _dcp(vllm_config),
        getattr(cache, "prefix_match_unit", None),
        kv_connector=vllm_config.kv_transfer_config is not None,
        rule=convert.PROFILE.block_sizes_rule,
        pcp_world_size=vllm_config.parallel_config.prefill_context_parallel_size,
    )


def resolve_dcp_kv_block_size(spec, dcp_world_size: int) -> int:
    return isizing.resolve_dcp_block_size(convert.to_impl_spec(spec), dcp_world_size)


def get_kv_cache_spec_kind(kv_cache_spec):
    from vllm.v1.kv_cache_interface import KVCacheSpecKind

    spec = convert.to_impl_spec(kv_cache_spec)
    if isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        raise MissingImplAPI("UniformTypeKVCacheSpecs", "kind")
    return KVCacheSpecKind(spec.kind)


def get_kv_cache_spec_sliding_window(kv_cache_spec):
    spec = convert.to_impl_spec(kv_cache_spec)
    if isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        raise MissingImplAPI("UniformTypeKVCacheSpecs", "sliding_window_of_events")
    return spec.sliding_window_of_events


def _missing(name: str):
    def missing(*args, **kwargs):
        raise MissingImplAPI("impl.kv_cache_sizing", name)

    missing.__name__ = name
    return missing


estimate_max_model_len = _missing("estimate_max_model_len")
check_enough_kv_cache_memory = _missing("check_enough_kv_cache_memory")
generate_scheduler_kv_cache_config = _missing("generate_scheduler_kv_cache_config")
kv_cache_groups_tp_replicas = _missing("kv_cache_groups_tp_replicas")
unify_hybrid_kv_cache_specs = _missing("unify_hybrid_kv_cache_specs")
get_kv_cache_configs = _missing("get_kv_cache_configs")


# -- spec classes --------------------------------------------------------------------------


def _spec_subclass(vllm_cls):
    def page_size_bytes(self) -> int:
        return isizing.page_size_bytes(convert.to_impl_spec(self))

    def merge(cls, specs):
        # impl's MergeError (a ValueError) goes to the test as it is.
        merged = isizing.merge_specs([convert.to_impl_spec(s) for s in specs])
        return to_vllm_spec(merged, specs[0])

    def max_memory_usage_bytes(self, vllm_config) -> int:
        return isizing.max_memory_usage_bytes(
            convert.to_impl_spec(self), _max_model_len(vllm_config), _dcp(vllm_config),
            _max_in_flight(vllm_config), _encoder_tokens(vllm_config))

    return type(vllm_cls.__name__, (vllm_cls,), {
        "__doc__": f"vLLM's {vllm_cls.__name__}, its sizing answered by impl.",
        "__module__": __name__,
        "page_size_bytes": property(page_size_bytes),
        "max_memory_usage_bytes": max_memory_usage_bytes,
        "merge": classmethod(merge),
        "__kvconform_spec__": True,
    })


def spec_classes() -> list[tuple[type, type]]:
    from vllm.v1 import kv_cache_interface as v

    return [(getattr(v, name), _spec_subclass(getattr(v, name))) for name in SPEC_CLASSES]
