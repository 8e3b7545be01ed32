"""Full attention with attention sinks (vLLM: SinkFullAttentionManager).

Managed as full attention. `sink_len` must be a whole number of blocks; 0.17
also set that many blocks aside for the sink tokens when the manager was built,
taking them out of the free queue for good (profile.sink_blocks_reserved).
"""

from __future__ import annotations

from impl.kv_cache_spec import SinkFullAttentionSpec
from impl.managers.full_attention import FullAttentionManager


class SinkFullAttentionManager(FullAttentionManager):
    def __init__(self, kv_cache_spec: SinkFullAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        sink_len = kv_cache_spec.sink_len
        if not (sink_len and sink_len > 0 and sink_len % self.block_size == 0):
            raise AssertionError(
                f"sink_len {sink_len} must be a positive multiple of the block size "
                f"{self.block_size}"
            )
        self.sink_blocks = []
        if self.block_pool.profile.sink_blocks_reserved:
            self.sink_blocks = self.block_pool.free_block_queue.popleft_n(
                sink_len // self.block_size
            )
