"""KV cache sizing, as vLLM plans it (vLLM: kv_cache_utils' grouping and sizing
functions, the specs' max_memory_usage_bytes); specs/KV_CACHE_MANAGER.md §12.

From the spec of every layer to a KV cache config:
1. the page of a layer: the bytes one block of it takes, which the spec
   answers (spec.page_size_bytes: a [heads, states, content] grid for
   attention, the state tensors for Mamba); here its strides and views;
2. the groups: layers with the same spec form one group (one block table);
   a hybrid model first gets a uniform page size (smaller pages grow their
   block size by the ratio, else are padded) and its layers are split into
   groups of equal layer counts; block-outermost layouts pack pages of
   several sizes side by side instead (impl/kv_cache_packing.py);
3. the block sizes the scheduler and the hashes work in (LCM and GCD of the
   groups' block sizes, scaled by decode context parallelism where it shards);
4. num_blocks: the memory budget over the bytes one block takes in every layer
   of the widest group, and the tensor plan: where each layer's pages live;
5. the capacity: how many requests of max_model_len the pool holds at once.
Per-worker planning from a whole engine config is impl/kv_cache_planning.py.

The tensor plan differs between versions (profile.kv_cache_tensor_plan): 0.17
has one tensor per layer slot shared by one layer of each group; 0.32 one
allocation with a strided region per layer, laid out by a KVCacheLayout.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from math import prod

from impl.group_rules import hits_inside_blocks
from impl.kv_cache_layout import (
    AXIS_B,
    AXIS_L,
    block_outermost,
    layers_outermost,
    layout_order,
    pages_contiguous,
)
from impl.kv_cache_packing import get_packed_kv_cache_groups
from impl.kv_cache_spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from impl.math_utils import cdiv
from impl.profiles import BlockSizesRule, KVCacheTensorPlan, UnifyPadsPages
from impl.uniform_type_spec import (
    UniformTypeKVCacheSpecs,
    is_full_attention_spec,
    is_uniform_type,
    iter_layer_specs,
)

# (UniformTypeKVCacheSpecs and its helpers are read from here too, as
# vLLM's kv_cache_utils callers read them.)
__all__ = ["UniformTypeKVCacheSpecs", "is_full_attention_spec", "is_uniform_type",
           "iter_layer_specs"]

# -- 1. pages ------------------------------------------------------------------------


def block_stride_alignment(spec: KVCacheSpec) -> int:
    """Bytes the distance between this layer's blocks must be a multiple of."""
    return spec.block_stride_alignment or 1


def layer_block_stride(spec: KVCacheSpec) -> int:
    """A layer-outer block stride: the page rounded up to its alignment."""
    step = block_stride_alignment(spec)
    return cdiv(spec.page_size_bytes, step) * step


def layer_view_shape_bytes(spec: KVCacheSpec, num_blocks: int,
                           kernel_block_size: int | None = None) -> tuple[int, int, int, int]:
    """vLLM 0.32's logical per-layer cache view [blocks, heads, states, bytes];
    with a kernel block size, each of the num_blocks blocks is split into
    blocks of that many tokens (which must divide the spec's)."""
    kernel = spec.block_size if kernel_block_size is None else kernel_block_size
    if spec.block_size % kernel:
        raise AssertionError(f"a kernel block of {kernel} tokens does not divide the "
                             f"{spec.block_size}-token block")
    blocks = num_blocks * (spec.block_size // kernel)
    if isinstance(spec, AttentionSpec):
        return (blocks, spec.num_heads, spec.get_num_kernel_states(kernel),
                spec.state_content_size_bytes)
    return (blocks, 1, 1, spec.real_page_size_bytes)


def layer_kv_cache_shape(spec: AttentionSpec, num_blocks: int) -> tuple[int, ...]:
    """A layer's KV cache as a 0.17 attention backend allocates it: K and V
    planes of (num_blocks, block_size, num_kv_heads, head_size); an MLA latent
    is one plane."""
    if isinstance(spec, MLAAttentionSpec):
        return (num_blocks, spec.block_size, spec.head_size)
    return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)


def get_uniform_page_size(specs: Iterable[KVCacheSpec]) -> int:
    pages = {s.page_size_bytes for s in specs}
    if len(pages) != 1:
        raise AssertionError(f"expected one page size, got {sorted(pages)}")
    return pages.pop()


# -- 2a. one group's spec for several layers: impl/uniform_type_spec.py ---------------
# -- 2b. merging layer specs ----------------------------------------------------------


class MergeError(AssertionError):
    """Layer specs that cannot share one group spec (vLLM asserts)."""


def _attention_fields(spec: AttentionSpec) -> tuple:
    """What every layer of an attention group must agree on."""
    return (spec.block_size, spec.dcp_sharded, spec.block_stride_alignment,
            spec.max_tp_shards, spec.num_kv_heads, spec.head_size, spec.dtype_size,
            spec.v_head_size, spec.kv_quant_mode, spec.page_size_padded, spec.num_head_slots,
            spec.state_content_bytes, spec.tokens_per_state)


def _one_of(values: set, what: str):
    """The one value of a set of optional window sizes (None: no value)."""
    values = {v for v in values if v is not None}
    if len(values) > 1:
        raise ValueError(f"one group cannot mix {what} {sorted(values)}")
    return next(iter(values), None)


def _merge_full_attention(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    first = specs[0]
    if not all(isinstance(s, FullAttentionSpec) for s in specs):
        raise MergeError("full attention shares a group only with full attention")
    if any(isinstance(s, MLAAttentionSpec) for s in specs):
        raise MergeError("MLA layers group only with MLA layers")
    window = _one_of({s.sliding_window for s in specs}, "sliding windows")
    chunk = _one_of({s.attention_chunk_size for s in specs}, "attention chunks")
    merged = replace(first, sliding_window=window, attention_chunk_size=chunk)
    if any(_attention_fields(s) != _attention_fields(merged) for s in specs):
        raise MergeError("layers of different head shapes, dtypes or strides in one group")
    if window is not None and chunk is not None:
        raise MergeError("sliding window and chunked local layers in one group")
    return merged


def _merge_rswa(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    if not all(isinstance(s, RSWASpec) for s in specs):
        raise MergeError("R-SWA layers group only with R-SWA layers")
    if len({s.rswa_window for s in specs}) != 1:
        raise MergeError("R-SWA layers of different windows in one group")
    return _merge_full_attention(specs)


def _labels_agree(specs: Sequence[KVCacheSpec], labels) -> bool:
    return len({labels(s) for s in specs}) == 1


def _mla_labels(spec: MLAAttentionSpec) -> tuple:
    return (spec.cache_dtype_str, spec.tokens_per_state, spec.model_version, spec.cache_role,
            spec.is_index_group_leader, spec.block_stride_alignment)


def _sliding_window_mla_labels(spec: SlidingWindowMLASpec) -> tuple:
    return (spec.cache_dtype_str, spec.tokens_per_state, spec.model_version,
            spec.sliding_window, spec.extra_retained_tokens, spec.block_stride_alignment,
            spec.max_tp_shards, spec.dcp_sharded)


def _merge_mla(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    if not all(isinstance(s, MLAAttentionSpec) for s in specs):
        raise MergeError("MLA layers group only with MLA layers")
    if not _labels_agree(specs, _mla_labels):
        raise MergeError("MLA layers of different cache formats or roles in one group")
    # Built from the first layer: a window, chunk or alignment does not carry over.
    merged = replace(specs[0], sliding_window=None, attention_chunk_size=None, alignment=None)
    if any(_attention_fields(s) != _attention_fields(merged) for s in specs):
        raise MergeError("MLA layers of different shapes in one group")
    return merged


def _merge_sliding_window_mla(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    if not all(isinstance(s, SlidingWindowMLASpec) for s in specs):
        raise MergeError("sliding-window MLA layers group only with their own kind")
    if not _labels_agree(specs, _sliding_window_mla_labels):
        raise MergeError("sliding-window MLA layers of different windows or formats")
    return replace(specs[0], kv_quant_mode=0, alignment=None)


def merge_specs(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """One spec for layers sharing a group (vLLM: type(specs[0]).merge: the
    first layer's kind decides the rule)."""
    first = specs[0]
    if isinstance(first, RSWASpec):
        return _merge_rswa(specs)
    if isinstance(first, MLAAttentionSpec):
        return _merge_mla(specs)
    if isinstance(first, FullAttentionSpec):
        return _merge_full_attention(specs)
    if isinstance(first, SlidingWindowMLASpec):
        return _merge_sliding_window_mla(specs)
    if any(s != first for s in specs):
        raise MergeError("layers of different specs in one group")
    return first


def is_kv_cache_spec_uniform(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether the layers' specs merge into one (a window clash is not a no:
    it is the ValueError merging raises)."""
    if not specs:
        return True  # nothing to disagree (attention-free)
    try:
        merge_specs(list(specs.values()))
    except MergeError:
        return False
    return True


# -- 3. block sizes --------------------------------------------------------------------


def resolve_dcp_block_size(spec: KVCacheSpec | UniformTypeKVCacheSpecs,
                           dcp_world_size: int) -> int:
    """Tokens a block spans when DCP shards the cache's positions across ranks."""
    return spec.block_size * (dcp_world_size if spec.dcp_sharded else 1)


def resolve_dcp_kv_cache_spec(spec: KVCacheSpec | UniformTypeKVCacheSpecs,
                              dcp_world_size: int) -> KVCacheSpec | UniformTypeKVCacheSpecs:
    """The spec with its block size in tokens across the DCP ranks (the same
    object when DCP does not scale it)."""
    size = resolve_dcp_block_size(spec, dcp_world_size)
    if size == spec.block_size:
        return spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return UniformTypeKVCacheSpecs(size, {
            name: resolve_dcp_kv_cache_spec(s, dcp_world_size)
            for name, s in spec.kv_cache_specs.items()})
    return replace(spec, block_size=size)


def _state_compressions(specs) -> set[int]:
    """Tokens per state of the cacheable layers that compress several tokens
    into one state: hits must land on multiples of them."""
    return {s.tokens_per_state for spec in specs for s in iter_layer_specs(spec)
            if s.prefix_cacheable and isinstance(getattr(s, "tokens_per_state", None), int)
            and s.tokens_per_state > 1}


def resolve_kv_cache_block_sizes(
    specs: Sequence[KVCacheSpec | UniformTypeKVCacheSpecs],
    enable_caching: bool,
    dcp_world_size: int = 1,
    prefix_match_unit: int | None = None,
    kv_connector: bool = False,
    rule: BlockSizesRule = BlockSizesRule.LCM_GCD,
    pcp_world_size: int = 1,
) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) for the groups' specs, by
    `rule` (profile.block_sizes_rule).

    0.29+ (LCM_GCD): one group: its (DCP-scaled where sharded) block size for
    both. Several: the LCM of the block sizes for the scheduler, and hashes
    every GCD of the cacheable groups' sizes (or prefix_match_unit), unless
    nothing reads hashes (no caching, no connector) or a Mamba group is not in
    "align" mode. 0.26-0.28 (LCM_GCD_ALL_GROUPS): one group scales by dcp
    whatever its spec; the GCD is over every group. 0.20-0.25
    (CACHE_BLOCK_SIZE_FOR_ONE_GROUP): one group: block size x dcp x pcp;
    several: unscaled sizes, refused under context parallelism.
    0.17-0.19 (CACHE_BLOCK_SIZE): the cache block size (the smallest group's)
    times dcp * pcp for hashes; hybrid hits align to the LCM of the group
    block sizes.
    """
    if rule is BlockSizesRule.CACHE_BLOCK_SIZE:
        cache_block = min(s.block_size for s in specs) * dcp_world_size * pcp_world_size
        if len(specs) <= 1:
            return cache_block, cache_block
        return math.lcm(*(s.block_size for s in specs)), cache_block
    older = rule is not BlockSizesRule.LCM_GCD
    if len(specs) <= 1:
        if rule is BlockSizesRule.CACHE_BLOCK_SIZE_FOR_ONE_GROUP:
            bs = specs[0].block_size * dcp_world_size * pcp_world_size if specs else 0
            return bs, bs
        dcp = dcp_world_size if specs and (older or specs[0].dcp_sharded) else 1
        bs = specs[0].block_size * dcp if specs else 0
        if (not older and prefix_match_unit not in (None, bs) and specs
                and (enable_caching or kv_connector)):
            raise ValueError(
                f"prefix_match_unit={prefix_match_unit} cannot apply: a model with one KV "
                f"cache group is hashed (and hit) per {bs}-token block")
        return bs, bs
    if rule is BlockSizesRule.CACHE_BLOCK_SIZE_FOR_ONE_GROUP:
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("a model of several KV cache groups cannot run under context "
                             "parallelism in this release")
        sizes = [s.block_size for s in specs]
    else:
        sizes = [resolve_dcp_block_size(s, dcp_world_size) for s in specs]
    scheduler = math.lcm(*sizes)
    if not (enable_caching or kv_connector):
        return scheduler, scheduler
    if any(isinstance(s, MambaSpec) and s.mamba_cache_mode != "align"
           for spec in specs for s in iter_layer_specs(spec)):
        return scheduler, scheduler
    if older:
        hash_block = prefix_match_unit if prefix_match_unit is not None else math.gcd(*sizes)
        if any(b % hash_block for b in sizes):
            raise ValueError(f"prefix_match_unit={hash_block} does not divide every group's "
                             f"block size (groups: {sizes})")
        return scheduler, hash_block
    hashing = [b for s, b in zip(specs, sizes) if s.prefix_cacheable] or sizes
    hash_block = prefix_match_unit if prefix_match_unit is not None else math.gcd(*hashing)
    if any(b % hash_block for b in hashing):
        raise ValueError(
            f"prefix_match_unit={hash_block} does not divide every cacheable group's "
            f"block size (groups: {sizes})")
    compressions = _state_compressions(specs)
    if compressions:
        unit = hash_block if hits_inside_blocks(specs, hash_block, dcp_world_size) else scheduler
        if any(unit % c for c in compressions):
            raise ValueError(
                f"prefix_match_unit={hash_block}: hits every {unit} tokens would split "
                f"states that compress {sorted(compressions)} tokens")
    return scheduler, hash_block


# -- 2d. groups --------------------------------------------------------------------------


def unify_kv_cache_spec_page_size(
    specs: dict[str, KVCacheSpec], pad_pages: bool | UnifyPadsPages = True
) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page: grow the block size by the page ratio
    where it divides, else pad the page (Mamba, non-MLA attention).
    profile.unify_pads_pages: before 0.24 only block sizes grow; 0.24-0.25 pad
    attention pages but not Mamba ones."""
    if not isinstance(pad_pages, UnifyPadsPages):
        pad_pages = UnifyPadsPages.ALWAYS if pad_pages else UnifyPadsPages.NEVER
    pad_mamba = pad_pages is UnifyPadsPages.ALWAYS
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) <= 1:
        return specs
    max_page = max(pages)
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == max_page:
            out[name] = spec
        elif pad_mamba and isinstance(spec, MambaSpec):
            out[name] = replace(spec, page_size_padded=max_page)
        elif max_page % page == 0:
            out[name] = replace(spec, block_size=spec.block_size * (max_page // page))
        elif (pad_pages and isinstance(spec, AttentionSpec)
              and not isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec))):
            out[name] = replace(spec, page_size_padded=max_page)
        else:
            # (Sparse MLA reads its cache in whole token rows: no padding.)
            raise NotImplementedError(
                f"layer {name}: its {page}-byte page neither divides the largest page "
                f"({max_page} bytes) nor can be padded to it")
        # (A Mamba page does not grow with its block size: 0.17 fails here.)
        assert out[name].page_size_bytes == max_page
    return out


def _groups_of_uniform_page_size(specs: dict[str, KVCacheSpec], pad_ratio: float = 1.5
                                 ) -> list[KVCacheGroupSpec]:
    """Hybrid layers of one page size: split every kind into groups of the same
    layer count, the count being the smallest kind's (or the largest's when the
    largest is below `pad_ratio` times the smallest: profile.uniform_group_pad_ratio),
    padding the last group of a kind."""
    same_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in specs.items():
        same_spec[spec].append(name)
    # Specs that merge (full attention differing only in window) share a bucket.
    buckets: list[tuple[list[str], list[KVCacheSpec]]] = []
    for spec, names in same_spec.items():
        for bucket_names, bucket_specs in buckets:
            try:
                merge_specs([*bucket_specs, spec])
            except (AssertionError, ValueError):
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            buckets.append((list(names), [spec]))
    counts = [len(names) for names, _ in buckets]
    group_size = min(counts)
    if max(counts) < min(counts) * pad_ratio:
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


# Local attention promoted to full attention (allocation only; the layer
# still computes its window or chunk). Sliding-window MLA first: it is also
# a sliding window.
_PROMOTIONS = ((SlidingWindowMLASpec, MLAAttentionSpec), (SlidingWindowSpec, FullAttentionSpec),
               (ChunkedLocalAttentionSpec, FullAttentionSpec))


def _promoted(spec: AttentionSpec, target: type, block_size: int) -> AttentionSpec:
    padded = spec.page_size_padded
    if padded is not None:
        # Padding grows with the block (never below the old padding).
        padded = max(padded, spec.real_page_size_bytes * block_size // spec.block_size)
    # Fields the target kind lacks (a window's retained tokens) are dropped.
    kept = {f.name for f in fields(target)}
    values = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init and f.name in kept}
    values.update(block_size=block_size, page_size_padded=padded)
    return target(**values)


def promote_local_kv_cache_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Sliding-window and chunked-local layers as full attention, when full
    attention is there too, so that every layer can share one table.
    ValueError when the result still is not of one kind."""
    out = dict(specs)
    if is_kv_cache_spec_uniform(out) or is_uniform_type(out):
        return out
    values = list(specs.values())
    full_sizes = {s.block_size for s in values if isinstance(s, FullAttentionSpec)}
    local = any(isinstance(s, (SlidingWindowSpec, ChunkedLocalAttentionSpec)) for s in values)
    if full_sizes and local:
        for name, spec in specs.items():
            target = next((t for kind, t in _PROMOTIONS if isinstance(spec, kind)), None)
            if target is not None:
                size = next(iter(full_sizes)) if len(full_sizes) == 1 else spec.block_size
                out[name] = _promoted(spec, target, size)
    if not (is_kv_cache_spec_uniform(out) or is_uniform_type(out)):
        raise ValueError("the layers' KV caches cannot be made one kind: local attention "
                         "becomes full attention only next to full attention, and "
                         "nothing else changes kind")
    return out


def unify_hybrid_kv_cache_specs(specs: dict[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """The hybrid manager is off: one kind of table for every layer (local
    attention promoted to full attention). Updates `specs` in place (as vLLM
    does) and returns it."""
    by_sharding: dict[bool, dict[str, KVCacheSpec]] = defaultdict(dict)
    for name, spec in specs.items():
        by_sharding[isinstance(spec, AttentionSpec) and not spec.dcp_sharded][name] = spec
    for part in by_sharding.values():
        promoted = promote_local_kv_cache_specs(part)
        if promoted != part:
            specs.update(promoted)
    return specs


def full_allocation_fallback_groups(
        specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """MLA next to a sliding window whose pages cannot be unified: the window
    layers allocate as full attention, every layer in one uniform-type group.
    None when the model is not such a case."""
    values = list(specs.values())
    if any(isinstance(s, (HiddenStateCacheSpec, SlidingWindowMLASpec, ChunkedLocalAttentionSpec))
           for s in values):
        return None
    if not (any(isinstance(s, MLAAttentionSpec) for s in values)
            and any(isinstance(s, SlidingWindowSpec) for s in values)):
        return None
    try:
        promoted = promote_local_kv_cache_specs(specs)
    except ValueError:
        return None
    uniform = UniformTypeKVCacheSpecs.from_specs(promoted)
    if uniform is None:
        return None
    return [KVCacheGroupSpec(tuple(uniform.kv_cache_specs), uniform)]


def _hidden_state_bytes_per_token(spec: HiddenStateCacheSpec) -> int:
    return spec.num_kv_heads * spec.head_size * spec.dtype_size


def _largest_divisor_at_most(value: int, limit: int) -> int:
    return next((d for d in range(min(value, limit), 0, -1) if value % d == 0), 1)


def _with_hidden_state_groups(groups: list[KVCacheGroupSpec],
                              hidden: dict[str, HiddenStateCacheSpec]) -> list[KVCacheGroupSpec]:
    """A group per hidden-state layer, its page padded to the groups' one
    page; that page first grows (with every group's block size) until a
    token's hidden states fit in it."""
    page = get_uniform_page_size(g.kv_cache_spec for g in groups)
    widest = max(_hidden_state_bytes_per_token(s) for s in hidden.values())
    if widest > page:
        scale = cdiv(widest, page)
        page *= scale
        scaled = []
        for g in groups:
            spec = g.kv_cache_spec
            changes = {"block_size": spec.block_size * scale}
            if getattr(spec, "page_size_padded", None) is not None:
                changes["page_size_padded"] = spec.page_size_padded * scale
            scaled.append(KVCacheGroupSpec(g.layer_names, replace(spec, **changes)))
        groups = scaled
    common = math.gcd(*(g.kv_cache_spec.block_size for g in groups))
    for name, spec in hidden.items():
        fits = max(page // _hidden_state_bytes_per_token(spec), 1)
        groups.append(KVCacheGroupSpec((name,), replace(
            spec, block_size=_largest_divisor_at_most(common, fits), page_size_padded=page)))
    return groups


def _one_group(specs: Mapping[str, KVCacheSpec]) -> KVCacheGroupSpec | None:
    """The model's only group when its layers have one spec or one uniform
    type; None otherwise."""
    if is_kv_cache_spec_uniform(specs):
        return KVCacheGroupSpec(tuple(specs), merge_specs(list(specs.values())))
    uniform = UniformTypeKVCacheSpecs.from_specs(specs)
    return None if uniform is None else KVCacheGroupSpec(tuple(specs), uniform)


def _split_hidden_state_layers(specs: Mapping[str, KVCacheSpec]) -> tuple[dict, dict]:
    """(hidden-state layers, the rest): the former keep a table of their own."""
    hidden = {n: s for n, s in specs.items() if isinstance(s, HiddenStateCacheSpec)}
    return hidden, {n: s for n, s in specs.items() if n not in hidden}


def groups_are_packed(specs: Mapping[str, KVCacheSpec], layout: str = "LBNHC") -> bool:
    """Whether get_kv_cache_groups makes these (already promoted) specs'
    groups on its packed path."""
    if not specs or _one_group(specs) is not None:
        return False
    return get_packed_kv_cache_groups(_split_hidden_state_layers(specs)[1], layout) is not None


def get_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec], pad_pages: bool | UnifyPadsPages = True,
    layout: str = "LBNHC", disable_hybrid_kv_cache_manager: bool = False,
    pad_ratio: float = 1.5,
) -> list[KVCacheGroupSpec]:
    """Split the model's layers into KV cache groups (§12.3). With the hybrid
    manager off, `specs` is first promoted in place (as vLLM does)."""
    if disable_hybrid_kv_cache_manager:
        unify_hybrid_kv_cache_specs(specs)
    specs = dict(specs)
    if not specs:
        return []  # attention-free
    one = _one_group(specs)
    if one is not None:
        return [one]
    hidden, rest = _split_hidden_state_layers(specs)
    packed = get_packed_kv_cache_groups(rest, layout)
    if packed is not None:
        # Blocks are strided by the widest group: no page to align to.
        return packed + [KVCacheGroupSpec((n,), s) for n, s in hidden.items()]
    try:
        rest = unify_kv_cache_spec_page_size(rest, pad_pages)
    except NotImplementedError:
        fallback = full_allocation_fallback_groups(specs)
        if fallback is None:
            raise
        return fallback
    groups = _groups_of_uniform_page_size(rest, pad_ratio)
    return _with_hidden_state_groups(groups, hidden) if hidden else groups


# -- 4. blocks and tensors ------------------------------------------------------------

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
    # In HiSparse's host pool, not the device pool.
    host_resident: bool = False


@dataclass(slots=True)
class KVCacheConfigPlan:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
    # TP ranks in a row holding the same KV for every layer (1: none).
    kv_tp_replicas: int = 1
    # HiSparse's host pool (impl/hisparse/layout.py); None / False without it.
    hisparse_host_num_blocks: int | None = None
    hisparse_host_block_stride: int | None = None
    hisparse_shared_host_pool: bool = False


def _layer_specs(group: KVCacheGroupSpec) -> list[tuple[str, KVCacheSpec]]:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return [(n, spec.kv_cache_specs[n]) for n in group.layer_names]
    return [(n, spec) for n in group.layer_names]


def bytes_per_block(groups: Sequence[KVCacheGroupSpec], layout: str = "LBNHC") -> int:
    """Bytes one block id takes: every layer's page in the widest group (each
    rounded up to its stride alignment, or the whole block rounded up to all
    of them when blocks are outermost)."""
    if not block_outermost(layout):
        return max(sum(layer_block_stride(s) for _, s in _layer_specs(g)) for g in groups)
    widest = max(sum(s.page_size_bytes for _, s in _layer_specs(g)) for g in groups)
    step = math.lcm(*(block_stride_alignment(s) for g in groups for _, s in _layer_specs(g)))
    # A hot region's blocks are addressed in whole pages of it (HiSparse).
    for g in groups:
        if getattr(g.kv_cache_spec, "blocks_per_request", None) is not None:
            step = math.lcm(step, g.kv_cache_spec.page_size_bytes)
    return cdiv(widest, step) * step


def validate_kv_cache_layout(layout: str, groups: Sequence[KVCacheGroupSpec]) -> None:
    """Pages of several sizes sit side by side inside a block: the layout
    must keep a page contiguous and, with several groups, not put the layers
    outermost."""
    pages = {s.page_size_bytes for g in groups for _, s in _layer_specs(g)}
    if len(pages) <= 1:
        return
    if not pages_contiguous(layout) or (len(groups) > 1 and layers_outermost(layout)):
        raise ValueError(
            f"the {layout} KV cache layout cannot hold pages of {len(pages)} sizes "
            f"({sorted(pages)} bytes) in one pool; a layout with blocks outermost can")


def layout_strides(spec: KVCacheSpec, num_blocks: int, num_layers: int, layout: str,
                   block_stride: int | None = None, layer_stride: int | None = None,
                   kernel_block_size: int | None = None) -> tuple[int, ...]:
    """Byte strides of the logical [L, B, H, N, C] axes under `layout`; a
    given block or layer stride is kept (the worker's views take the plan's),
    the other axes follow from the layout."""
    order = layout_order(layout)
    shape = (num_layers, *layer_view_shape_bytes(spec, num_blocks, kernel_block_size))
    padded = getattr(spec, "page_size_padded", None)
    if padded is not None and kernel_block_size not in (None, spec.block_size):
        # Padding sits after a whole block's page: a kernel block has none.
        raise AssertionError(f"a padded page cannot be split into {kernel_block_size}-token "
                             f"kernel blocks")
    page_grid_end = max(order.index(AXIS_L), order.index(AXIS_B)) + 1
    if padded is not None and prod(shape[d] for d in order[:page_grid_end]) != (
            num_layers * num_blocks):
        # Padding goes after each (layer, block) page: no other axis may sit
        # outside it unless it has a single entry.
        raise AssertionError(f"the {layout} layout puts more than layers and blocks outside "
                             f"a padded page (logical shape {shape})")
    fixed = (layer_stride, block_stride, None, None, None)
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
    if plan is not KVCacheTensorPlan.STRIDED:
        # 0.24-0.28's tensors carry an offset and a block stride, both zero
        # outside the packed layouts this plan does not implement.
        return _shared_by_plan(groups, available_memory, num_gpu_blocks_override)
    validate_kv_cache_layout(layout, groups)
    per_block = bytes_per_block(groups, layout)
    num_blocks = available_memory // per_block
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    size = per_block * num_blocks
    outer = block_outermost(layout)
    tensors = []
    for group in groups:
        by_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            for name, layer in spec.kv_cache_specs.items():
                by_spec[layer].append(name)
        elif group.layer_names:
            by_spec[spec].extend(group.layer_names)
        offset = 0
        for spec, names in by_spec.items():
            if not spec.has_layer_views:
                # HiSparse's resident / hot pages: a raw region of whole pages.
                if not outer:
                    raise ValueError(f"HiSparse's {type(spec).__name__} pages need blocks "
                                     f"outermost in the KV cache layout, not {layout}")
                page = spec.page_size_bytes
                tensors.append(KVCacheTensor(size, names, page, per_block, offset))
                offset += len(names) * page
                continue
            stride = per_block if outer else None
            padded = layer_block_stride(spec)
            if stride is None and padded != spec.page_size_bytes:
                # A layer-outer region whose pages are padded to the alignment.
                assert pages_contiguous(layout), f"{layout} cannot pad a page"
                stride = padded
            strides = layout_strides(spec, num_blocks, len(names), layout, stride)
            tensors.append(KVCacheTensor(size, names, strides[AXIS_L], strides[AXIS_B], offset))
            offset += len(names) * (spec.page_size_bytes if outer else strides[AXIS_L])
    return KVCacheConfigPlan(num_blocks, tensors, groups)


def _shared_by_plan(groups: list[KVCacheGroupSpec], available_memory: int,
                    num_gpu_blocks_override: int | None) -> KVCacheConfigPlan:
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        # One kind, several page sizes: a tensor per layer, sized by its page.
        num_blocks = available_memory // groups[0].kv_cache_spec.page_size_bytes
        if num_gpu_blocks_override is not None:
            num_blocks = num_gpu_blocks_override
        specs = groups[0].kv_cache_spec.kv_cache_specs
        return KVCacheConfigPlan(num_blocks, [
            KVCacheTensor(specs[n].page_size_bytes * num_blocks, [n])
            for n in groups[0].layer_names
        ], groups)
    # Layer slot i of every group shares one tensor (groups use disjoint blocks).
    group_size = max(len(g.layer_names) for g in groups)
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
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
    mamba_cache_mode: str | None = None,
) -> int:
    """The most one request can take of this group (vLLM's
    spec.max_memory_usage_bytes). `mamba_cache_mode`: the engine's, which
    every Mamba spec was built with (None: the spec's own)."""
    in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
    if isinstance(spec, UniformTypeKVCacheSpecs):
        pages = max(
            cdiv(max_memory_usage_bytes(s, max_model_len, dcp_world_size, in_flight,
                                        max_num_encoder_input_tokens, mamba_cache_mode),
                 s.page_size_bytes)
            for s in spec.kv_cache_specs.values()
        )
        return pages * spec.page_size_bytes
    page = spec.page_size_bytes
    if getattr(spec, "blocks_per_request", None) is not None:
        return spec.blocks_per_request * page  # HiSparse hot region
    if isinstance(spec, SlidingWindowSpec) and spec.dcp_sharded and dcp_world_size > 1:
        raise AssertionError("a sliding window cannot be sharded by DCP")
    # A recycling kind (windows, chunks, HiSparse's resident pages) is sized
    # by the cap it is admitted by: one rule for startup and run time.
    cap = spec.max_admission_blocks_per_request(in_flight, max_model_len)
    if cap is not None:
        return cap * page
    if isinstance(spec, CircularBufferSpec):
        return page  # one ring for the request's whole life
    if isinstance(spec, FullAttentionSpec):
        length = max_model_len
        if spec.dcp_sharded and dcp_world_size > 1:
            length = cdiv(length, dcp_world_size)
        return cdiv(length, spec.block_size) * page
    if isinstance(spec, MambaSpec):
        mode = spec.mamba_cache_mode if mamba_cache_mode is None else mamba_cache_mode
        if mode == "align":
            # The running state, the one it was copied from, the checkpoint
            # blocks and the draft tokens' scratch blocks.
            return page * (2 + spec.num_prefill_checkpoint_blocks + spec.num_speculative_blocks)
        return page * (1 + spec.num_speculative_blocks)
    if isinstance(spec, CrossAttentionSpec):
        return cdiv(max_num_encoder_input_tokens, spec.block_size) * page
    raise NotImplementedError(type(spec).__name__)


def max_num_blocks_per_req(
    spec: KVCacheSpec | UniformTypeKVCacheSpecs, max_len: int, dcp_world_size: int = 1,
    mamba_cache_mode: str | None = None, **usage,
) -> int:
    """Block-table entries a request of `max_len` tokens needs in this group
    (the worker's block table row)."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        widths = {max_num_blocks_per_req(s, max_len, dcp_world_size, mamba_cache_mode, **usage)
                  for s in spec.kv_cache_specs.values()}
        if len(widths) != 1:
            raise AssertionError(f"layers of one group need {sorted(widths)} table entries")
        return widths.pop()
    if isinstance(spec, CircularBufferSpec):
        return 1
    if getattr(spec, "blocks_per_request", None) is not None:
        return spec.blocks_per_request
    if isinstance(spec, AttentionSpec):
        return cdiv(max_len, resolve_dcp_block_size(spec, dcp_world_size))
    if isinstance(spec, MambaSpec):
        mode = spec.mamba_cache_mode if mamba_cache_mode is None else mamba_cache_mode
        if mode == "align":
            # Rows are indexed by position over the whole sequence.
            return cdiv(max_len, spec.block_size) + spec.num_speculative_blocks
        usage = max_memory_usage_bytes(spec, max_len, dcp_world_size,
                                       mamba_cache_mode=mamba_cache_mode, **usage)
        return cdiv(usage, spec.page_size_bytes)
    return cdiv(max_len, spec.block_size)


def needs_kv_cache_zeroing(groups: Sequence[KVCacheGroupSpec]) -> bool:
    """Whether the worker must zero new blocks (§16.4): a state-space layer
    reads its state before writing all of it, and a block reused across
    device groups of different precisions would decode stale bytes."""
    layers = [(g, s) for g in groups for s in iter_layer_specs(g.kv_cache_spec)]
    if any(isinstance(s, MambaSpec) for _, s in layers):
        return True
    precisions = {(s.dtype_label, s.dtype_size, s.kv_quant_mode) for g, s in layers
                  if isinstance(s, AttentionSpec) and not g.host_resident}
    return len(precisions) > 1


def pages_per_request(group: KVCacheGroupSpec, max_model_len: int, **kwargs) -> int:
    """Blocks one request of max_model_len takes in this group."""
    spec = group.kv_cache_spec
    return cdiv(max_memory_usage_bytes(spec, max_model_len, **kwargs), spec.page_size_bytes)


def get_max_concurrency(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, max_model_len: int,
    host_num_blocks: int | None = None, **kwargs
) -> float:
    """Requests of max_model_len the pool holds at once: every group draws its
    blocks from the one pool, so a request costs the sum over groups; groups
    in HiSparse's host pool bound it by that pool's blocks as well."""
    device = sum(pages_per_request(g, max_model_len, **kwargs)
                 for g in groups if not g.host_resident)
    host = sum(pages_per_request(g, max_model_len, **kwargs)
               for g in groups if g.host_resident)
    bound = num_blocks / device
    if host:
        if host_num_blocks is None:
            raise AssertionError("host-resident groups but no HiSparse host pool size")
        bound = min(bound, host_num_blocks / host)
    return bound


def get_kv_cache_capacity(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, max_model_len: int,
    host_num_blocks: int | None = None, **kwargs
) -> tuple[int, float]:
    """(tokens, concurrency): the group-aware token capacity vLLM logs."""
    concurrency = get_max_concurrency(groups, num_blocks, max_model_len, host_num_blocks,
                                      **kwargs)
    return int(concurrency * max_model_len), concurrency
