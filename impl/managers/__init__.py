"""One single-type manager per attention kind, and which spec gets which."""

from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
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
