"""Cross attention (vLLM's name: CrossAttentionManager; encoder-decoder models
such as Whisper); specs/KV_CACHE_MANAGER.md §9.5.

The decoder attends to the encoder's output for this one request: its blocks
are sized by the encoder tokens (the coordinator passes those instead of the
decoder's count), handed out once at admission and shared with nobody. No
hit, no external load, no keying.
"""

from impl.block import BlockList
from impl.managers.base import SingleTypeKVCacheManager
from impl.request import Request


class CrossAttentionManager(SingleTypeKVCacheManager):
    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: BlockList,
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int) -> None:
        if new_computed_blocks:
            raise AssertionError("encoder output is never a prefix hit")

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int, *_) -> None:
        """Connectors do not load encoder output (nor is it zeroed for them)."""

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval=None,
                     replay_boundaries=()) -> None:
        raise ValueError("cross-attention blocks are private to their request; "
                         "nothing of them is ever keyed")

    @classmethod
    def find_longest_cache_hit(cls, *args, **kwargs):
        raise NotImplementedError("cross-attention groups have no prefix lookup")
