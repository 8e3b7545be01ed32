"""Sliding-window attention (vLLM: SlidingWindowManager).

A token attends to the `sliding_window - 1` tokens before it, so:
- blocks wholly before the window are freed as the request advances and
  replaced by the null block in its block table (`remove_skipped_blocks`);
- a prefix hit needs only the last cdiv(window - 1, block_size) blocks before
  the hit's end to be cached: the lookup scans from the right for such a run and
  pads everything before it with null blocks;
- in a hybrid model hits end at multiples of the alignment (the scheduler block
  size), so only the blocks just before such boundaries are worth caching
  (profile.sliding_window_sparse_caching).
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_hash_view import resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec, SlidingWindowSpec
from impl.managers.base import SingleTypeKVCacheManager, cdiv


class SlidingWindowManager(SingleTypeKVCacheManager):
    skips_tokens = True

    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window
        self.extra_retained_tokens = kv_cache_spec.extra_retained_tokens

    @staticmethod
    def _contiguous_blocks_for_hit(sliding_window: int, block_size: int) -> int:
        # -1: the query token itself is inside its own window.
        return cdiv(sliding_window - 1, block_size)

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
            raise AssertionError("DCP not support sliding window attn now.")
        block_size = kv_cache_spec.block_size
        block_hashes = resolve_block_hashes(
            block_hashes, block_pool.hash_block_size, block_size,
            block_pool.profile.coarse_block_hash,
        )
        need = cls._contiguous_blocks_for_hit(kv_cache_spec.sliding_window, block_size)
        max_num_blocks = max_length // block_size
        null = block_pool.null_block
        computed = tuple([null] * max_num_blocks for _ in kv_cache_group_ids)
        get_cached = block_pool.get_cached_block
        num_contiguous = 0
        match_found = False
        # From the right: the first run of `need` cached blocks wins.
        for i in range(max_num_blocks - 1, -1, -1):
            cached = get_cached(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                num_contiguous = 0
                continue
            # A run must end at an aligned boundary.
            if (
                num_contiguous == 0
                and block_size != alignment_tokens
                and (i + 1) * block_size % alignment_tokens != 0
            ):
                continue
            for blocks, block in zip(computed, cached):
                blocks[i] = block
            num_contiguous += 1
            if num_contiguous >= need:
                for blocks in computed:
                    del blocks[i + num_contiguous:]
                match_found = True
                break
        if not match_found:
            # A run reaching the first block hits even when shorter than `need`
            # (the window then covers the whole prefix).
            for blocks in computed:
                del blocks[num_contiguous:]
            while (
                block_size != alignment_tokens
                and len(computed[0]) * block_size % alignment_tokens != 0
            ):
                for blocks in computed:
                    blocks.pop()
        return computed, len(computed[0]) * block_size

    def reachable_block_mask(self, start_block: int, end_block: int) -> list[bool] | None:
        if not self.block_pool.profile.sliding_window_sparse_caching:
            return None
        alignment = self.cache_hit_alignment_tokens
        block_size = self.kv_cache_spec.block_size * self.dcp_world_size
        if alignment % block_size != 0:
            return None
        need = self._contiguous_blocks_for_hit(self.sliding_window, block_size)
        per_segment = alignment // block_size
        if need >= per_segment:
            return None
        # Keep the `need` blocks that end each aligned segment.
        first_kept = per_segment - need
        return [i % per_segment >= first_kept for i in range(start_block, end_block)]

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the next token's window: with window 4 and 7 computed,
        tokens 4..7 are in the window, 0..3 are skipped."""
        return max(
            0, num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        )
