"""Full attention with attention sinks (vLLM's name: SinkFullAttentionManager); spec §9.6.

Kept as full attention. The first `sink_len` tokens, read by every query,
must fill whole blocks. 0.17 also set that many blocks aside when the manager
was built, out of the free queue for good (profile.sink_blocks_reserved).
"""

from impl.kv_cache_spec import SinkFullAttentionSpec
from impl.managers.full_attention import FullAttentionManager


class SinkFullAttentionManager(FullAttentionManager):
    def __init__(self, kv_cache_spec: SinkFullAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        if not self._profile.sink_groups_buildable:
            # 0.23-0.25 build every manager with an argument this one lacks.
            raise TypeError("this release cannot build a sink-attention group")
        sink = kv_cache_spec.sink_len
        if not sink or sink < 0 or sink % self.block_size:
            raise AssertionError(f"{sink} sink tokens do not fill whole "
                                 f"{self.block_size}-token blocks")
        self.sink_blocks = []
        if self._profile.sink_blocks_reserved:
            self.sink_blocks = self.block_pool.free_block_queue.popleft_n(
                sink // self.block_size)
