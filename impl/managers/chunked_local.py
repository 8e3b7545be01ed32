"""Chunked local attention (vLLM: ChunkedLocalAttentionManager; Llama 4).

Tokens attend only within their chunk of `attention_chunk_size` tokens. Blocks
of earlier chunks are freed into the null block as the request enters a new
chunk, and a prefix hit marks every block before the last chunk boundary as
computed (null) and looks up only the blocks of the current chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_hash_view import resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import ChunkedLocalAttentionSpec, KVCacheSpec
from impl.managers.base import SingleTypeKVCacheManager


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    skips_tokens = True

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
        block_size: int,
        dcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        if dcp_world_size != 1:
            raise AssertionError("DCP not support chunked local attn now.")
        block_size = kv_cache_spec.block_size
        if block_size != alignment_tokens:
            raise AssertionError(
                "KV cache groups with different block sizes are not compatible with "
                "chunked local attention now"
            )
        block_hashes = resolve_block_hashes(
            block_hashes, block_pool.hash_block_size, block_size,
            block_pool.profile.coarse_block_hash,
        )
        chunk = kv_cache_spec.attention_chunk_size
        max_num_blocks = max_length // block_size
        # Everything before the chunk of the next token is outside its window.
        window_start = max_length // chunk * chunk if max_length > 0 else 0
        first = window_start // block_size
        null = block_pool.null_block
        computed = tuple([null] * first for _ in kv_cache_group_ids)
        get_cached = block_pool.get_cached_block
        for i in range(first, max_num_blocks):
            cached = get_cached(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for blocks, block in zip(computed, cached):
                blocks.append(block)
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens of the chunks before the next token's chunk: chunk 8 with 13
        computed skips 8; with 8 computed the next token opens a chunk, so 8."""
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size
