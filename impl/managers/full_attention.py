"""Full attention (vLLM: FullAttentionManager): every token stays readable, so a
prefix hit is the longest run of cached blocks from the start of the prompt."""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.managers.base import SingleTypeKVCacheManager


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
        dcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        block_size = kv_cache_spec.block_size * dcp_world_size
        if block_size != block_pool.hash_block_size:
            raise NotImplementedError("hash_block_size != block_size is not implemented yet")
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        num_candidates = min(max_length // block_size, len(block_hashes))
        # Hashes are chained, so the first miss ends the hit.
        if len(kv_cache_group_ids) == 1:
            # One group: probe the map directly (every lookup walks this loop).
            get_one = block_pool.cached_block_hash_to_block.get_one_block
            suffix = kv_cache_group_ids[0].to_bytes(4, "big")
            hit = computed[0]
            for i in range(num_candidates):
                block = get_one(block_hashes[i] + suffix)
                if block is None:
                    break
                hit.append(block)
        else:
            get_cached = block_pool.get_cached_block
            for i in range(num_candidates):
                cached = get_cached(block_hashes[i], kv_cache_group_ids)
                if cached is None:
                    break
                for blocks, block in zip(computed, cached):
                    blocks.append(block)
        hit_length = len(computed[0]) * block_size
        hit_length -= hit_length % alignment_tokens
        num_blocks = -(-hit_length // block_size)
        for blocks in computed:
            del blocks[num_blocks:]
        return computed, hit_length
