"""One group's spec for layers of one kind whose pages differ in size
(vLLM's UniformTypeKVCacheSpecs), and which layers count as one kind;
specs/KV_CACHE_MANAGER.md §12.2.

Below the sizing and the packing of groups (impl/kv_cache_sizing.py,
impl/kv_cache_packing.py), which both build these.
"""

import collections
from collections.abc import Mapping
from dataclasses import dataclass

from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)


@dataclass(slots=True)
class UniformTypeKVCacheSpecs:
    """Layers of one kind (the same token slots) with different page sizes:
    one group, one block table, a page per layer each its own size."""

    block_size: int
    kv_cache_specs: dict[str, KVCacheSpec]  # layer name -> its own spec

    @property
    def first_spec(self) -> KVCacheSpec:
        return next(iter(self.kv_cache_specs.values()))

    @property
    def dcp_sharded(self) -> bool:
        return bool(self.kv_cache_specs) and self.first_spec.dcp_sharded

    @property
    def prefix_cacheable(self) -> bool:
        return all(s.prefix_cacheable for s in self.kv_cache_specs.values())

    # Its layers are viewed one by one, as any spec's.
    has_layer_views = True
    # vLLM leaves a uniform-type group's table whole when it cuts tables to
    # the computed tokens, and counts its keyed prefix if every layer is
    # prefix cacheable (spec §16.10).
    clipped_to_computed_tokens = False
    # vLLM's encoder checks test the group's spec class, which this is not.
    reads_encoder_tokens = False

    @property
    def counts_cached_tokens(self) -> bool:
        return self.prefix_cacheable

    @property
    def uses_slot_mapping(self) -> bool:
        return self.first_spec.uses_slot_mapping

    @property
    def page_size_bytes(self) -> int:
        """A block holds a page of every layer."""
        return sum(s.page_size_bytes for s in self.kv_cache_specs.values())

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> None:
        """No admission cap: no recycling kind is grouped this way."""
        return None

    @property
    def kind(self) -> str:
        """What the group's events call it: its layers' one kind; if they
        differ but are all full attention, full attention; else unknown."""
        kinds = {s.kind for s in self.kv_cache_specs.values()}
        if len(kinds) == 1:
            return kinds.pop()
        if all(_uniform_base(s) is FullAttentionSpec for s in self.kv_cache_specs.values()):
            return "full_attention"
        return "unknown"

    @property
    def sliding_window_of_events(self) -> int | None:
        windows = {s.sliding_window_of_events for s in self.kv_cache_specs.values()}
        return windows.pop() if len(windows) == 1 else None

    def get_max_layers_per_page_size(self) -> int:
        """The most layers sharing one page size (a balanced bucket's count
        of pattern repeats)."""
        counts = collections.Counter(s.page_size_bytes for s in self.kv_cache_specs.values())
        return max(counts.values())

    @classmethod
    def is_uniform_type(cls, specs: Mapping[str, KVCacheSpec]) -> bool:
        return is_uniform_type(specs)

    @classmethod
    def from_specs(cls, specs: Mapping[str, KVCacheSpec]) -> "UniformTypeKVCacheSpecs | None":
        if not is_uniform_type(specs):
            return None
        return cls(next(iter(specs.values())).block_size, dict(specs))


def iter_layer_specs(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> tuple[KVCacheSpec, ...]:
    """The per-layer specs a group's spec stands for."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return tuple(spec.kv_cache_specs.values())
    return (spec,)


def is_full_attention_spec(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> bool:
    """Whether every layer of a group is full attention (a stable slot per
    token); an empty uniform-type group is not."""
    layers = iter_layer_specs(spec)
    return bool(layers) and all(isinstance(s, FullAttentionSpec) for s in layers)


def _uniform_base(spec: KVCacheSpec) -> type:
    """The kind a spec groups with (vLLM's registered uniform_type_base_spec)."""
    for base in (FullAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec,
                 ChunkedLocalAttentionSpec, MambaSpec, CrossAttentionSpec, CircularBufferSpec):
        if isinstance(spec, base):
            return base
    return type(spec)


def _mamba_uniform_key(spec: MambaSpec) -> tuple:
    return (spec.num_speculative_blocks, spec.num_prefill_checkpoint_blocks,
            spec.prefill_checkpoint_alignment, spec.page_size_bytes)


def is_uniform_type(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether all layers need the same token slots (one group, one table)."""
    values = list(specs.values())
    if len({s.block_size for s in values}) > 1 or len({s.dcp_sharded for s in values}) > 1:
        return False
    first = values[0]
    if isinstance(first, SlidingWindowMLASpec):
        return all(isinstance(s, SlidingWindowMLASpec) and s.sliding_window == first.sliding_window
                   for s in values)
    if isinstance(first, SlidingWindowSpec):
        return all(isinstance(s, SlidingWindowSpec) and s.sliding_window == first.sliding_window
                   for s in values)
    if isinstance(first, ChunkedLocalAttentionSpec):
        return all(isinstance(s, ChunkedLocalAttentionSpec)
                   and s.attention_chunk_size == first.attention_chunk_size for s in values)
    if isinstance(first, MambaSpec):
        key = _mamba_uniform_key(first)
        return all(isinstance(s, MambaSpec) and _mamba_uniform_key(s) == key for s in values)
    base = _uniform_base(first)
    return all(isinstance(s, base) for s in values)
