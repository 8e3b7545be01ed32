"""How one layer stores its KV cache, and the groups of layers that share a
block table; specs/KV_CACHE_MANAGER.md §12.

Layers with equal specs form a KV cache group, served by one single-type
manager over the shared pool. A spec answers the facts of one layer, as
vLLM's do: the bytes its page takes, the blocks a request of a recycling
kind holds at most, how the manager's reads treat its groups. Which manager
keeps a spec is impl/managers; grouping and sizing over many layers is
impl/kv_cache_sizing. Nothing here imports either.

The class names and the hierarchy are vLLM's (vllm.v1.kv_cache_interface):
the hybrid coordinator orders every full-attention kind first and the
manager registry walks a spec's bases, so MLA and sink attention must be
FullAttentionSpecs.
"""

import fractions
import re
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from math import prod

from impl.math_utils import cdiv

_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _kind_of(class_name: str) -> str:
    """KV events name a group's kind after its spec class, in snake case:
    ChunkedLocalAttentionSpec -> chunked_local_attention, MLAAttentionSpec ->
    mla_attention."""
    return _WORD_START.sub("_", class_name.removesuffix("Spec")).lower()


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    block_size: int
    _: KW_ONLY
    # Bytes the distance between two blocks of this layer must be a multiple
    # of (a kernel re-pages the cache in units of it); None: any.
    block_stride_alignment: int | None = None

    # What BlockStored events carry as `kv_cache_spec_kind` for the group.
    kind = "unknown"
    # Whether decode context parallelism spreads a block's token positions
    # over the ranks (a block then spans block_size x dcp tokens): yes for
    # attention KV, no for replicated state.
    dcp_sharded = False
    # Whether the group takes part in prefix caching at all.
    prefix_cacheable = True
    # Whether the worker views each layer's pages through the generic
    # [blocks, heads, states, bytes] view (False: the spec lays out its own
    # raw region, and has no attention backend to pick a layout for).
    has_layer_views = True
    # Whether the worker writes a slot per token for it (False: the spec
    # addresses its own pages).
    uses_slot_mapping = True
    # Whether block i of a request's table holds its tokens [i*bs, (i+1)*bs)
    # (attention), rather than per-request state or a region moved whole;
    # the facade cuts such tables to the computed tokens (spec §16.10).
    token_blocks = False
    # Whether the blocks hold the encoder's tokens, not the request's own
    # (cross attention; vLLM's encoder-only attention): neither cut to the
    # request's computed tokens nor counted as its cached prefix.
    reads_encoder_tokens = False
    # Bytes a page is padded to (a hybrid model's pages padded to its
    # largest); kinds that can be padded have it as a field.
    page_size_padded = None

    def __init_subclass__(cls) -> None:
        # (No super() call: slotted dataclasses are rebuilt, which breaks
        # the zero-argument form, and object's hook does nothing.) A kind
        # named in the class body wins: vLLM's events have no kind of their
        # own for some specs (R-SWA is full attention to them).
        if "kind" not in cls.__dict__:
            cls.kind = _kind_of(cls.__name__)

    @property
    def sliding_window_of_events(self) -> int | None:
        """`kv_cache_spec_sliding_window` of the group's BlockStored events."""
        return None

    @property
    def clipped_to_computed_tokens(self) -> bool:
        """get_block_ids_for_computed_tokens cuts the group's ids to the
        blocks the computed tokens occupy."""
        return self.token_blocks and not self.reads_encoder_tokens

    @property
    def counts_cached_tokens(self) -> bool:
        """estimate_cached_tokens reads the group's keyed prefix."""
        return self.prefix_cacheable and not self.reads_encoder_tokens

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of one block's content, before any padding."""
        raise NotImplementedError(f"no page size for {type(self).__name__}")

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block of this layer takes: the padding where set, never
        below the content."""
        content, padded = self.real_page_size_bytes, self.page_size_padded
        if padded is None:
            return content
        if padded < content:
            raise AssertionError(f"a page padded to {padded} bytes is smaller than "
                                 f"its {content} bytes of content")
        return padded

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int | None:
        """The most blocks one request of a recycling kind holds at a time
        (what full_sequence_must_fit admits by, and what sizing reserves);
        None for kinds that keep every block until the request ends."""
        return None


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1  # on this tensor-parallel rank
    head_size: int = 1  # elements per head (of K; see head_size_v)
    dtype_size: int = 4  # bytes per element of the cache dtype: 2 for bf16, 1 for fp8
    head_size_v: int | None = None  # where V's head size is not K's
    page_size_padded: int | None = None  # a hybrid model's pages padded to its largest
    _: KW_ONLY
    # Only labels the cache's quantization (vLLM's KVQuantMode value); what
    # it does to the page arrives as state_content_bytes.
    kv_quant_mode: int = 0
    # Distinct shards the cache has across tensor-parallel ranks; ranks
    # beyond that hold copies. None: unknown (counted as no copies).
    max_tp_shards: int | None = None  # e.g. 1 for MLA's single latent head
    # A page is a [heads, states, content] grid. A backend packing it its own
    # way publishes the heads and the bytes of one cell; None: one head per
    # KV head, and K then V of one token in a cell.
    num_head_slots: int | None = None  # heads of the grid
    state_content_bytes: int | None = None  # bytes of one cell
    # Tokens one stored state covers: k > 1 compresses k tokens into a state,
    # Fraction(1, k) stores k states per token, <= 0 one state a block.
    tokens_per_state: int | fractions.Fraction = 1
    # False: every DCP rank keeps the whole KV (a draft model beside a
    # sharded target), so a block spans only its own block size.
    dcp_sharded: bool = True
    # Names the element type where the byte size does not tell it apart
    # (bf16 / fp16); a label only, outside equality (§16.4 reads it).
    dtype_label: str | None = field(default=None, compare=False)

    token_blocks = True  # a slot per token of the sequence, block after block

    @property
    def v_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    # A page is a [heads, states, content] grid (vLLM's names for its sides).
    @property
    def num_heads(self) -> int:
        """Rows of the page grid: the backend's head slots, else one a KV head."""
        return self.num_kv_heads if self.num_head_slots is None else self.num_head_slots

    def get_num_kernel_states(self, block_size: int) -> int:
        """Stored states in a block of `block_size` tokens (a kernel's block
        may be smaller than the spec's)."""
        per_state = self.tokens_per_state
        return int(block_size // per_state) if per_state > 0 else 1

    @property
    def num_states(self) -> int:
        """Stored states in one of the spec's own blocks."""
        return self.get_num_kernel_states(self.block_size)

    @property
    def state_content_size_bytes(self) -> int:
        """Bytes of one (head, state) cell: K then V of a token unless packed."""
        packed = self.state_content_bytes
        return (self.head_size + self.v_head_size) * self.dtype_size if packed is None else packed

    @property
    def real_page_size_bytes(self) -> int:
        cells = self.num_heads * self.num_states
        return cells * self.state_content_size_bytes


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    # A local-attention layer kept as full attention (hybrid allocator off)
    # carries its window or chunk: it shapes the compute, not the cache.
    sliding_window: int | None = None  # tokens a query reads back
    attention_chunk_size: int | None = None  # tokens per local chunk


def _pad_to_alignment(spec) -> None:
    """MLA pages padded up to a multiple of the spec's `alignment` (DeepSeek
    V4 kernels), recorded as the spec's padded page as vLLM records it."""
    if spec.alignment is None:
        return
    raw = spec.real_page_size_bytes
    rounded = -(-raw // spec.alignment) * spec.alignment
    if rounded != raw:
        object.__setattr__(spec, "page_size_padded", rounded)


@dataclass(frozen=True, slots=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent per token and no V
    (num_kv_heads 1, head_size the latent width, e.g. 512 + 64). Sparse MLA
    models have a second MLA cache per layer, the indexer's keys."""

    _: KW_ONLY
    cache_dtype_str: str | None = None  # the cache format, e.g. "fp8_ds_mla"
    alignment: int | None = None  # pad the page to a multiple of this many bytes
    model_version: str | None = None  # e.g. "deepseek_v4"
    cache_role: str = "sparse"  # or "indexer": a sparse-attention indexer's keys
    is_index_group_leader: bool = False  # the layer whose indexer its peers share

    def __post_init__(self) -> None:
        _pad_to_alignment(self)

    @property
    def v_head_size(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """A layer that only stores hidden states for a connector to read back
    (vLLM's extract_hidden_states): one block table of its own, never
    grouped with attention layers."""

    kind = "mla_attention"


@dataclass(frozen=True, slots=True)
class RSWASpec(FullAttentionSpec):
    """Reference sliding window: the prompt stays readable, decoded tokens
    are read `rswa_window` back; the gap between the two is given back."""

    _: KW_ONLY
    rswa_window: int = 0

    kind = "full_attention"


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

    @property
    def retained_tokens(self) -> int:
        """Tokens below a request's first scheduled position that must stay
        readable: the window behind it and the extra kept for speculation."""
        return self.sliding_window - 1 + self.extra_retained_tokens

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int:
        # The window behind the last computed token plus what is in flight;
        # one more since the window need not start on a block boundary.
        span = self.retained_tokens + max_in_flight_tokens
        return cdiv(min(span, max_model_len), self.block_size) + 1


@dataclass(frozen=True, slots=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """A sliding window over MLA latents (one latent a token, no V)."""

    _: KW_ONLY
    cache_dtype_str: str | None = None  # as for MLA
    alignment: int | None = None  # as for MLA
    model_version: str | None = None  # as for MLA

    def __post_init__(self) -> None:
        _pad_to_alignment(self)

    @property
    def v_head_size(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class CircularBufferSpec(AttentionSpec):
    """A ring of `block_size` raw key rows a request keeps for its whole
    life (the K-pool tail of compressed sparse attention): one block per
    request, never shared, never keyed."""

    prefix_cacheable = False
    uses_slot_mapping = False  # a ring the kernel indexes itself
    # vLLM's events have no kind for it (they never name it: nothing keyed).
    kind = "unknown"


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int = 0

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int:
        # The current chunk so far plus what is in flight.
        span = self.attention_chunk_size + max_in_flight_tokens
        return cdiv(min(span, max_model_len), self.block_size)


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec(AttentionSpec):
    """Decoder layers reading the encoder's output (Whisper): blocks for the
    encoder tokens, taken once at admission, never shared."""

    reads_encoder_tokens = True


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
    # "align" only: blocks a backend exports a state inside a prefill chunk
    # into, and the token step such an export position must keep from the
    # chunk start (None: the backend cannot export one).
    num_prefill_checkpoint_blocks: int = 0  # 0 or 1 in practice
    prefill_checkpoint_alignment: int | None = None  # tokens

    @property
    def real_page_size_bytes(self) -> int:
        """Its state tensors, whatever the block size."""
        return sum(prod(s) * d for s, d in zip(self.shapes, self.dtype_sizes))


class KVCacheGroupRole(Enum):
    """The part a group plays besides its spec (HiSparse, spec §14). The values
    are vLLM's; a group without a role is an ordinary one."""

    DEFAULT, HISPARSE_SOURCE, HISPARSE_INDEXER = "default", "hisparse_source", "hisparse_indexer"


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """Layers that share one block table, served by one single-type manager."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    # HiSparse only: the source group (its blocks are host blocks, its manager
    # publishes them once durable) and the indexer group; None elsewhere.
    role: KVCacheGroupRole | None = None
    host_resident: bool = False
    # Holds an EAGLE / MTP drafter's layers (specs/KV_CACHE_MANAGER.md §15).
    is_eagle_group: bool = False
    # Part of the KV a connector moves between instances; False for copies
    # rebuilt from another group after a load (HiSparse's resident and hot).
    enable_kv_transfer: bool = True


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """What a KV cache manager is built from: the device pool's size (null
    block included) and the groups drawing from it."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = field(default_factory=tuple)
    # Sparse checkpoints of sliding-window and Mamba groups: None keeps every
    # reachable one, 0 only replay boundaries and shared-prefix junctions, a
    # positive interval one per interval as well (spec 9.2.1).
    prefix_cache_retention_interval: int | None = None  # tokens
    # How many blocks HiSparse's host pool has, null block included; only a
    # model with a HiSparse source group has one.
    hisparse_host_num_blocks: int | None = None
    # The worker zeroes new attention blocks before use (Mamba layers or
    # mixed precisions), so managers record the ids they hand out (§16.4).
    needs_kv_cache_zeroing: bool = False

    @property
    def transfer_group_ids(self) -> tuple[int, ...]:
        """Groups whose KV a connector moves (§16.9)."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.enable_kv_transfer)

    @property
    def prefix_cacheable_group_ids(self) -> tuple[int, ...]:
        """Transferable groups whose blocks may be stored under their hashes."""
        return tuple(i for i in self.transfer_group_ids
                     if self.kv_cache_groups[i].kv_cache_spec.prefix_cacheable)

    def select_transfer_block_ids(self, block_ids):
        """A request's block ids, one list per group, cut to the transferable
        groups' lists (the lists themselves, in group order)."""
        if len(block_ids) != len(self.kv_cache_groups):
            raise ValueError(f"one block id list per KV cache group is needed: "
                             f"{len(self.kv_cache_groups)} groups, {len(block_ids)} lists")
        return tuple(block_ids[i] for i in self.transfer_group_ids)
