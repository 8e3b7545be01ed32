"""How one layer stores its KV cache, and the groups of layers that share a
block table; specs/KV_CACHE_MANAGER.md §12.

Layers with equal specs form a KV cache group, served by one single-type
manager over the shared pool. Specs are data only: which manager keeps a
spec is impl/managers, how many bytes its page takes is impl/kv_cache_sizing.

The class names and the hierarchy are vLLM's (vllm.v1.kv_cache_interface):
the hybrid coordinator orders every full-attention kind first and the
manager registry walks a spec's bases, so MLA and sink attention must be
FullAttentionSpecs.
"""

import re
from dataclasses import dataclass, field

_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _kind_of(class_name: str) -> str:
    """KV events name a group's kind after its spec class, in snake case:
    ChunkedLocalAttentionSpec -> chunked_local_attention, MLAAttentionSpec ->
    mla_attention."""
    return _WORD_START.sub("_", class_name.removesuffix("Spec")).lower()


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    block_size: int

    # What BlockStored events carry as `kv_cache_spec_kind` for the group.
    kind = "unknown"
    # Whether decode context parallelism spreads a block's token positions
    # over the ranks (a block then spans block_size x dcp tokens): yes for
    # attention KV, no for replicated state.
    dcp_sharded = False
    # Whether the group takes part in prefix caching at all.
    prefix_cacheable = True

    def __init_subclass__(cls) -> None:
        # (No super() call: slotted dataclasses are rebuilt, which breaks
        # the zero-argument form, and object's hook does nothing.)
        cls.kind = _kind_of(cls.__name__)

    @property
    def sliding_window_of_events(self) -> int | None:
        """`kv_cache_spec_sliding_window` of the group's BlockStored events."""
        return None


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1  # on this tensor-parallel rank
    head_size: int = 1  # elements per head (of K; see head_size_v)
    dtype_size: int = 4  # bytes per element of the cache dtype: 2 for bf16, 1 for fp8
    head_size_v: int | None = None  # where V's head size is not K's
    page_size_padded: int | None = None  # a hybrid model's pages padded to its largest
    # False: every DCP rank keeps the whole KV (a draft model beside a
    # sharded target), so a block spans only its own block size.
    dcp_sharded: bool = field(default=True, kw_only=True)

    @property
    def v_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    # A local-attention layer kept as full attention (hybrid allocator off)
    # carries its window or chunk: it shapes the compute, not the cache.
    sliding_window: int | None = None  # tokens a query reads back
    attention_chunk_size: int | None = None  # tokens per local chunk


@dataclass(frozen=True, slots=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent per token and no V
    (num_kv_heads 1, head_size the latent width, e.g. 512 + 64)."""

    @property
    def v_head_size(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    sink_len: int | None = None  # leading tokens every query reads; whole blocks


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0
    extra_retained_tokens: int = 0  # kept below the window, unread (speculation)

    @property
    def sliding_window_of_events(self) -> int | None:
        return self.sliding_window


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int = 0


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec(AttentionSpec):
    """Decoder layers reading the encoder's output (Whisper): blocks for the
    encoder tokens, taken once at admission, never shared."""


@dataclass(frozen=True, slots=True)
class MambaSpec(KVCacheSpec):
    """A state-space layer: one fixed-size state per block whatever the
    block size. Cache mode "none" keeps one running state per request
    (prefix caching off); "align" a state at every block boundary a chunk
    ends on (prefix caching on)."""

    shapes: tuple[tuple[int, ...], ...] = ()  # of its state tensors (conv, ssm)
    dtype_sizes: tuple[int, ...] = ()  # bytes per element of each
    page_size_padded: int | None = None  # a hybrid model's pages padded to its largest
    mamba_cache_mode: str = "none"  # or "align"
    num_speculative_blocks: int = 0  # room for draft tokens' states


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    # Holds an EAGLE / MTP drafter's layers (specs/KV_CACHE_MANAGER.md §15).
    is_eagle_group: bool = False


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = field(default_factory=tuple)
    # The worker zeroes new attention blocks before use (Mamba layers or
    # mixed precisions), so managers record the ids they hand out (§16.4).
    needs_kv_cache_zeroing: bool = False
