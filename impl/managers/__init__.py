"""Single-type KV cache managers, one per attention kind."""

from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from impl.managers.base import SingleTypeKVCacheManager
from impl.managers.chunked_local import ChunkedLocalAttentionManager
from impl.managers.cross_attention import CrossAttentionManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.mamba import MambaManager
from impl.managers.sink_full_attention import SinkFullAttentionManager
from impl.managers.sliding_window import SlidingWindowManager

# Resolved through the spec's MRO, as vLLM's registry does: MLA attention is a
# FullAttentionSpec and gets the full-attention manager.
_MANAGER_FOR_SPEC: dict[type[KVCacheSpec], type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SinkFullAttentionSpec: SinkFullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def manager_class_for(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    for cls in type(spec).__mro__:
        manager = _MANAGER_FOR_SPEC.get(cls)
        if manager is not None:
            return manager
    raise NotImplementedError(f"no manager for {type(spec).__name__}")


def max_admission_blocks_per_request(
    spec: KVCacheSpec, max_in_flight_tokens: int, max_model_len: int
) -> int | None:
    """The most blocks a request of a recycling kind holds at once (vLLM's
    SlidingWindowSpec / ChunkedLocalAttentionSpec.max_admission_blocks_per_request);
    None for kinds that keep every block until the request finishes."""
    if isinstance(spec, SlidingWindowSpec):
        # The last window - 1 computed tokens plus what is in flight; +1 as the
        # window need not start at a block boundary.
        n = min(spec.sliding_window - 1 + spec.extra_retained_tokens + max_in_flight_tokens,
                max_model_len)
        return -(-n // spec.block_size) + 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        n = min(spec.attention_chunk_size + max_in_flight_tokens, max_model_len)
        return -(-n // spec.block_size)
    return None


__all__ = ["manager_class_for", "max_admission_blocks_per_request", "SingleTypeKVCacheManager"]
