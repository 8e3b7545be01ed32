"""How HiSparse splits a sparse-MLA model into groups and sizes its two
pools; specs/KV_CACHE_MANAGER.md §14.5.

The sparse attention layers' full history lives in a host pool (the source
group); the device pool holds the indexer's keys, a window of recent pages
of each source layer (resident groups) and a per-request region the kernel
gathers selected rows into (hot groups). Everything else of the model is
grouped and planned as usual, in the same device pool.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.hisparse.types import ACTIVE_TAIL_PAGES
from impl.kv_cache_sizing import (
    KVCacheConfigPlan,
    UniformTypeKVCacheSpecs,
    bytes_per_block,
    get_kv_cache_config_from_groups,
)
from impl.kv_cache_spec import KVCacheGroupRole, KVCacheGroupSpec, KVCacheSpec, MLAAttentionSpec
from impl.math_utils import cdiv
from impl.profiles import HiSparseLayoutStage

RESIDENT_SUFFIX = ".hisparse_resident"
HOT_SUFFIX = ".hisparse_hot"
# The hot buffer's slots are indexed with int16.
_MAX_HOT_ROWS = 1 << 15
# Host blocks a pool needs beyond one longest request: the null block and a
# copy-on-write tail.
_HOST_SPARE_BLOCKS = 2


@dataclass(frozen=True, slots=True)
class HiSparsePlanning:
    """The engine facts HiSparse's layout depends on (vLLM reads them off its
    VllmConfig, its HiSparse config and the platform)."""

    index_topk: int  # rows each decode query selects
    device_buffer_size: int | None = None  # hot rows a request, as configured
    max_decode_query_len: int = 1  # 1 + speculative tokens
    host_pool_bytes: int | None = None  # None: no HiSparse connector sized one
    shared_host_pool: bool = False  # local TP ranks map one host pool
    # The profile's hisparse_layout_stage: when the groups are derived.
    layout_stage: HiSparseLayoutStage = HiSparseLayoutStage.GROUPING

    @property
    def derived_when_planned(self) -> bool:
        """Grouping leaves the MLA layers in one group; planning derives
        HiSparse's groups from it."""
        return self.layout_stage is HiSparseLayoutStage.PLANNING

    def hot_rows(self) -> int:
        """Rows of a request's hot buffer: a top-k per decode query, plus one
        top-k of slack unless configured."""
        least = self.max_decode_query_len * self.index_topk
        rows = self.device_buffer_size
        if rows is None:
            rows = least + self.index_topk
        if rows < least:
            raise ValueError(
                f"a HiSparse hot buffer of {rows} rows cannot hold the {least} rows "
                f"{self.max_decode_query_len} decode queries of top-{self.index_topk} select")
        if rows > _MAX_HOT_ROWS:
            raise ValueError(f"a HiSparse hot buffer of {rows} rows overflows its int16 "
                             f"slot indices (at most {_MAX_HOT_ROWS})")
        return rows


def uses_shared_host_pool(*, cuda_alike: bool, tensor_parallel_size: int,
                          pipeline_parallel_size: int = 1,
                          prefill_context_parallel_size: int = 1,
                          decode_context_parallel_size: int = 1, world_size: int = 1,
                          distributed_executor_backend: str | None = None,
                          nnodes_within_dp: int = 1) -> bool:
    """Whether the TP ranks of one node can map one host pool (the MLA host
    KV is the same on every rank): pure TP on one node, mp workers, CUDA."""
    return (cuda_alike and tensor_parallel_size > 1
            and pipeline_parallel_size == prefill_context_parallel_size
            == decode_context_parallel_size == nnodes_within_dp == 1
            and world_size == tensor_parallel_size
            and distributed_executor_backend == "mp")


# -- groups ---------------------------------------------------------------------------


def _is_derived(spec: KVCacheSpec) -> bool:
    return isinstance(spec, (HiSparseResidentSpec, HiSparseHotSpec))


def _split_by_role(mla: KVCacheSpec) -> tuple[dict, dict]:
    """The MLA group's source and indexer layers."""
    if not isinstance(mla, UniformTypeKVCacheSpecs):
        raise ValueError("HiSparse derives its groups from one group of MLA layers of "
                         f"a uniform type, not from a {type(mla).__name__}")
    layers = mla.kv_cache_specs
    if any(getattr(s, "model_version", None) == "deepseek_v4" for s in layers.values()):
        raise ValueError("HiSparse cannot serve DeepSeek V4 layers: it does not support "
                         "DeepSeek V4's compressed caches")
    if not all(isinstance(s, MLAAttentionSpec) for s in layers.values()):
        raise ValueError("HiSparse's first group may hold MLA layers only")
    source = {n: s for n, s in layers.items() if s.cache_role == "sparse"}
    indexer = {n: s for n, s in layers.items() if s.cache_role == "indexer"}
    if not source or not indexer:
        raise ValueError("HiSparse needs both sparse-MLA layers and their indexer's "
                         f"layers (got {len(source)} and {len(indexer)})")
    return source, indexer


def _hot_units(source: Mapping[str, MLAAttentionSpec]) -> list[list[str]]:
    """Source layers cut at every index-group leader."""
    units: list[list[str]] = []
    for name, spec in source.items():
        if spec.is_index_group_leader or not units:
            units.append([])
        units[-1].append(name)
    return units


def _pack_units(units: list[list[str]], source: Mapping[str, MLAAttentionSpec],
                budget: int) -> list[list[str]]:
    """Units packed in order into bundles whose pages stay within `budget`
    (a bundle of one unit may exceed it)."""
    bundles: list[list[str]] = []
    used = 0
    for unit in units:
        size = sum(source[n].page_size_bytes for n in unit)
        if not bundles or (bundles[-1] and used + size > budget):
            bundles.append([])
            used = 0
        bundles[-1].extend(unit)
        used += size
    return bundles


def _derived_groups(bundle: list[str], source: Mapping[str, MLAAttentionSpec],
                    block_size: int, hot_blocks: int) -> tuple[KVCacheGroupSpec, ...]:
    pages = {source[n].page_size_bytes for n in bundle}
    if len(pages) != 1:
        raise ValueError(f"the source layers {bundle} of one HiSparse hot group have pages "
                         f"of {sorted(pages)} bytes; they must share one size")
    page = pages.pop()
    resident = KVCacheGroupSpec(
        tuple(n + RESIDENT_SUFFIX for n in bundle),
        HiSparseResidentSpec(block_size=block_size, page_size=page), enable_kv_transfer=False)
    hot = KVCacheGroupSpec(
        tuple(n + HOT_SUFFIX for n in bundle),
        HiSparseHotSpec(block_size=block_size, page_size=page, blocks_per_request=hot_blocks),
        enable_kv_transfer=False)
    return resident, hot


def _lay_out(mla: KVCacheSpec, others: list[KVCacheGroupSpec],
             planning: HiSparsePlanning) -> list[KVCacheGroupSpec]:
    """HiSparse's groups derived from `mla`, the one group of every MLA
    layer, with the model's other groups after them."""
    source, indexer = _split_by_role(mla)
    block_sizes = {s.block_size for s in (*source.values(), *indexer.values())}
    if len(block_sizes) != 1:
        raise ValueError(f"HiSparse's MLA layers come in block sizes {sorted(block_sizes)}; "
                         "they must resolve to one")
    block_size = block_sizes.pop()
    hot_blocks = cdiv(planning.hot_rows(), block_size)
    indexer_page = sum(s.page_size_bytes for s in indexer.values())
    residents, hots = [], []
    for bundle in _pack_units(_hot_units(source), source, indexer_page):
        resident, hot = _derived_groups(bundle, source, block_size, hot_blocks)
        residents.append(resident)
        hots.append(hot)
    source_group = KVCacheGroupSpec(
        tuple(source), UniformTypeKVCacheSpecs.from_specs(source),
        role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True)
    indexer_group = KVCacheGroupSpec(
        tuple(indexer), UniformTypeKVCacheSpecs.from_specs(indexer),
        role=KVCacheGroupRole.HISPARSE_INDEXER)
    return [source_group, indexer_group, *residents, *hots, *others]


def hisparse_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec], planning: HiSparsePlanning,
    group_rest: Callable[[dict[str, KVCacheSpec]], list[KVCacheGroupSpec]],
) -> list[KVCacheGroupSpec] | None:
    """HiSparse's groups for the model's layers (None: grouped as usual).
    `group_rest` groups the non-MLA layers as usual. Derived when grouping
    (profile `hisparse_layout_stage` = grouping), else the MLA layers' one
    group ahead of the rest, for planning to derive them from."""
    mla = {n: s for n, s in specs.items() if isinstance(s, MLAAttentionSpec)}
    if not mla:
        return None
    rest = {n: s for n, s in specs.items() if n not in mla and not _is_derived(s)}
    if planning.derived_when_planned and not rest:
        # An MLA-only model: its usual grouping already makes that one group.
        return None
    uniform = UniformTypeKVCacheSpecs.from_specs(mla)
    if uniform is None:
        raise AssertionError("HiSparse's MLA layers are not of one uniform type")
    others = group_rest(rest) if rest else []
    if planning.derived_when_planned:
        return [KVCacheGroupSpec(tuple(mla), uniform), *others]
    return _lay_out(uniform, others, planning)


def planned_device_usage(groups: Sequence[KVCacheGroupSpec],
                         usage: Callable[[KVCacheSpec], int]) -> int:
    """One request's device bytes for groups whose HiSparse groups are
    derived when planned: the indexer layers' and the other groups' own
    usage (the source layers live on the host; the resident and hot groups,
    not derived yet, are not counted)."""
    _, indexer = _split_by_role(groups[0].kv_cache_spec)
    return (sum(usage(s) for s in indexer.values())
            + sum(usage(g.kv_cache_spec) for g in groups[1:]))


# -- pools ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HiSparseLayout:
    """The host pool's size and the groups on each side of it."""

    source_group: KVCacheGroupSpec
    device_groups: list[KVCacheGroupSpec]
    host_num_blocks: int
    host_block_stride: int
    shared_host_pool: bool


def plan_host_pool(groups: Sequence[KVCacheGroupSpec], max_model_len: int | None,
                   host_budget: int, shared_host_pool: bool) -> HiSparseLayout:
    """Host blocks of `host_budget` bytes; one request of max_model_len must
    fit (None: not checked, the stage `planning`)."""
    host = [g for g in groups if g.host_resident]
    if len(host) != 1:
        raise AssertionError(f"HiSparse needs one host-resident group, got {len(host)}")
    (source,) = host
    stride = source.kv_cache_spec.page_size_bytes
    if shared_host_pool:
        # Ranks map the pool's pages: each block starts on an OS page.
        stride = cdiv(stride, mmap.PAGESIZE) * mmap.PAGESIZE
    num_blocks = host_budget // stride
    if num_blocks <= 0:
        raise ValueError(f"the HiSparse host budget of {host_budget} bytes holds no "
                         f"{stride}-byte block")
    needed = 0 if max_model_len is None else (
        cdiv(max_model_len, source.kv_cache_spec.block_size) + _HOST_SPARE_BLOCKS)
    if num_blocks < needed:
        raise ValueError(
            f"a request of max_model_len {max_model_len} needs {needed} HiSparse host "
            f"blocks but the pool holds {num_blocks}: increase host_pool_gib")
    return HiSparseLayout(source, [g for g in groups if not g.host_resident], num_blocks,
                          stride, shared_host_pool)


def hisparse_layout(groups: Sequence[KVCacheGroupSpec], max_model_len: int,
                    planning: HiSparsePlanning, host_budget: int) -> HiSparseLayout:
    """The two pools' groups and the host pool's size, the groups derived
    first where grouping left that to planning."""
    if planning.derived_when_planned:
        groups = _lay_out(groups[0].kv_cache_spec, list(groups[1:]), planning)
        return plan_host_pool(groups, None, host_budget, planning.shared_host_pool)
    return plan_host_pool(groups, max_model_len, host_budget, planning.shared_host_pool)


def plan_hisparse_config(groups: Sequence[KVCacheGroupSpec], available_memory: int,
                         max_model_len: int, planning: HiSparsePlanning, layout: str,
                         num_gpu_blocks_override: int | None = None) -> KVCacheConfigPlan:
    """The device pool from `available_memory`, the host pool from the
    planning's host budget; host tensors first."""
    if planning.host_pool_bytes is None:
        raise ValueError("HiSparse has no host pool: its connector must set host_pool_gib")
    pools = hisparse_layout(groups, max_model_len, planning, planning.host_pool_bytes)
    device = get_kv_cache_config_from_groups(pools.device_groups, available_memory,
                                             layout=layout,
                                             num_gpu_blocks_override=num_gpu_blocks_override)
    host_layout = "LBNHC"  # the host pool is laid out layer by layer
    host_memory = bytes_per_block([pools.source_group], host_layout) * pools.host_num_blocks
    host = get_kv_cache_config_from_groups([pools.source_group], host_memory,
                                           layout=host_layout)
    for tensor in host.kv_cache_tensors:
        tensor.host_resident = True
    return KVCacheConfigPlan(
        device.num_blocks, host.kv_cache_tensors + device.kv_cache_tensors,
        [pools.source_group, *pools.device_groups],
        hisparse_host_num_blocks=pools.host_num_blocks,
        hisparse_host_block_stride=pools.host_block_stride,
        hisparse_shared_host_pool=pools.shared_host_pool)


def steady_state_concurrency(groups: Sequence[KVCacheGroupSpec], num_blocks: int,
                             host_num_blocks: int,
                             pages: Callable[[KVCacheGroupSpec], int]) -> float:
    """Requests of max_model_len served at once when running ones read their
    history from the host: those pin only their active tail of each resident
    group, the one being admitted its whole window. `pages(group)`: blocks
    one request takes in the group."""
    admit = steady = host = 0
    for group in groups:
        n = pages(group)
        if group.host_resident:
            host += n
            continue
        admit += n
        steady += min(n, ACTIVE_TAIL_PAGES) if isinstance(
            group.kv_cache_spec, HiSparseResidentSpec) else n
    if num_blocks < admit:
        device = num_blocks / admit
    else:
        device = 1 + (num_blocks - admit) / steady
    return min(device, host_num_blocks / host)
