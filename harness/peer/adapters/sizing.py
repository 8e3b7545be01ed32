"""vLLM's KV cache sizing (kv_cache_utils' grouping, sizing and planning
functions, the specs' page and capacity methods) over impl.kv_cache_sizing
and impl.kv_cache_planning.

vLLM's functions take a whole VllmConfig; the adapter reads the fields impl's
functions take (max_model_len, DCP and TP sizes, the KV layout, the block
override, ...) into impl's KVCachePlanningConfig, converts specs and groups
both ways, and applies vLLM's in-place conventions (max_model_len written
back after auto-fit, specs promoted in the caller's dict) to what impl
returns.

The spec classes are rebound too: `spec.page_size_bytes`,
`spec.max_memory_usage_bytes(...)`, `UniformTypeKVCacheSpecs.from_specs(...)`
and the like, of a spec a test builds, are impl's.
"""

from __future__ import annotations

import copy
import dataclasses

from harness.peer import convert, proxies
from harness.peer import features as F
from harness.peer.lacks import ImplLacks
from impl import coordinator as icoord
from impl import eagle as ieagle
from impl import kv_cache_planning as iplan
from impl import kv_cache_sizing as isizing
from impl.hisparse import layout as ilayout

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
    "resolve_cache_hit_alignment_tokens",
    "resolve_dcp_kv_block_size",
    "resolve_dcp_kv_cache_spec",
    "_project_kv_cache_groups_to_worker",
)
# kv_cache_interface's module functions rebound too.
INTERFACE_REBOUND = ("get_kv_cache_spec_kind", "get_kv_cache_spec_sliding_window",
                     "iter_layer_specs", "is_full_attention_spec")
# vllm.v1.hisparse.layout's functions rebound too.
HISPARSE_LAYOUT_REBOUND = ("get_hisparse_kv_cache_groups", "create_hisparse_layout",
                           "get_hisparse_steady_state_concurrency",
                           "get_hisparse_gpu_memory_usage")

# vLLM spec classes rebound to subclasses whose sizing answers are impl's.
SPEC_CLASSES = (
    "FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec", "SlidingWindowSpec",
    "ChunkedLocalAttentionSpec", "CrossAttentionSpec", "MambaSpec", "SlidingWindowMLASpec",
    "HiddenStateCacheSpec", "RSWASpec", "CircularBufferSpec", "UniformTypeKVCacheSpecs",
    "HiSparseResidentSpec", "HiSparseHotSpec",
)
_HISPARSE_SPECS = ("HiSparseResidentSpec", "HiSparseHotSpec")

# -- reading a VllmConfig --------------------------------------------------------------


def _field(obj, *path):
    """A nested config field, None where a test's stand-in config has none."""
    for name in path:
        obj = getattr(obj, name, None)
    return obj


def _dcp(vllm_config) -> int:
    return _field(vllm_config, "parallel_config", "decode_context_parallel_size") or 1


def _layout(vllm_config) -> str | None:
    resolve = _field(vllm_config, "cache_config", "get_resolved_kv_cache_layout")
    if resolve is None:
        return "LBNHC"  # a stand-in config without a cache config: vLLM's default
    try:
        layout = resolve()
    except ValueError:
        return None  # not resolved yet: impl refuses to plan tensors without it
    if not hasattr(layout, "name") and hasattr(layout, "is_block_outermost"):
        # A test's stand-in layout says only whether blocks are outermost,
        # all that grouping reads of it: a layout name of that kind.
        return "BLHNC" if layout.is_block_outermost else "LBNHC"
    return getattr(layout, "name", str(layout))


def _host_pool_bytes(vllm_config) -> int | None:
    """HiSparse's host budget as vLLM reads it; a test may monkeypatch
    vLLM's reader on the kv_cache_utils module it sees (the proxy)."""
    patched = proxies.proxied_override("vllm.v1.core.kv_cache_utils",
                                      "get_hisparse_host_pool_bytes")
    if patched is not None:
        return patched(vllm_config)
    from vllm.config.kv_transfer import hisparse_host_pool_gib

    gib = hisparse_host_pool_gib(_field(vllm_config, "kv_transfer_config"))
    return None if gib is None else int(gib * 2**30)


def _shared_host_pool(vllm_config) -> bool:
    from vllm.v1.hisparse import runtime

    parallel = _field(vllm_config, "parallel_config")
    tp = getattr(parallel, "tensor_parallel_size", 1)
    if tp <= 1:
        return False  # no peer rank to share with (the rest is not read)
    return ilayout.uses_shared_host_pool(
        cuda_alike=runtime.current_platform.is_cuda_alike(), tensor_parallel_size=tp,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        prefill_context_parallel_size=parallel.prefill_context_parallel_size,
        decode_context_parallel_size=parallel.decode_context_parallel_size,
        world_size=parallel.world_size,
        distributed_executor_backend=parallel.distributed_executor_backend,
        nnodes_within_dp=parallel.nnodes_within_dp)


def _hisparse(vllm_config) -> ilayout.HiSparsePlanning | None:
    config = _field(vllm_config, "attention_config", "hisparse_config")
    if config is None:
        return None
    try:
        from vllm.v1.attention.backend import max_decode_query_len
    except ImportError:
        # 0.30 reads the widest decode query in HiSparse's own runtime.
        from vllm.v1.hisparse.runtime import _get_max_decode_query_len as max_decode_query_len

    return ilayout.HiSparsePlanning(
        index_topk=vllm_config.model_config.hf_config.index_topk,
        device_buffer_size=config.device_buffer_size,
        max_decode_query_len=max_decode_query_len(vllm_config),
        host_pool_bytes=_host_pool_bytes(vllm_config),
        shared_host_pool=_shared_host_pool(vllm_config),
        layout_stage=convert.PROFILE.hisparse_layout_stage)


def planning_config(vllm_config) -> iplan.KVCachePlanningConfig:
    """The VllmConfig fields impl's planning reads."""
    cache = _field(vllm_config, "cache_config")
    return iplan.KVCachePlanningConfig(
        max_model_len=_field(vllm_config, "model_config", "max_model_len"),
        auto_fit_max_model_len=_field(vllm_config, "model_config",
                                      "original_max_model_len") == -1,
        num_gpu_blocks_override=_field(cache, "num_gpu_blocks_override"),
        kv_cache_layout=_layout(vllm_config),
        tensor_parallel_size=_field(vllm_config, "parallel_config",
                                    "tensor_parallel_size") or 1,
        decode_context_parallel_size=_dcp(vllm_config),
        max_in_flight_tokens=_field(vllm_config, "max_in_flight_tokens"),
        max_num_encoder_input_tokens=_field(vllm_config, "scheduler_config",
                                            "max_num_encoder_input_tokens") or 0,
        num_prefill_lookahead_tokens=_field(vllm_config, "num_prefill_lookahead_tokens") or 0,
        disable_hybrid_kv_cache_manager=bool(_field(
            vllm_config, "scheduler_config", "disable_hybrid_kv_cache_manager")),
        mamba_cache_mode=_field(cache, "mamba_cache_mode"),
        pad_pages=convert.PROFILE.unify_pads_pages,
        pad_ratio=convert.PROFILE.uniform_group_pad_ratio,
        tensor_plan=convert.PROFILE.kv_cache_tensor_plan,
        hisparse=_hisparse(vllm_config),
        **_draft_groups(vllm_config),
    )


def _marking_drafts(cfg, kv_cache_specs):
    """The layers the test's own specs mark as a drafter's (impl's specs do
    not carry the mark: the planning config names them)."""
    marked = frozenset(name for specs in kv_cache_specs for name, spec in specs.items()
                       if getattr(spec, "non_causal_multi_token_decode", False))
    return dataclasses.replace(cfg, draft_marked_layers=marked) if marked else cfg


def _draft_groups(vllm_config) -> dict:
    """Whether vLLM's grouping flags a drafter's groups, and how it finds
    them (the speculative method's facts, read off the config)."""
    spec_config = _field(vllm_config, "speculative_config")
    # 0.30+ ask use_eagle_block_drop (a config may keep the volatile blocks);
    # 0.29's config has no such switch: its grouping flags whenever use_eagle.
    drops_blocks = getattr(spec_config, "use_eagle_block_drop", None)
    if spec_config is None or not (drops_blocks or spec_config.use_eagle)():
        return {}
    model_type = _field(vllm_config, "model_config", "hf_config", "model_type")
    rule = convert.PROFILE.trailing_draft_layers
    trailing = spec_config.use_eagle() and ieagle.uses_trailing_draft_layers(
        spec_config.method, model_type, rule)
    return dict(flags_draft_groups=True, draft_layers_trailing=trailing, trailing_rule=rule)


def _usage_args(vllm_config) -> dict:
    cfg = planning_config(vllm_config)
    return dict(dcp_world_size=cfg.decode_context_parallel_size,
                max_in_flight_tokens=cfg.max_in_flight_tokens,
                max_num_encoder_input_tokens=cfg.max_num_encoder_input_tokens,
                mamba_cache_mode=cfg.mamba_cache_mode)


# -- specs and groups back to vLLM's types -------------------------------------------------

# Spec fields written differently on the two sides.
_ENUMS = {"kv_quant_mode": "KVQuantMode", "cache_role": "SparseCacheRole"}
# Taken from the vLLM spec the impl spec was made of (impl keeps sizes only).
_FROM_TEMPLATE = ("dtype", "dtypes", "shapes", "mamba_type", "head_size_v")


def rebound_class(name: str) -> type:
    """The rebound (impl-answering) subclass of vLLM's spec class `name`."""
    return _rebound()[name]


def to_vllm_spec(spec, template):
    """impl's spec as vLLM's, from the vLLM spec it was made of (the
    template keeps the fields impl does not model, e.g. the torch dtype);
    the template itself when impl left it as it was."""
    from vllm.v1 import kv_cache_interface as v

    if template is not None and _impl_spec(template) == spec:
        return template
    if isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        inner = template.kv_cache_specs if isinstance(
            template, v.UniformTypeKVCacheSpecs) else {}
        return rebound_class("UniformTypeKVCacheSpecs")(
            block_size=spec.block_size,
            kv_cache_specs={n: to_vllm_spec(s, inner.get(n, template))
                            for n, s in spec.kv_cache_specs.items()},
        )
    cls = rebound_class(type(spec).__name__)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {f.name: getattr(template, f.name) for f in dataclasses.fields(template)
              if f.init and f.name in names} if template is not None else {}
    for f in dataclasses.fields(spec):
        if f.name in names and f.name not in _FROM_TEMPLATE:
            value = getattr(spec, f.name)
            values[f.name] = getattr(v, _ENUMS[f.name])(value) if f.name in _ENUMS else value
    if "head_size_v" in names and spec.head_size_v is not None:
        values["head_size_v"] = spec.head_size_v
    elif "head_size_v" in names and "head_size_v" not in values:
        values["head_size_v"] = spec.head_size
    return cls(**values)


def _group_template(group, specs_by_layer):
    """The vLLM spec a group of impl's was made of."""
    if isinstance(group.kv_cache_spec, isizing.UniformTypeKVCacheSpecs):
        return rebound_class("UniformTypeKVCacheSpecs")(
            block_size=group.kv_cache_spec.block_size,
            kv_cache_specs={n: specs_by_layer[n] for n in group.kv_cache_spec.kv_cache_specs})
    if type(group.kv_cache_spec).__name__ in _HISPARSE_SPECS:
        # Derived by HiSparse's grouping: the model may not report them.
        return specs_by_layer.get(group.layer_names[0])
    if group.layer_names:
        return specs_by_layer[group.layer_names[0]]
    # A worker's share of a group may be no layer: a layer of the model whose
    # spec impl's is (the group's spec is its layers' merged spec).
    return next((s for s in specs_by_layer.values()
                 if _impl_spec(s) == group.kv_cache_spec),
                next(s for s in specs_by_layer.values()
                     if type(s).__name__ == type(group.kv_cache_spec).__name__))


def to_vllm_group(group, spec):
    """impl's group as vLLM's KVCacheGroupSpec, its spec already converted."""
    from vllm.v1 import kv_cache_interface as v

    # Only the fields the running release's group has (0.28 has no roles).
    has = {f.name for f in dataclasses.fields(v.KVCacheGroupSpec)}
    extra = {name: getattr(group, name)
             for name in ("is_eagle_group", "host_resident", "enable_kv_transfer")
             if name in has}
    if "role" in has:
        extra["role"] = (v.KVCacheGroupRole(group.role.value) if group.role is not None
                         else v.KVCacheGroupRole.DEFAULT)
    return v.KVCacheGroupSpec(list(group.layer_names), spec, **extra)


def to_vllm_groups(groups, specs_by_layer, originals=None):
    """impl's groups as vLLM's KVCacheGroupSpecs; `originals`: the vLLM
    groups impl's were made of, kept where impl kept them."""
    out = []
    for i, g in enumerate(groups):
        if originals is not None:
            template = originals[i].kv_cache_spec
        else:
            template = _group_template(g, specs_by_layer)
        out.append(to_vllm_group(g, to_vllm_spec(g.kv_cache_spec, template)))
    return out


def _to_vllm_config(plan, groups, vllm_config, first=None):
    """impl's plan as vLLM's KVCacheConfig (the fields impl does not plan
    are vLLM's own: copied from the config or from `first`)."""
    from vllm.v1.kv_cache_interface import KVCacheTensor

    out = copy.copy(first) if first is not None else config_class()[1](
        num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[],
        prefix_cache_retention_interval=_field(vllm_config, "cache_config",
                                               "prefix_cache_retention_interval"))
    out.num_blocks = plan.num_blocks
    out.kv_cache_tensors = [KVCacheTensor(size=t.size, layers=list(t.layers),
                                          layer_stride=t.layer_stride,
                                          block_stride=t.block_stride, offset=t.offset,
                                          host_resident=t.host_resident)
                            for t in plan.kv_cache_tensors]
    out.kv_cache_groups = groups
    out.kv_tp_replicas = plan.kv_tp_replicas
    out.hisparse_host_num_blocks = plan.hisparse_host_num_blocks
    out.hisparse_host_block_stride = plan.hisparse_host_block_stride
    out.hisparse_shared_host_pool = plan.hisparse_shared_host_pool
    return out


def _write_back(vllm_specs: dict, impl_specs: dict) -> None:
    """vLLM promotes specs in the caller's dict: do the same with impl's answer."""
    for name, spec in impl_specs.items():
        vllm_specs[name] = to_vllm_spec(spec, vllm_specs.get(name))


# -- the functions ---------------------------------------------------------------------


def get_kv_cache_groups(vllm_config, kv_cache_spec):
    cfg = _marking_drafts(planning_config(vllm_config), [kv_cache_spec])
    specs = _impl_specs(kv_cache_spec)
    originals = dict(kv_cache_spec)
    groups = cfg.groups(specs)
    if cfg.disable_hybrid_kv_cache_manager:
        _write_back(kv_cache_spec, specs)
    return to_vllm_groups(groups, originals)


def unify_hybrid_kv_cache_specs(kv_cache_spec):
    specs = _impl_specs(kv_cache_spec)
    isizing.unify_hybrid_kv_cache_specs(specs)
    _write_back(kv_cache_spec, specs)



def _layer_specs(groups) -> dict:
    """The vLLM spec of every layer of vLLM's groups."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    out = {}
    for g in groups:
        if isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs):
            out.update(g.kv_cache_spec.kv_cache_specs)
        else:
            out.update(dict.fromkeys(g.layer_names, g.kv_cache_spec))
    return out


def _planned_groups(impl_groups, planned, vllm_groups):
    """impl's planned groups as vLLM's: the caller's own objects where impl
    kept the group, converted where planning derived it (HiSparse)."""
    mine = {id(i): g for i, g in zip(impl_groups, vllm_groups)}
    specs = _layer_specs(vllm_groups)
    return [mine[id(g)] if id(g) in mine else to_vllm_groups([g], specs)[0]
            for g in planned]


def get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory):
    cfg = planning_config(vllm_config)
    impl_groups = [convert.to_impl_group(g) for g in kv_cache_groups]
    plan = cfg.plan(impl_groups, available_memory)
    if cfg.hisparse_derived_when_planned and kv_cache_groups:
        return _to_vllm_config(
            plan, _planned_groups(impl_groups, plan.kv_cache_groups, kv_cache_groups),
            vllm_config)
    # impl lists HiSparse's host group first, as vLLM does; the groups are the caller's.
    ordered = sorted(kv_cache_groups, key=lambda g: not g.host_resident)
    return _to_vllm_config(plan, ordered, vllm_config)


def is_kv_cache_spec_uniform(kv_cache_spec) -> bool:
    return isizing.is_kv_cache_spec_uniform(_impl_specs(kv_cache_spec))


def unify_kv_cache_spec_page_size(kv_cache_spec):
    unified = isizing.unify_kv_cache_spec_page_size(_impl_specs(kv_cache_spec),
                                                    convert.PROFILE.unify_pads_pages)
    return {n: to_vllm_spec(s, kv_cache_spec[n]) for n, s in unified.items()}


def _groups_of(kv_cache_config):
    return [convert.to_impl_group(g) for g in kv_cache_config.kv_cache_groups]


def get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config) -> float:
    return isizing.get_max_concurrency(
        _groups_of(kv_cache_config), kv_cache_config.num_blocks,
        planning_config(vllm_config).max_model_len, kv_cache_config.hisparse_host_num_blocks,
        **_usage_args(vllm_config))


def get_kv_cache_capacity(vllm_config, kv_cache_config):
    return isizing.get_kv_cache_capacity(
        _groups_of(kv_cache_config), kv_cache_config.num_blocks,
        planning_config(vllm_config).max_model_len, kv_cache_config.hisparse_host_num_blocks,
        **_usage_args(vllm_config))


# -- vllm.v1.hisparse.layout ---------------------------------------------------------------


def get_hisparse_kv_cache_groups(vllm_config, kv_cache_spec):
    cfg = planning_config(vllm_config)
    if cfg.hisparse is None:
        return None
    groups = ilayout.hisparse_kv_cache_groups(_impl_specs(kv_cache_spec),
                                              cfg.hisparse, cfg.plain_groups)
    return None if groups is None else to_vllm_groups(groups, dict(kv_cache_spec))


def create_hisparse_layout(vllm_config, groups, host_budget):
    from vllm.v1.hisparse.layout import HiSparseLayout

    cfg = planning_config(vllm_config)
    impl_groups = [convert.to_impl_group(g) for g in groups]
    pools = ilayout.hisparse_layout(impl_groups, cfg.max_model_len, cfg.hisparse,
                                    host_budget)
    # The caller's own group objects, split as impl split them (and those
    # impl derived, converted).
    source, *device = _planned_groups(impl_groups, [pools.source_group, *pools.device_groups],
                                      groups)
    return HiSparseLayout(source_group=source, device_groups=device,
                          host_num_blocks=pools.host_num_blocks,
                          host_block_stride=pools.host_block_stride,
                          shared_host_pool=pools.shared_host_pool)


def get_hisparse_gpu_memory_usage(vllm_config, kv_cache_groups) -> int:
    cfg = planning_config(vllm_config)
    return ilayout.planned_device_usage([convert.to_impl_group(g) for g in kv_cache_groups],
                                        cfg.usage)


def get_hisparse_steady_state_concurrency(vllm_config, kv_cache_config) -> float:
    if kv_cache_config.hisparse_host_num_blocks is None:
        raise AssertionError("a HiSparse config without a host pool size")
    max_model_len = planning_config(vllm_config).max_model_len
    usage = _usage_args(vllm_config)
    return ilayout.steady_state_concurrency(
        _groups_of(kv_cache_config), kv_cache_config.num_blocks,
        kv_cache_config.hisparse_host_num_blocks,
        lambda g: isizing.pages_per_request(g, max_model_len, **usage))


def resolve_kv_cache_block_sizes(kv_cache_config, vllm_config):
    cache = vllm_config.cache_config
    specs = [_impl_spec(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups]
    return isizing.resolve_kv_cache_block_sizes(
        specs, cache.enable_prefix_caching, _dcp(vllm_config),
        getattr(cache, "prefix_match_unit", None),
        kv_connector=_field(vllm_config, "kv_transfer_config") is not None,
        rule=convert.PROFILE.block_sizes_rule,
        pcp_world_size=_field(vllm_config, "parallel_config",
                              "prefill_context_parallel_size") or 1,
    )


def _impl_spec(spec):
    """convert.to_impl_spec, refusing a kind whose sizing impl does not model."""
    inner = getattr(spec, "kv_cache_specs", None)
    for one in (spec, *(inner.values() if isinstance(inner, dict) else ())):
        if type(one).__name__ in convert.SIZED_APART:
            raise ImplLacks(F.KPOOL_TAIL_SIZING, type(one).__name__)
    return convert.to_impl_spec(spec)


def _impl_specs(specs):
    return {layer: _impl_spec(s) for layer, s in specs.items()}


def resolve_cache_hit_alignment_tokens(kv_cache_config, vllm_config, scheduler_block_size,
                                       hash_block_size):
    return icoord.resolve_cache_hit_alignment_tokens(
        convert.to_impl_config(kv_cache_config), convert.PROFILE,
        vllm_config.cache_config.enable_prefix_caching, scheduler_block_size,
        hash_block_size, _dcp(vllm_config))


def resolve_dcp_kv_block_size(spec, dcp_world_size: int) -> int:
    return isizing.resolve_dcp_block_size(_impl_spec(spec), dcp_world_size)


def resolve_dcp_kv_cache_spec(spec, dcp_world_size: int):
    impl_spec = _impl_spec(spec)
    resolved = isizing.resolve_dcp_kv_cache_spec(impl_spec, dcp_world_size)
    return spec if resolved is impl_spec else to_vllm_spec(resolved, spec)


def get_kv_cache_spec_kind(kv_cache_spec):
    from vllm.v1.kv_cache_interface import KVCacheSpecKind

    return KVCacheSpecKind(_impl_spec(kv_cache_spec).kind)


def get_kv_cache_spec_sliding_window(kv_cache_spec):
    return _impl_spec(kv_cache_spec).sliding_window_of_events


def iter_layer_specs(kv_cache_spec):
    impl_spec = _impl_spec(kv_cache_spec)
    layers = isizing.iter_layer_specs(impl_spec)
    if not isinstance(impl_spec, isizing.UniformTypeKVCacheSpecs):
        return (kv_cache_spec,)
    # impl's answer, layer by layer, as the test's own vLLM spec objects.
    names = list(impl_spec.kv_cache_specs)
    assert len(names) == len(layers)
    return tuple(kv_cache_spec.kv_cache_specs[n] for n in names)


def is_full_attention_spec(kv_cache_spec) -> bool:
    return isizing.is_full_attention_spec(_impl_spec(kv_cache_spec))


def estimate_max_model_len(vllm_config, kv_cache_spec, available_memory):
    return iplan.estimate_max_model_len(_impl_specs(kv_cache_spec), available_memory,
                                        planning_config(vllm_config))


def check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory):
    iplan.check_enough_kv_cache_memory(_impl_specs(kv_cache_spec),
                                       available_memory, planning_config(vllm_config))


def kv_cache_groups_tp_replicas(groups, tp_size, dcp_size=1):
    return iplan.kv_cache_groups_tp_replicas([convert.to_impl_group(g) for g in groups],
                                             tp_size, dcp_size)


def _to_impl_plan(kv_cache_config):
    plan = isizing.KVCacheConfigPlan(kv_cache_config.num_blocks, [], _groups_of(kv_cache_config))
    # (older releases' configs have neither field: impl's defaults)
    plan.kv_tp_replicas = getattr(kv_cache_config, "kv_tp_replicas", plan.kv_tp_replicas)
    plan.hisparse_host_num_blocks = getattr(kv_cache_config, "hisparse_host_num_blocks",
                                            plan.hisparse_host_num_blocks)
    return plan


def generate_scheduler_kv_cache_config(kv_cache_configs):
    plan = iplan.generate_scheduler_kv_cache_config([_to_impl_plan(c) for c in kv_cache_configs])
    out = copy.deepcopy(kv_cache_configs[0])
    for group, impl_group in zip(out.kv_cache_groups, plan.kv_cache_groups):
        impl_spec = _impl_spec(group.kv_cache_spec)
        if isinstance(impl_spec, isizing.UniformTypeKVCacheSpecs):
            # impl chose one layer's spec: vLLM's spec of that layer.
            name = next(n for n, s in impl_spec.kv_cache_specs.items()
                        if s == impl_group.kv_cache_spec)
            group.kv_cache_spec = group.kv_cache_spec.kv_cache_specs[name]
    out.num_blocks = plan.num_blocks
    out.kv_tp_replicas = plan.kv_tp_replicas
    return out


def _project_kv_cache_groups_to_worker(global_kv_cache_groups, worker_spec):
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    impl_groups = [convert.to_impl_group(g) for g in global_kv_cache_groups]
    projected = iplan.project_kv_cache_groups_to_worker(impl_groups, worker_spec)
    out = []
    for group, impl_group, mine in zip(global_kv_cache_groups, impl_groups, projected):
        if mine is impl_group:
            out.append(group)
            continue
        spec = group.kv_cache_spec
        if mine.kv_cache_spec is not impl_group.kv_cache_spec:
            spec = rebound_class("UniformTypeKVCacheSpecs")(
                block_size=spec.block_size,
                kv_cache_specs={n: spec.kv_cache_specs[n]
                                for n in mine.kv_cache_spec.kv_cache_specs})
        out.append(KVCacheGroupSpec(list(mine.layer_names), spec))
    return out


def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory):
    cfg = _marking_drafts(planning_config(vllm_config), kv_cache_specs)
    worker_specs = [_impl_specs(specs) for specs in kv_cache_specs]
    plans, max_model_len = iplan.get_kv_cache_configs(worker_specs, available_memory, cfg)
    # vLLM writes the fitted length into the engine's config.
    vllm_config.model_config.max_model_len = max_model_len
    by_layer = {}
    for specs in kv_cache_specs:
        for name, spec in specs.items():
            by_layer.setdefault(name, spec)
    return [_to_vllm_config(p, to_vllm_groups(p.kv_cache_groups, by_layer), vllm_config)
            for p in plans]


# -- spec classes --------------------------------------------------------------------------


def _impl(spec):
    return _impl_spec(spec)


def _spec_subclass(vllm_cls):
    def page_size_bytes(self) -> int:
        return _impl(self).page_size_bytes

    def unpadded(self) -> int:
        return _impl(self).real_page_size_bytes

    def merge(cls, specs):
        # impl's MergeError (an AssertionError) or window ValueError goes to
        # the test as it is.
        merged = isizing.merge_specs([_impl(s) for s in specs])
        return to_vllm_spec(merged, specs[0])

    def max_memory_usage_bytes(self, vllm_config) -> int:
        cfg = planning_config(vllm_config)
        return isizing.max_memory_usage_bytes(_impl(self), cfg.max_model_len,
                                              **_usage_args(vllm_config))

    def max_num_blocks_per_req(self, vllm_config, max_len) -> int:
        return isizing.max_num_blocks_per_req(_impl(self), max_len, **_usage_args(vllm_config))

    def num_heads(self) -> int:
        return _impl(self).num_heads

    def state_content_size_bytes(self) -> int:
        return _impl(self).state_content_size_bytes

    def num_states(self) -> int:
        return _impl(self).num_states

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        return _impl(self).get_num_kernel_states(kernel_block_size)

    def has_layer_views(self) -> bool:
        return _impl(self).has_layer_views

    def uses_slot_mapping(self) -> bool:
        return _impl(self).uses_slot_mapping

    attrs = {
        "__doc__": f"vLLM's {vllm_cls.__name__}, its sizing answered by impl.",
        "__module__": __name__,
        "page_size_bytes": property(page_size_bytes),
        "max_memory_usage_bytes": max_memory_usage_bytes,
        "max_num_blocks_per_req": max_num_blocks_per_req,
        "merge": classmethod(merge),
        "has_layer_views": property(has_layer_views),
        "uses_slot_mapping": property(uses_slot_mapping),
        "__kvconform_spec__": True,
    }
    if vllm_cls.__name__ in _HISPARSE_SPECS:
        pass  # a page given outright: no grid to ask about
    elif vllm_cls.__name__ != "MambaSpec":
        attrs.update(real_page_size_bytes=property(unpadded),
                     unpadded_page_size_bytes=property(unpadded),
                     num_heads=property(num_heads),
                     state_content_size_bytes=property(state_content_size_bytes),
                     num_states=property(num_states),
                     get_num_kernel_states=get_num_kernel_states)
    else:
        attrs.update(real_page_size_bytes=property(unpadded))
    return type(vllm_cls.__name__, (vllm_cls,), attrs)


def _uniform_subclass(vllm_cls):
    def from_specs(cls, kv_cache_specs):
        if not isizing.is_uniform_type(_impl_specs(kv_cache_specs)):
            return None
        return cls(block_size=next(iter(kv_cache_specs.values())).block_size,
                   kv_cache_specs=kv_cache_specs)

    def is_uniform_type(cls, kv_cache_specs) -> bool:
        return isizing.is_uniform_type(_impl_specs(kv_cache_specs))

    def first_spec(self):
        first = _impl(self).first_spec
        return next(s for n, s in self.kv_cache_specs.items() if _impl(s) is first or
                    _impl(s) == first)

    def page_size_bytes(self) -> int:
        return _impl(self).page_size_bytes

    def max_memory_usage_bytes(self, vllm_config) -> int:
        cfg = planning_config(vllm_config)
        return isizing.max_memory_usage_bytes(_impl(self), cfg.max_model_len,
                                              **_usage_args(vllm_config))

    def max_num_blocks_per_req(self, vllm_config, max_len) -> int:
        return isizing.max_num_blocks_per_req(_impl(self), max_len, **_usage_args(vllm_config))

    def get_max_layers_per_page_size(self) -> int:
        return _impl(self).get_max_layers_per_page_size()

    def prefix_cacheable(self) -> bool:
        return _impl(self).prefix_cacheable

    def has_layer_views(self) -> bool:
        return _impl(self).has_layer_views

    def uses_slot_mapping(self) -> bool:
        return _impl(self).uses_slot_mapping

    return type(vllm_cls.__name__, (vllm_cls,), {
        "__doc__": "vLLM's UniformTypeKVCacheSpecs, its answers impl's.",
        "__module__": __name__,
        "from_specs": classmethod(from_specs),
        "is_uniform_type": classmethod(is_uniform_type),
        "first_spec": property(first_spec),
        "page_size_bytes": property(page_size_bytes),
        "max_memory_usage_bytes": max_memory_usage_bytes,
        "max_num_blocks_per_req": max_num_blocks_per_req,
        "get_max_layers_per_page_size": get_max_layers_per_page_size,
        "prefix_cacheable": property(prefix_cacheable),
        "has_layer_views": property(has_layer_views),
        "uses_slot_mapping": property(uses_slot_mapping),
        "__kvconform_spec__": True,
    })


_REBOUND_CLASSES: dict[str, type] = {}


def _rebound() -> dict[str, type]:
    from vllm.v1 import kv_cache_interface as v

    if not _REBOUND_CLASSES:
        for name in SPEC_CLASSES:
            vllm_cls = getattr(v, name, None)
            if vllm_cls is None:  # an older release has no such spec class
                continue
            maker = _uniform_subclass if name == "UniformTypeKVCacheSpecs" else _spec_subclass
            _REBOUND_CLASSES[name] = maker(vllm_cls)
    return _REBOUND_CLASSES


def spec_classes() -> list[tuple[type, type]]:
    from vllm.v1 import kv_cache_interface as v

    return [(getattr(v, name), cls) for name, cls in _rebound().items()]


# -- KVCacheConfig ---------------------------------------------------------------------

_CONFIG_CLASS: list[type] = []


def _impl_config(config):
    """The groups of `config` as impl's config (what these answers read;
    knobs the manager input refuses do not matter here)."""
    from impl import kv_cache_spec as ispec

    groups = tuple(_groups_of(config))
    return ispec.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_groups=groups,
                               needs_kv_cache_zeroing=isizing.needs_kv_cache_zeroing(groups))


def _config_subclass(vllm_cls):
    def transfer_group_ids(self):
        return _impl_config(self).transfer_group_ids

    def transfer_groups(self):
        return tuple(self.kv_cache_groups[i] for i in transfer_group_ids(self))

    def transfer_group_index_by_layer(self):
        return {name: i for i, g in enumerate(transfer_groups(self)) for name in g.layer_names}

    def prefix_cacheable_group_ids(self):
        return _impl_config(self).prefix_cacheable_group_ids

    def prefix_cacheable_groups(self):
        return tuple(self.kv_cache_groups[i] for i in prefix_cacheable_group_ids(self))

    def select_transfer_block_ids(self, block_ids):
        return _impl_config(self).select_transfer_block_ids(block_ids)

    def needs_kv_cache_zeroing(self):
        return _impl_config(self).needs_kv_cache_zeroing

    return type(vllm_cls.__name__, (vllm_cls,), {
        "__doc__": "vLLM's KVCacheConfig, its derived answers impl's.",
        "__module__": __name__,
        "transfer_group_ids": property(transfer_group_ids),
        "transfer_groups": property(transfer_groups),
        "transfer_group_index_by_layer": property(transfer_group_index_by_layer),
        "prefix_cacheable_group_ids": property(prefix_cacheable_group_ids),
        "prefix_cacheable_groups": property(prefix_cacheable_groups),
        "select_transfer_block_ids": select_transfer_block_ids,
        "needs_kv_cache_zeroing": property(needs_kv_cache_zeroing),
    })


def config_class() -> tuple[type, type]:
    """(vLLM's KVCacheConfig, its rebound subclass)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    if not _CONFIG_CLASS:
        _CONFIG_CLASS.append(_config_subclass(KVCacheConfig))
    return KVCacheConfig, _CONFIG_CLASS[0]
