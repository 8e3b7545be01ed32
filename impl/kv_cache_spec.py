"""KV cache specs and the KV cache config (vLLM: vllm.v1.kv_cache_interface).

A spec says how one layer stores its KV cache; layers with equal specs form a KV
cache group, and each group gets one single-type manager over the shared pool.
Specs are plain data: which manager serves a spec is in impl/managers, how many
bytes a page takes is in impl/kv_cache_sizing.py.

The class tree mirrors vLLM's on purpose: the hybrid coordinator puts every
FullAttentionSpec (MLA and sink attention included) first, and the manager
registry resolves a spec through its MRO.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    block_size: int

    # The `kv_cache_spec_kind` that BlockStored events carry for this group.
    kind = "unknown"

    @property
    def dcp_sharded(self) -> bool:
        """Whether decode context parallelism splits this cache's token
        positions across ranks (so a block holds block_size * dcp tokens)."""
        return False

    @property
    def prefix_cacheable(self) -> bool:
        return True

    @property
    def sliding_window_of_events(self) -> int | None:
        """The `kv_cache_spec_sliding_window` BlockStored events carry."""
        return None


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 1
    # Bytes of one element of the cache dtype (bf16: 2, fp8: 1).
    dtype_size: int = 4
    # V head size when it differs from K's (None: the same).
    head_size_v: int | None = None
    # A page padded to this many bytes (hybrid models unify page sizes).
    page_size_padded: int | None = None

    @property
    def dcp_sharded(self) -> bool:
        return True

    @property
    def v_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    # Set when the hybrid allocator is off and local-attention layers are
    # managed as full attention (compute still windowed).
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    kind = "full_attention"


@dataclass(frozen=True, slots=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent vector a token, no separate V
    (num_kv_heads is 1 and head_size the latent width, e.g. 512 + 64)."""

    kind = "mla_attention"

    @property
    def v_head_size(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    # Leading sink tokens every query attends to; a multiple of block_size.
    sink_len: int | None = None

    kind = "sink_full_attention"


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0
    # Trailing tokens kept below the window for multi-module speculative decode.
    extra_retained_tokens: int = 0

    kind = "sliding_window"

    @property
    def sliding_window_of_events(self) -> int | None:
        return self.sliding_window


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int = 0

    kind = "chunked_local_attention"


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec(AttentionSpec):
    """Decoder layers attending to the encoder's output (Whisper): blocks for
    the encoder tokens, allocated once at admission, never prefix cached."""

    kind = "cross_attention"


@dataclass(frozen=True, slots=True)
class MambaSpec(KVCacheSpec):
    """A state-space layer: one fixed-size state per block, whatever its
    block size. `shapes`/`dtype_sizes` describe the state tensors (conv, ssm)."""

    shapes: tuple[tuple[int, ...], ...] = ()
    dtype_sizes: tuple[int, ...] = ()
    page_size_padded: int | None = None
    # "none": one running state a request (prefix caching off); "align": a state
    # at every block boundary the scheduler stops at (prefix caching on).
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    kind = "mamba"


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = field(default_factory=tuple)
