"""KV cache sizing, as vLLM plans it (vLLM: kv_cache_utils' grouping and sizing
functions, the specs' page_size_bytes and max_memory_usage_bytes).

From the spec of every layer to a KV cache config:
1. the page of a layer: the bytes one block of it takes. Attention: heads x
   block_size x (K + V head sizes) x dtype bytes; MLA stores one latent (no V);
   Mamba: its state tensors, whatever the block size;
2. the groups: layers with the same spec form one group (one block table);
   a hybrid model first gets a uniform page size (smaller pages grow their
   block size by the ratio, else are padded) and its layers are split into
   groups of equal layer counts (padding the last group of a kind);
3. the block sizes the scheduler and the hashes work in (LCM and GCD of the
   groups' block sizes, scaled by decode context parallelism where it shards);
4. num_blocks: the memory budget over the bytes one block takes in every layer
   of the widest group, and the tensor plan: where each layer's pages live;
5. the capacity: how many requests of max_model_len the pool holds at once.

The tensor plan differs between versions (profile.kv_cache_tensor_plan): 0.17
has one tensor per layer slot shared by one layer of each group; 0.32 one
allocation with a strided region per layer, laid out by a KVCacheLayout.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import prod

from impl.kv_cache_spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from impl.math_utils import cdiv
from impl.profiles import BlockSizesRule, KVCacheTensorPlan

# -- 1. pages ------------------------------------------------------------------------


def unpadded_page_size_bytes(spec: KVCacheSpec) -> int:
    if isinstance(spec, AttentionSpec):
        # One state per token; K and V side by side in each (head, token) cell.
        return spec.num_kv_heads * spec.block_size * (
            (spec.head_size + spec.v_head_size) * spec.dtype_size
        )
    if isinstance(spec, MambaSpec):
        return sum(prod(s) * d for s, d in zip(spec.shapes, spec.dtype_sizes))
    raise NotImplementedError(f"no page size for {type(spec).__name__}")


def page_size_bytes(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> int:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return sum(page_size_bytes(s) for s in spec.kv_cache_specs.values())
    padded = getattr(spec, "page_size_padded", None)
    if padded is not None:
        assert padded >= unpadded_page_size_bytes(spec)
        return padded
    return unpadded_page_size_bytes(spec)


def layer_view_shape_bytes(spec: KVCacheSpec, num_blocks: int) -> tuple[int, int, int, int]:
    """vLLM 0.32's logical per-layer cache view [blocks, heads, states, bytes]."""
    if isinstance(spec, AttentionSpec):
        return (num_blocks, spec.num_kv_heads, spec.block_size,
                (spec.head_size + spec.v_head_size) * spec.dtype_size)
    return (num_blocks, 1, 1, unpadded_page_size_bytes(spec))


def layer_kv_cache_shape(spec: AttentionSpec, num_blocks: int) -> tuple[int, ...]:
    """A layer's KV cache as a 0.17 attention backend allocates it: K and V
    planes of (num_blocks, block_size, num_kv_heads, head_size); an MLA latent
    is one plane."""
    if isinstance(spec, MLAAttentionSpec):
        return (num_blocks, spec.block_size, spec.head_size)
    return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)


# -- 3. block sizes --------------------------------------------------------------------


def resolve_dcp_block_size(spec: KVCacheSpec, dcp_world_size: int) -> int:
    """Tokens a block spans when DCP shards the cache's positions across ranks."""
    return spec.block_size * (dcp_world_size if spec.dcp_sharded else 1)


def resolve_kv_cache_block_sizes(
    specs: Sequence[KVCacheSpec],
    enable_caching: bool,
    dcp_world_size: int = 1,
    prefix_match_unit: int | None = None,
    kv_connector: bool = False,
    rule: BlockSizesRule = BlockSizesRule.LCM_GCD,
    pcp_world_size: int = 1,
) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) for the groups' specs.

    0.32: one group: its (DCP-scaled) block size for both. Several: the LCM of
    the block sizes for the scheduler, and hashes every GCD (or
    prefix_match_unit) tokens, unless nothing reads hashes (no caching, no
    connector) or a Mamba group is not in "align" mode.
    0.17: the cache block size (the smallest group's) times dcp * pcp for
    hashes; hybrid hits align to the LCM of the group block sizes.
    """
    if rule is BlockSizesRule.CACHE_BLOCK_SIZE:
        cache_block = min(s.block_size for s in specs) * dcp_world_size * pcp_world_size
        if len(specs) <= 1:
            return cache_block, cache_block
        return math.lcm(*(s.block_size for s in specs)), cache_block
    if len(specs) <= 1:
        dcp = dcp_world_size if specs and specs[0].dcp_sharded else 1
        bs = specs[0].block_size * dcp if specs else 0
        if prefix_match_unit not in (None, bs) and specs and (enable_caching or kv_connector):
            raise ValueError(
                f"prefix_match_unit={prefix_match_unit} cannot apply: a model with one KV "
                f"cache group is hashed (and hit) per {bs}-token block")
        return bs, bs
    sizes = [resolve_dcp_block_size(s, dcp_world_size) for s in specs]
    scheduler = math.lcm(*sizes)
    if not (enable_caching or kv_connector):
        return scheduler, scheduler
    if any(isinstance(s, MambaSpec) and s.mamba_cache_mode != "align" for s in specs):
        return scheduler, scheduler
    hashing = [b for s, b in zip(specs, sizes) if s.prefix_cacheable] or sizes
    hash_block = prefix_match_unit if prefix_match_unit is not None else math.gcd(*hashing)
    if any(b % hash_block for b in hashing):
        raise ValueError(
            f"prefix_match_unit={hash_block} does not divide every cacheable group's "
            f"block size (groups: {sizes})")
    return scheduler, hash_block


# -- 2. groups --------------------------------------------------------------------------


@dataclass(slots=True)
class UniformTypeKVCacheSpecs:
    """Layers of one kind (the same token slots) with different page sizes:
    one group, one block table, a page per layer each its own size."""

    block_size: int
    kv_cache_specs: dict[str, KVCacheSpec]

    @property
    def first_spec(self) -> KVCacheSpec:
        return next(iter(self.kv_cache_specs.values()))

    @property
    def dcp_sharded(self) -> bool:
        """Layers of one group share one DCP geometry: the first's."""
        return self.first_spec.dcp_sharded


class MergeError(ValueError):
    """Layer specs that cannot share one group spec."""


class ReplicationMismatch(MergeError, AssertionError):
    """DCP-sharded and replicated layers asked to share a group (vLLM asserts)."""


def _attention_fields(spec: AttentionSpec) -> tuple:
    return (spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype_size,
            spec.head_size_v, spec.page_size_padded)


def merge_specs(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """One spec for layers sharing a group (vLLM: type(specs[0]).merge)."""
    first = specs[0]
    if any(s.dcp_sharded != first.dcp_sharded for s in specs):
        # A group has one block geometry: DCP-sharded and replicated layers
        # cannot share it.
        raise ReplicationMismatch("DCP-sharded and replicated layers in one group")
    if type(first) in (FullAttentionSpec, SinkFullAttentionSpec):
        if not all(isinstance(s, FullAttentionSpec) for s in specs):
            raise MergeError("full attention shares a group only with full attention")
        if any(isinstance(s, MLAAttentionSpec) for s in specs):
            raise MergeError("MLA layers group only with MLA layers")
        windows = {s.sliding_window for s in specs if s.sliding_window is not None}
        chunks = {s.attention_chunk_size for s in specs if s.attention_chunk_size is not None}
        if len(windows) > 1 or len(chunks) > 1:
            raise MergeError("layers of different windows or chunks in one group")
        if any(_attention_fields(s) != _attention_fields(first) for s in specs):
            raise MergeError("layers of different head shapes or dtypes in one group")
        if windows and chunks:
            raise MergeError("sliding window and chunked local layers in one group")
        # The merged spec keeps the one window or chunk some layer has.
        return replace(first, sliding_window=next(iter(windows), None),
                       attention_chunk_size=next(iter(chunks), None))
    if type(first) is MLAAttentionSpec:
        if not all(isinstance(s, MLAAttentionSpec) for s in specs) or any(
            _attention_fields(s) != _attention_fields(first) for s in specs
        ):
            raise MergeError("MLA layers of different shapes in one group")
        return first
    if any(s != first for s in specs):
        raise MergeError("layers of different specs in one group")
    return first


def _uniform_base(spec: KVCacheSpec) -> type:
    """The kind a spec groups with (vLLM's registered uniform_type_base_spec)."""
    for base in (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec,
                 MambaSpec, CrossAttentionSpec):
        if isinstance(spec, base):
            return base
    return type(spec)


def is_uniform_type(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether all layers need the same token slots (one group, one table)."""
    values = list(specs.values())
    if len({s.block_size for s in values}) > 1 or len({s.dcp_sharded for s in values}) > 1:
        return False
    first = values[0]
    if isinstance(first, SlidingWindowSpec):
        return all(isinstance(s, SlidingWindowSpec) and s.sliding_window == first.sliding_window
                   for s in values)
    if isinstance(first, ChunkedLocalAttentionSpec):
        return all(isinstance(s, ChunkedLocalAttentionSpec)
                   and s.attention_chunk_size == first.attention_chunk_size for s in values)
    if isinstance(first, MambaSpec):
        return all(isinstance(s, MambaSpec)
                   and s.num_speculative_blocks == first.num_speculative_blocks
                   and page_size_bytes(s) == page_size_bytes(first) for s in values)
    base = _uniform_base(first)
    return all(isinstance(s, base) for s in values)


def _is_uniform_spec(specs: Mapping[str, KVCacheSpec]) -> bool:
    try:
        merge_specs(list(specs.values()))
    except MergeError:
        return False
    return True


def unify_kv_cache_spec_page_size(
    specs: dict[str, KVCacheSpec], pad_pages: bool = True
) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page: grow the block size by the page ratio
    where it divides, else pad the page (Mamba, non-MLA attention). Without
    padding (0.17, profile.unify_pads_pages) only block sizes grow."""
    pages = {page_size_bytes(s) for s in specs.values()}
    if len(pages) <= 1:
        return specs
    max_page = max(pages)
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        page = page_size_bytes(spec)
        if page == max_page:
            out[name] = spec
        elif pad_pages and isinstance(spec, MambaSpec):
            out[name] = replace(spec, page_size_padded=max_page)
        elif max_page % page == 0:
            out[name] = replace(spec, block_size=spec.block_size * (max_page // page))
        elif (pad_pages and isinstance(spec, AttentionSpec)
              and not isinstance(spec, MLAAttentionSpec)):
            out[name] = replace(spec, page_size_padded=max_page)
        else:
            raise NotImplementedError(
                f"layer {name}: its {page}-byte page neither divides the largest page "
                f"({max_page} bytes) nor can be padded to it")
        # (A Mamba page does not grow with its block size: 0.17 fails here.)
        assert page_size_bytes(out[name]) == max_page
    return out


def _groups_of_uniform_page_size(specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Hybrid layers of one page size: split every kind into groups of the same
    layer count, the count being the smallest kind's (or the largest's when the
    kinds are nearly balanced), padding the last group of a kind."""
    same_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in specs.items():
        same_spec[spec].append(name)
    # Specs that merge (full attention differing only in window) share a bucket.
    buckets: list[tuple[list[str], list[KVCacheSpec]]] = []
    for spec, names in same_spec.items():
        for bucket_names, bucket_specs in buckets:
            try:
                merge_specs([*bucket_specs, spec])
            except MergeError:
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            buckets.append((list(names), [spec]))
    counts = [len(names) for names, _ in buckets]
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    grouped: list[list[str]] = []
    for names, _ in buckets:
        num_groups = cdiv(len(names), group_size)
        # Strided, so that pipeline stages each get layers of every group.
        grouped.extend(names[i::num_groups] for i in range(num_groups))
    return [
        KVCacheGroupSpec(tuple(names), merge_specs([specs[n] for n in names]))
        for names in grouped
    ]


def get_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec], pad_pages: bool = True, layout: str = "LBNHC"
) -> list[KVCacheGroupSpec]:
    """Split the model's layers into KV cache groups (a group of a
    UniformTypeKVCacheSpecs when one kind has several page sizes)."""
    specs = dict(specs)
    if not specs:
        return []  # attention-free
    if _is_uniform_spec(specs):
        return [KVCacheGroupSpec(tuple(specs), merge_specs(list(specs.values())))]
    if is_uniform_type(specs):
        first = next(iter(specs.values()))
        return [KVCacheGroupSpec(tuple(specs), UniformTypeKVCacheSpecs(first.block_size, specs))]
    if _block_outermost(layout) and len({page_size_bytes(s) for s in specs.values()}) > 1:
        # vLLM 0.32 packs mixed page sizes side by side in each block instead
        # (_get_packed_kv_cache_groups); not implemented here.
        raise NotImplementedError("packed groups of mixed page sizes (block-outermost layout)")
    return _groups_of_uniform_page_size(
        unify_kv_cache_spec_page_size(specs, pad_pages))


# -- 4. blocks and tensors ------------------------------------------------------------

# Logical axes of a strided plan: layer, block, head, state, content bytes.
_L, _B, _H, _N, _C = range(5)
KV_CACHE_LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def _block_outermost(layout: str) -> bool:
    return KV_CACHE_LAYOUTS[layout][0] == _B


@dataclass(slots=True)
class KVCacheTensor:
    """0.32: layer `layers[l]`'s page of block b starts at
    offset + l * layer_stride + b * block_stride bytes into one allocation of
    `size` bytes (groups alias the same bytes: a block id belongs to one group
    at a time). 0.17: a tensor of `size` bytes `shared_by` one layer of each
    group (strides and offset unused)."""

    size: int
    layers: list[str]
    layer_stride: int = 0
    block_stride: int = 0
    offset: int = 0


@dataclass(slots=True)
class KVCacheConfigPlan:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def _layer_specs(group: KVCacheGroupSpec) -> list[tuple[str, KVCacheSpec]]:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return [(n, spec.kv_cache_specs[n]) for n in group.layer_names]
    return [(n, spec) for n in group.layer_names]


def bytes_per_block(groups: Sequence[KVCacheGroupSpec], layout: str = "LBNHC") -> int:
    """Bytes one block id takes: every layer's page in the widest group."""
    return max(sum(page_size_bytes(s) for _, s in _layer_specs(g)) for g in groups)


def layout_strides(spec: KVCacheSpec, num_blocks: int, num_layers: int, layout: str,
                   block_stride: int | None = None) -> tuple[int, ...]:
    """Byte strides of the logical [L, B, H, N, C] axes under `layout`."""
    order = KV_CACHE_LAYOUTS[layout]
    shape = (num_layers, *layer_view_shape_bytes(spec, num_blocks))
    padded = getattr(spec, "page_size_padded", None)
    page_grid_end = max(order.index(_L), order.index(_B)) + 1
    fixed = (None, block_stride, None, None, None)
    strides = [0] * 5
    current = 1
    for physical, dim in reversed(tuple(enumerate(order))):
        if padded is not None and physical == page_grid_end - 1:
            current = max(current, padded)
        strides[dim] = fixed[dim] or current
        current = strides[dim] * shape[dim]
    return tuple(strides)


def get_kv_cache_config_from_groups(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    plan: KVCacheTensorPlan = KVCacheTensorPlan.STRIDED,
    layout: str = "LBNHC",
    num_gpu_blocks_override: int | None = None,
) -> KVCacheConfigPlan:
    """num_blocks from the memory budget, and where every layer's pages live."""
    groups = list(groups)
    if not groups:
        # Attention-free: one block, the null block the pool always needs.
        return KVCacheConfigPlan(1, [], groups)
    if plan is KVCacheTensorPlan.SHARED_BY:
        return _shared_by_plan(groups, available_memory, num_gpu_blocks_override)
    per_block = bytes_per_block(groups, layout)
    num_blocks = available_memory // per_block
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    size = per_block * num_blocks
    outer = _block_outermost(layout)
    tensors = []
    for group in groups:
        by_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
        for name, spec in _layer_specs(group):
            by_spec[spec].append(name)
        offset = 0
        for spec, names in by_spec.items():
            strides = layout_strides(spec, num_blocks, len(names), layout,
                                     per_block if outer else None)
            tensors.append(KVCacheTensor(size, names, strides[_L], strides[_B], offset))
            offset += len(names) * (page_size_bytes(spec) if outer else strides[_L])
    return KVCacheConfigPlan(num_blocks, tensors, groups)


def _shared_by_plan(groups: list[KVCacheGroupSpec], available_memory: int,
                    num_gpu_blocks_override: int | None) -> KVCacheConfigPlan:
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        # One kind, several page sizes: a tensor per layer, sized by its page.
        num_blocks = available_memory // page_size_bytes(groups[0].kv_cache_spec)
        if num_gpu_blocks_override is not None:
            num_blocks = num_gpu_blocks_override
        specs = groups[0].kv_cache_spec.kv_cache_specs
        return KVCacheConfigPlan(num_blocks, [
            KVCacheTensor(page_size_bytes(specs[n]) * num_blocks, [n])
            for n in groups[0].layer_names
        ], groups)
    # Layer slot i of every group shares one tensor (groups use disjoint blocks).
    group_size = max(len(g.layer_names) for g in groups)
    pages = {page_size_bytes(g.kv_cache_spec) for g in groups}
    assert len(pages) == 1, "hybrid groups must share one page size"
    page = pages.pop()
    num_blocks = max(available_memory // page // group_size, 0)
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    tensors = [
        KVCacheTensor(page * num_blocks, [g.layer_names[i] for g in groups
                                          if i < len(g.layer_names)])
        for i in range(group_size)
    ]
    return KVCacheConfigPlan(num_blocks, tensors, groups)


# -- 5. capacity ----------------------------------------------------------------------


def max_memory_usage_bytes(
    spec: KVCacheSpec | UniformTypeKVCacheSpecs,
    max_model_len: int,
    dcp_world_size: int = 1,
    max_in_flight_tokens: int | None = None,
    max_num_encoder_input_tokens: int = 0,
) -> int:
    """The most one request can take of this group (vLLM's
    spec.max_memory_usage_bytes)."""
    in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
    if isinstance(spec, UniformTypeKVCacheSpecs):
        pages = max(
            cdiv(max_memory_usage_bytes(s, max_model_len, dcp_world_size, in_flight,
                                        max_num_encoder_input_tokens), page_size_bytes(s))
            for s in spec.kv_cache_specs.values()
        )
        return pages * page_size_bytes(spec)
    page = page_size_bytes(spec)
    if isinstance(spec, FullAttentionSpec):
        length = max_model_len
        if spec.dcp_sharded and dcp_world_size > 1:
            length = cdiv(length, dcp_world_size)
        return cdiv(length, spec.block_size) * page
    if isinstance(spec, SlidingWindowSpec):
        n = min(spec.sliding_window - 1 + spec.extra_retained_tokens + in_flight, max_model_len)
        return (cdiv(n, spec.block_size) + 1) * page
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return cdiv(min(spec.attention_chunk_size + in_flight, max_model_len),
                    spec.block_size) * page
    if isinstance(spec, MambaSpec):
        if spec.mamba_cache_mode == "align":
            return page * (2 + spec.num_speculative_blocks)
        return page * (1 + spec.num_speculative_blocks)
    if isinstance(spec, CrossAttentionSpec):
        return cdiv(max_num_encoder_input_tokens, spec.block_size) * page
    raise NotImplementedError(type(spec).__name__)


def get_max_concurrency(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, max_model_len: int, **kwargs
) -> float:
    """Requests of max_model_len the pool holds at once: every group draws its
    blocks from the one pool, so a request costs the sum over groups."""
    per_request = sum(
        cdiv(max_memory_usage_bytes(g.kv_cache_spec, max_model_len, **kwargs),
             page_size_bytes(g.kv_cache_spec))
        for g in groups
    )
    return num_blocks / per_request


def get_kv_cache_capacity(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, max_model_len: int, **kwargs
) -> tuple[int, float]:
    """(tokens, concurrency): the group-aware token capacity vLLM logs."""
    concurrency = get_max_concurrency(groups, num_blocks, max_model_len, **kwargs)
    return int(concurrency * max_model_len), concurrency
