"""Cross attention (vLLM: CrossAttentionManager; encoder-decoder models such as
Whisper).

Decoder layers attend to the encoder's output, which is unique to the request:
its blocks are sized by the encoder tokens (the coordinator hands this manager
`num_encoder_tokens` instead of the decoder's token count), allocated once at
admission and never shared, so nothing is cached or looked up.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.managers.base import SingleTypeKVCacheManager
from impl.request import Request


class CrossAttentionManager(SingleTypeKVCacheManager):
    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        assert not new_computed_blocks, "cross-attention blocks are never prefix hits"

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        return None

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        raise ValueError("Should not be called as prefix caching is disabled.")

    @classmethod
    def find_longest_cache_hit(cls, *args, **kwargs):
        raise NotImplementedError("CrossAttentionManager does not support caching")
