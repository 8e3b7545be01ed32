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
from impl.managers.base import SingleTypeKVCacheManager  # noqa: F401
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
from impl.managers.registry import (
    manager_class_for as manager_class_for,
)
from impl.managers.registry import (
    register_manager,
    register_role_manager,
)
from impl.managers.rswa import RSWAManager
from impl.managers.sink_full_attention import SinkFullAttentionManager
from impl.managers.sliding_window import SlidingWindowManager
from impl.math_utils import cdiv

for _spec, _manager in (
    (SinkFullAttentionSpec, SinkFullAttentionManager),
    (RSWASpec, RSWAManager),
    (CircularBufferSpec, CircularBufferManager),
    (FullAttentionSpec, FullAttentionManager),
    (SlidingWindowSpec, SlidingWindowManager),
    (ChunkedLocalAttentionSpec, ChunkedLocalAttentionManager),
    (MambaSpec, MambaManager),
    (CrossAttentionSpec, CrossAttentionManager),
    (HiSparseResidentSpec, HiSparseResidentManager),
    (HiSparseHotSpec, HiSparseHotManager),
):
    register_manager(_spec, _manager)
register_role_manager(KVCacheGroupRole.HISPARSE_SOURCE, HiSparseSourceManager)

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
