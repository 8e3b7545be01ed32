"""Chunked local attention (vLLM's name: ChunkedLocalAttentionManager; Llama 4); spec §9.3.

The sequence is cut into chunks of `attention_chunk_size` tokens and a token
reads only its own chunk. Blocks of finished chunks are given back, and a hit
needs only the blocks of the chunk the next token falls in: everything before
that chunk counts as computed without a lookup.
"""

from collections.abc import Sequence

from impl.block_hash_view import resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.managers.base import HitResult, SingleTypeKVCacheManager


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    skips_tokens = True

    @property
    def attention_chunk_size(self) -> int:
        return self.kv_cache_spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence, max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: BlockPool,
                               kv_cache_spec: KVCacheSpec, alignment_tokens: int,
                               dcp_world_size: int = 1, pcp_world_size: int = 1, *,
                               drop_eagle_block: bool = False) -> HitResult:
        size = kv_cache_spec.block_size
        if drop_eagle_block:
            raise AssertionError("an EAGLE drafter over chunked local attention "
                                 "has no prefix hits to shorten")
        if dcp_world_size != 1:
            raise AssertionError("chunked local attention cannot be sharded across "
                                 "decode context-parallel ranks")
        if size != alignment_tokens:
            raise AssertionError(f"chunked local attention with {size}-token blocks cannot "
                                 f"hit on {alignment_tokens}-token boundaries")
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, size,
                                      block_pool.profile.coarse_block_hash)
        chunk = kv_cache_spec.attention_chunk_size
        # The chunk of the token after the hit starts here; before it nothing
        # is read, so nothing needs to be cached.
        chunk_start = max_length // chunk * chunk if max_length > 0 else 0
        first = chunk_start // size
        null = block_pool.null_block
        groups = tuple([null] * first for _ in kv_cache_group_ids)
        lookup = block_pool.get_cached_block
        for i in range(first, max_length // size):
            found = lookup(hashes[i], kv_cache_group_ids)
            if found is None:
                break
            for blocks, block in zip(groups, found):
                blocks.append(block)
        return groups, len(groups[0]) * size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The chunks before the next token's: chunk 8 and 13 computed skip 8;
        with 8 computed the next token opens a new chunk, so 8 as well."""
        chunk = self.attention_chunk_size
        return num_computed_tokens - num_computed_tokens % chunk
