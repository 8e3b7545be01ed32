"""One single-type manager per attention kind, and which spec gets which."""

from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
    KVCacheSpec,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from impl.managers.base import SingleTypeKVCacheManager
from impl.managers.chunked_local import ChunkedLocalAttentionManager
from impl.managers.circular_buffer import CircularBufferManager
from impl.managers.cross_attention import CrossAttentionManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.hisparse import (
    HiSparseHotManager,
    HiSparseResidentManager,
    HiSparseSourceManager,
)
from impl.managers.mamba import MambaManager
from impl.managers.rswa import RSWAManager
from impl.managers.sink_full_attention import SinkFullAttentionManager
from impl.managers.sliding_window import SlidingWindowManager
from impl.math_utils import cdiv

# Looked up along the spec's class hierarchy, most specific first: an MLA
# spec is a FullAttentionSpec and is kept like one.
_BY_SPEC: dict[type, type[SingleTypeKVCacheManager]] = {
    SinkFullAttentionSpec: SinkFullAttentionManager,
    RSWASpec: RSWAManager,
    CircularBufferSpec: CircularBufferManager,
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
    HiSparseResidentSpec: HiSparseResidentManager,
    HiSparseHotSpec: HiSparseHotManager,
}
# A group's role, where it picks the manager before the spec does.
_BY_ROLE: dict[KVCacheGroupRole, type[SingleTypeKVCacheManager]] = {
    KVCacheGroupRole.HISPARSE_SOURCE: HiSparseSourceManager,
}


def manager_class_for(spec: KVCacheSpec, role: KVCacheGroupRole | None = None
                      ) -> type[SingleTypeKVCacheManager]:
    if role in _BY_ROLE:
        return _BY_ROLE[role]
    for kind in type(spec).__mro__:
        if kind in _BY_SPEC:
            return _BY_SPEC[kind]
    raise NotImplementedError(f"no manager keeps a {type(spec).__name__}")


def max_admission_blocks_per_request(
    spec: KVCacheSpec, max_in_flight_tokens: int, max_model_len: int
) -> int | None:
    """The most blocks one request of a recycling kind holds at a time (what
    full_sequence_must_fit admits by); None for kinds that keep every block
    until the request ends."""
    if isinstance(spec, SlidingWindowSpec):
        # The window behind the last computed token plus what is in flight;
        # one more since the window need not start on a block boundary.
        span = spec.sliding_window - 1 + spec.extra_retained_tokens + max_in_flight_tokens
        return cdiv(min(span, max_model_len), spec.block_size) + 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        span = spec.attention_chunk_size + max_in_flight_tokens
        return cdiv(min(span, max_model_len), spec.block_size)
    if isinstance(spec, HiSparseResidentSpec):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None
