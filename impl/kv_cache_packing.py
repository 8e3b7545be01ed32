"""Packed KV cache groups for block-outermost layouts (vLLM:
_get_packed_kv_cache_groups); specs/KV_CACHE_MANAGER.md §12.3 step 5.

When blocks are the outermost axis, one block holds a page of every layer of
a group side by side, so pages need not share a size. Layers are bucketed by
kind (one uniform type a bucket). A bucket whose page sizes each have the
same layer count is a repeated pattern (DeepSeek V4: an MLA page and an
indexer page per layer); those are cut into groups of whole pattern repeats,
the repeat count per group chosen to waste the least padding. Buckets of
per-request state (Mamba, circular buffers) are cut so their states fit in
the block the attention groups already need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from impl.kv_cache_layout import block_outermost
from impl.kv_cache_spec import CircularBufferSpec, KVCacheGroupSpec, KVCacheSpec, MambaSpec
from impl.kv_cache_spec import SlidingWindowSpec as _Window
from impl.math_utils import cdiv
from impl.uniform_type_spec import UniformTypeKVCacheSpecs, is_uniform_type


def approximate_gcd(values: Sequence[int], lower_bound: int | None = None) -> int:
    """The divisor d in [lower_bound, max(values)] that pads the values least
    when each is rounded up to a multiple of d; ties go to the larger d."""
    if not values:
        raise ValueError("approximate_gcd of no values")
    if min(values) <= 0:
        raise ValueError(f"approximate_gcd needs positive values, got {list(values)}")
    low = max(1, lower_bound or 1)
    high = max(values)
    if low > high:
        return low
    best, best_waste = low, None
    for d in range(low, high + 1):
        waste = sum(-v % d for v in values)
        if best_waste is None or waste <= best_waste:
            best, best_waste = d, waste
    return best


class _Bucket:
    """Layers of one uniform type, with their names per page size."""

    __slots__ = ("spec", "by_page", "balanced")

    def __init__(self, specs: dict[str, KVCacheSpec]) -> None:
        self.spec = UniformTypeKVCacheSpecs.from_specs(specs)
        assert self.spec is not None
        self.by_page: dict[int, list[str]] = defaultdict(list)
        for name, spec in specs.items():
            self.by_page[spec.page_size_bytes].append(name)
        # One layer of each page size per repeat: a pattern that can be cut.
        self.balanced = len({len(names) for names in self.by_page.values()}) == 1

    @property
    def repeats(self) -> int:
        return self.spec.get_max_layers_per_page_size()

    def holds_state(self, nothing_cut: bool) -> bool:
        """Per-request state a group can hold one layer of (a sliding window
        counts when no pattern is cut)."""
        first = self.spec.first_spec
        return isinstance(first, (MambaSpec, CircularBufferSpec)) or (
            nothing_cut and isinstance(first, _Window))

    def widest_group_bytes(self, num_groups: int) -> int:
        return sum(cdiv(len(names), num_groups) * page for page, names in self.by_page.items())


def get_packed_kv_cache_groups(specs: Mapping[str, KVCacheSpec],
                               layout: str) -> list[KVCacheGroupSpec] | None:
    """Groups of layers packed side by side in each block; None when the
    layout does not put blocks outermost or every page has one size."""
    if not block_outermost(layout) or len({s.page_size_bytes for s in specs.values()}) <= 1:
        return None
    members: list[dict[str, KVCacheSpec]] = []
    for name, spec in specs.items():
        home = next((m for m in members if is_uniform_type({**m, name: spec})), None)
        if home is None:
            members.append({name: spec})
        else:
            home[name] = spec
    buckets = [_Bucket(m) for m in members]
    # A balanced bucket mixing page sizes must stay whole: its repeats are
    # the least a group may hold.
    floor = max((b.repeats for b in buckets if b.balanced and len(b.by_page) > 1), default=0)
    per_group = None
    if floor:
        per_group = approximate_gcd([b.repeats for b in buckets if b.balanced], floor)

    def pattern_groups(bucket: _Bucket) -> int:
        return cdiv(bucket.repeats, per_group) if bucket.balanced and per_group else 1

    nothing_cut = per_group is None
    anchor = max((b.widest_group_bytes(len(b.spec.kv_cache_specs)
                                       if b.holds_state(nothing_cut) else pattern_groups(b))
                  for b in buckets), default=0)
    groups: list[KVCacheGroupSpec] = []
    for bucket in buckets:
        count = pattern_groups(bucket)
        if anchor and bucket.holds_state(nothing_cut):
            # As many states a group as fit in the block the others need.
            fits = max(anchor // bucket.spec.first_spec.page_size_bytes, 1)
            count = max(count, cdiv(len(bucket.spec.kv_cache_specs), fits))
        layers = bucket.spec.kv_cache_specs
        if count == 1:
            groups.append(KVCacheGroupSpec(tuple(layers), bucket.spec))
            continue
        repeats = list(zip(*bucket.by_page.values()))
        for i in range(count):
            names = [name for repeat in repeats[i::count] for name in repeat]
            spec = UniformTypeKVCacheSpecs.from_specs({n: layers[n] for n in names})
            assert spec is not None
            groups.append(KVCacheGroupSpec(tuple(names), spec))
    return groups
