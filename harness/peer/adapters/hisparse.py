"""vLLM's HiSparse coordinator (vllm.v1.hisparse.coordinator) over impl's
(impl.hisparse.coordinator): `get_hisparse_coordinator(manager)` and the
coordinator as tests and vLLM's HiSparse connector call it. Answers are
impl's objects with vLLM's field names; only the host copy-on-write copies
are turned into vLLM's KVCacheBlockCopy, as the manager adapter does."""

from __future__ import annotations

from harness.peer.adapters import manager as _manager  # noqa: F401  (registers the manager adapters)
from harness.peer.adapters.base import Adapter, register, unwrap, wrap
from impl.hisparse import coordinator as icoord


@register(icoord.HiSparseCoordinator)
class HiSparseCoordinator(Adapter):
    def take_host_block_copies(self):
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

        return tuple(KVCacheBlockCopy(src_block_id=c.src_block_id, dst_block_id=c.dst_block_id)
                     for c in unwrap(self).take_host_block_copies())

    def free(self, request_id):
        # impl's name for it: forget_request.
        unwrap(self).forget_request(request_id)


def get_hisparse_coordinator(kv_cache_manager):
    return wrap(icoord.get_hisparse_coordinator(unwrap(kv_cache_manager)))
