"""Per-worker KV cache configs from the whole engine's view (vLLM 0.32:
kv_cache_utils.get_kv_cache_configs and its helpers; 0.33 moved them to
kv_cache_planning); specs/KV_CACHE_MANAGER.md §12.7.

Workers (tensor- and pipeline-parallel ranks) report their layers' specs and
free memory. One grouping is made for the whole model, each worker sees its
share of it, the memory must hold at least one request of max_model_len
(which is shrunk to fit when it was asked for as -1), and every worker ends
up with the same number of blocks, the smallest any of them can afford, since
one scheduler hands out block ids for all of them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce

from impl.eagle import annotate_draft_groups
from impl.hisparse.layout import (
    HiSparsePlanning,
    hisparse_kv_cache_groups,
    plan_hisparse_config,
    planned_device_usage,
)
from impl.kv_cache_sizing import (
    KVCacheConfigPlan,
    UniformTypeKVCacheSpecs,
    bytes_per_block,
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
    get_max_concurrency,
    groups_are_packed,
    iter_layer_specs,
    max_memory_usage_bytes,
)
from impl.kv_cache_spec import AttentionSpec, KVCacheGroupSpec, KVCacheSpec, SlidingWindowSpec
from impl.math_utils import cdiv
from impl.profiles import KVCacheTensorPlan, TrailingDraftLayers, UnifyPadsPages

Specs = Mapping[str, KVCacheSpec]


@dataclass(slots=True)
class KVCachePlanningConfig:
    """The engine settings the plan depends on (vLLM reads them off its
    VllmConfig)."""

    max_model_len: int
    # The user asked for max_model_len -1: shrink it to what memory holds.
    auto_fit_max_model_len: bool = False
    num_gpu_blocks_override: int | None = None
    kv_cache_layout: str | None = "LBNHC"  # None: not resolved yet
    tensor_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    max_in_flight_tokens: int | None = None
    max_num_encoder_input_tokens: int = 0
    # Tokens speculative decoding prefills ahead: windows keep that many - 1
    # more tokens below them.
    num_prefill_lookahead_tokens: int = 0
    disable_hybrid_kv_cache_manager: bool = False
    # The engine's Mamba cache mode (None: each spec's own).
    mamba_cache_mode: str | None = None
    # The profile's sizing rules (unify_pads_pages, uniform_group_pad_ratio,
    # kv_cache_tensor_plan).
    pad_pages: bool | UnifyPadsPages = True
    pad_ratio: float = 1.5
    tensor_plan: KVCacheTensorPlan = KVCacheTensorPlan.STRIDED
    # Speculative decoding whose drafter drops hit tails (EAGLE / MTP): the
    # groups holding draft layers are flagged (specs §15); `trailing`: the
    # drafter's layers are the last ones registered (impl.eagle's
    # uses_trailing_draft_layers under `trailing_rule`, the profile's
    # trailing_draft_layers, which also says on which grouping path).
    flags_draft_groups: bool = False
    draft_layers_trailing: bool = False
    trailing_rule: TrailingDraftLayers = TrailingDraftLayers.MTP_OR_DEEPSEEK_V4
    # Layers whose spec marks them as a drafter's (a non-causal multi-token
    # decode): their groups are draft groups.
    draft_marked_layers: frozenset[str] = frozenset()
    # HiSparse on (spec §14.5): its facts; None: off.
    hisparse: HiSparsePlanning | None = None

    @property
    def hisparse_derived_when_planned(self) -> bool:
        """HiSparse on, its groups derived only when the config is planned
        (profile `hisparse_layout_stage` = planning)."""
        return self.hisparse is not None and self.hisparse.derived_when_planned

    def _usage_args(self) -> dict:
        return dict(dcp_world_size=self.decode_context_parallel_size,
                    max_in_flight_tokens=self.max_in_flight_tokens,
                    max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
                    mamba_cache_mode=self.mamba_cache_mode)

    def usage(self, spec, max_model_len: int | None = None) -> int:
        """One request's bytes in a group of this spec."""
        return max_memory_usage_bytes(
            spec, self.max_model_len if max_model_len is None else max_model_len,
            **self._usage_args())

    def concurrency(self, plan: KVCacheConfigPlan) -> float:
        """Requests of max_model_len the planned pools hold at once."""
        return get_max_concurrency(plan.kv_cache_groups, plan.num_blocks, self.max_model_len,
                                   plan.hisparse_host_num_blocks, **self._usage_args())

    def plain_groups(self, specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
        return get_kv_cache_groups(specs, self.pad_pages, self.kv_cache_layout,
                                   self.disable_hybrid_kv_cache_manager, self.pad_ratio)

    def groups(self, specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
        order = list(specs)  # before grouping may rewrite the specs in place
        groups = None
        if self.hisparse is not None and specs:
            # Its grouping runs after the hybrid manager's promotion (if off).
            if self.disable_hybrid_kv_cache_manager:
                get_kv_cache_groups(specs, disable_hybrid_kv_cache_manager=True)
            groups = hisparse_kv_cache_groups(specs, self.hisparse, self.plain_groups)
        if groups is None:
            groups = self.plain_groups(specs)
        if self.flags_draft_groups:
            trailing = self.draft_layers_trailing and (
                self.trailing_rule is not TrailingDraftLayers.DEEPSEEK_V4_PACKED
                or groups_are_packed(specs, self.kv_cache_layout))
            groups = annotate_draft_groups(groups, order, trailing, self.draft_marked_layers)
        return groups

    def plan(self, groups: Sequence[KVCacheGroupSpec], memory: int) -> KVCacheConfigPlan:
        if self.hisparse is not None and groups:
            return plan_hisparse_config(groups, memory, self.max_model_len, self.hisparse,
                                        self.kv_cache_layout, self.num_gpu_blocks_override)
        return get_kv_cache_config_from_groups(groups, memory, self.tensor_plan,
                                               self.kv_cache_layout, self.num_gpu_blocks_override)

    def block_bytes(self, groups: Sequence[KVCacheGroupSpec]) -> int:
        """Bytes one block id takes in the device pool (HiSparse's host
        group has a pool of its own)."""
        return bytes_per_block([g for g in groups if not g.host_resident], self.kv_cache_layout)


# -- memory checks --------------------------------------------------------------------


def _largest_fitting_length(fits: Callable[[int], bool], max_model_len: int) -> int:
    """The largest length in [1, max_model_len] that fits (fitting shrinks
    as the length grows), 0 if not even one token does."""
    if not fits(1):
        return 0
    low, high = 1, max_model_len  # low fits
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _require_memory(memory: int, needed: Callable[[], int], max_model_len: int,
                    estimate: Callable[[int], int]) -> None:
    if memory <= 0:
        raise ValueError(
            f"no memory is left for the KV cache ({memory} bytes); give the engine a "
            "larger share of the device memory (gpu_memory_utilization)")
    need = needed()
    if need > memory:
        fits = estimate(memory)
        hint = f"; at most {fits} tokens would fit" if fits > 0 else ""
        raise ValueError(
            f"one request of the model's max seq len ({max_model_len} tokens) needs "
            f"{need / 2**30:.2f} GiB of KV cache but only {memory / 2**30:.2f} GiB is "
            f"available{hint}; raise gpu_memory_utilization or lower max_model_len")


def estimate_max_model_len(specs: Specs, available_memory: int,
                           config: KVCachePlanningConfig) -> int:
    """The longest request the memory holds, each layer paying its own
    max_memory_usage (0: not even one token)."""
    def fits(length: int) -> bool:
        return sum(config.usage(s, length) for s in specs.values()) <= available_memory

    return _largest_fitting_length(fits, config.max_model_len)


def check_enough_kv_cache_memory(specs: Specs, available_memory: int,
                                 config: KVCachePlanningConfig) -> None:
    """ValueError unless the memory, less the null block, holds one request
    of max_model_len."""
    if not specs:
        return
    groups = config.groups(dict(specs))
    memory = available_memory - (config.block_bytes(groups) if groups else 0)
    _require_memory(memory, lambda: sum(config.usage(s) for s in specs.values()),
                    config.max_model_len,
                    lambda m: estimate_max_model_len(specs, m, config))


def _group_pages(spec, config: KVCachePlanningConfig, length: int) -> int:
    return cdiv(config.usage(spec, length), spec.page_size_bytes)


def _groups_need(groups: Sequence[KVCacheGroupSpec], config: KVCachePlanningConfig,
                 length: int) -> int:
    """Bytes one request of `length` tokens takes in a worker's pool: whole
    blocks of every group, each block as wide as the pool's."""
    if config.hisparse_derived_when_planned and groups:
        return planned_device_usage(groups, lambda spec: config.usage(spec, length))
    device = [g for g in groups if not g.host_resident]
    if not device:
        return 0
    pages = sum(_group_pages(g.kv_cache_spec, config, length) for g in device)
    return config.block_bytes(device) * pages


def _plan_at(groups, memory: int, config: KVCachePlanningConfig, length: int):
    """The plan for requests of `length`, None if it cannot be made."""
    try:
        return replace(config, max_model_len=length).plan(groups, memory)
    except ValueError:
        return None


def _plannable_at(groups, memory: int, config: KVCachePlanningConfig, length: int) -> bool:
    """HiSparse: whether its pools can be planned for requests of `length`."""
    return config.hisparse is None or _plan_at(groups, memory, config, length) is not None


def _holds_one_planned(groups, memory: int, config: KVCachePlanningConfig,
                       length: int) -> bool:
    """HiSparse with its groups derived when planned: whether pools planned
    for requests of `length` hold one of them (the device need is not
    counted in whole pool blocks there, so the planned pools answer)."""
    plan = _plan_at(groups, memory, config, length)
    return plan is not None and replace(config, max_model_len=length).concurrency(plan) >= 1


def _estimate_from_groups(groups, memory: int, config: KVCachePlanningConfig) -> int:
    if config.hisparse_derived_when_planned:
        return _largest_fitting_length(
            lambda n: _holds_one_planned(groups, memory, config, n), config.max_model_len)
    return _largest_fitting_length(
        lambda n: _plannable_at(groups, memory, config, n)
        and _groups_need(groups, config, n) <= memory, config.max_model_len)


# -- workers --------------------------------------------------------------------------


def project_kv_cache_groups_to_worker(groups: Sequence[KVCacheGroupSpec],
                                      worker_specs: Specs) -> list[KVCacheGroupSpec]:
    """The model's groups as one (pipeline-parallel) worker holds them: only
    its layers, possibly none of a group's."""
    out = []
    for group in groups:
        mine = [n for n in group.layer_names if n in worker_specs]
        if len(mine) == len(group.layer_names):
            out.append(group)
            continue
        spec = group.kv_cache_spec
        if mine and isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(spec.block_size,
                                           {n: spec.kv_cache_specs[n] for n in mine})
        # A worker holding none of a drafter's layers has no draft group.
        out.append(KVCacheGroupSpec(tuple(mine), spec,
                                    is_eagle_group=group.is_eagle_group and bool(mine)))
    return out


def _layer_tp_replicas(spec: KVCacheSpec, tp: int, dcp: int) -> int:
    if not isinstance(spec, AttentionSpec) or spec.max_tp_shards is None:
        return 1
    if spec.dcp_sharded and dcp > 1:
        return 1  # DCP already spreads it over the ranks
    return max(1, tp // spec.max_tp_shards)


def kv_cache_groups_tp_replicas(groups: Sequence[KVCacheGroupSpec], tp_size: int,
                                dcp_size: int = 1) -> int:
    """TP ranks in a row holding the same KV for every layer: the GCD over
    layers of tp / the layer's shards."""
    layers = [s for g in groups for s in iter_layer_specs(g.kv_cache_spec)]
    if not layers:
        return 1
    return reduce(math.gcd, (_layer_tp_replicas(s, tp_size, dcp_size) for s in layers), tp_size)


def generate_scheduler_kv_cache_config(configs: Sequence[KVCacheConfigPlan]) -> KVCacheConfigPlan:
    """The scheduler's config: workers differ only in layer names; a
    uniform-type group is managed as its first layer's spec."""
    if any(c.num_blocks != configs[0].num_blocks for c in configs):
        raise AssertionError("workers planned different numbers of blocks: "
                             f"{[c.num_blocks for c in configs]}")
    out = copy.deepcopy(configs[0])
    out.kv_cache_groups = [
        KVCacheGroupSpec(g.layer_names, g.kv_cache_spec.first_spec)
        if isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) else g
        for g in out.kv_cache_groups]
    return out


def _merge_worker_specs(worker_specs: Sequence[Specs]) -> dict[str, KVCacheSpec]:
    merged: dict[str, KVCacheSpec] = {}
    for specs in worker_specs:
        for name, spec in specs.items():
            if merged.setdefault(name, spec) != spec:
                raise AssertionError(f"layer {name} has different KV cache specs on "
                                     "different workers")
    return merged


def get_kv_cache_configs(
    worker_specs: Sequence[Specs], available_memory: Sequence[int],
    config: KVCachePlanningConfig,
) -> tuple[list[KVCacheConfigPlan], int]:
    """One KV cache config per worker, and the max_model_len they were
    planned for (shrunk when auto-fitted)."""
    merged = _merge_worker_specs(worker_specs)
    # Windows keep the draft tokens a multi-token drafter prefills again.
    retained = max(0, config.num_prefill_lookahead_tokens - 1)
    for name, spec in merged.items():
        if isinstance(spec, SlidingWindowSpec):
            merged[name] = replace(spec, extra_retained_tokens=retained)
    model_groups = config.groups(merged)
    per_worker = [project_kv_cache_groups_to_worker(model_groups, specs)
                  for specs in worker_specs]
    memory = list(available_memory)
    if config.num_gpu_blocks_override is not None:
        # The pool will have this many blocks whatever the memory: plan with that.
        memory = [config.num_gpu_blocks_override * config.block_bytes(groups)
                  if groups else m for groups, m in zip(per_worker, memory)]
    if config.hisparse_derived_when_planned and memory:
        # Every worker plans with the smallest worker's memory.
        memory = [min(memory)] * len(memory)
    # One block of each pool is the null block no request can use.
    usable = [m - config.block_bytes(groups) if groups else m
              for groups, m in zip(per_worker, memory)]
    if config.auto_fit_max_model_len and any(per_worker):
        fitted = min(_estimate_from_groups(groups, m, config)
                     for groups, m in zip(per_worker, usable) if groups)
        if fitted <= 0:
            raise ValueError("max_model_len -1 cannot be fitted: the KV cache memory does "
                             "not hold a single token; raise gpu_memory_utilization")
        if fitted < config.max_model_len:
            config = replace(config, max_model_len=fitted)
    for groups, m in zip(per_worker, usable):
        if groups:
            _require_memory(m, lambda g=groups: _groups_need(g, config, config.max_model_len),
                            config.max_model_len,
                            lambda mem, g=groups: _estimate_from_groups(g, mem, config))
    plans = []
    for groups, specs, m in zip(per_worker, worker_specs, memory):
        if sum(len(g.layer_names) for g in groups) != len(specs):
            raise AssertionError("a layer of a worker is in no KV cache group")
        plans.append(config.plan(groups, m))
    fewest = min(p.num_blocks for p in plans)
    for i, p in enumerate(plans):
        if p.num_blocks != fewest:
            # Planned again for exactly the memory the fewest blocks take, so
            # strides and offsets fit the smaller allocation.
            groups = p.kv_cache_groups
            plans[i] = config.plan(groups, fewest * config.block_bytes(groups))
    for p in plans:
        p.kv_tp_replicas = kv_cache_groups_tp_replicas(
            p.kv_cache_groups, config.tensor_parallel_size, config.decode_context_parallel_size)
    return plans, config.max_model_len
