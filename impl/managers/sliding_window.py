"""Sliding-window attention (vLLM's name: SlidingWindowManager); spec §9.2.

A token reads only the `sliding_window - 1` tokens before it. So the blocks a
request has moved past are given back (null entries keep the table's
positions), and a hit needs only the few blocks just before its end to be
cached, not the whole prefix.
"""

from collections.abc import Sequence

from impl.block_hash_view import resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec, SlidingWindowSpec
from impl.managers.base import HitResult, SingleTypeKVCacheManager
from impl.math_utils import cdiv


def blocks_before_hit_end(window: int, block_size: int, use_eagle: bool = False) -> int:
    """Cached blocks a hit needs right before its end: the token after the
    hit reads the window - 1 tokens before it (it reads itself too). An EAGLE
    hit matches one block more, then drops it."""
    return cdiv(window - 1, block_size) + (1 if use_eagle else 0)


class SlidingWindowManager(SingleTypeKVCacheManager):
    skips_tokens = True

    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window
        # Tokens kept below the window, unread, for multi-token speculation.
        self.extra_retained_tokens = kv_cache_spec.extra_retained_tokens

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence, max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: BlockPool,
                               kv_cache_spec: KVCacheSpec, alignment_tokens: int,
                               dcp_world_size: int = 1, pcp_world_size: int = 1, *,
                               drop_eagle_block: bool = False) -> HitResult:
        """Scanning leftwards from max_length, the first run of enough cached
        blocks wins; its right end (after an EAGLE drop) must sit on an
        aligned boundary."""
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise AssertionError("sliding-window groups cannot be sharded across "
                                 "context-parallel ranks")
        size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, size,
                                      block_pool.profile.coarse_block_hash)
        need = blocks_before_hit_end(kv_cache_spec.sliding_window, size, drop_eagle_block)
        unaligned = size != alignment_tokens
        # Blocks a run keeps of its rightmost one: all, or none with a drop.
        kept_end = 0 if drop_eagle_block else 1
        lookup = block_pool.get_cached_block
        # The run being collected, rightmost block first.
        run: list = []
        start = 0
        for i in range(max_length // size - 1, -1, -1):
            found = lookup(hashes[i], kv_cache_group_ids)
            if found is None:
                run.clear()
                continue
            if not run and unaligned and (i + kept_end) * size % alignment_tokens:
                continue  # a run may only end on an aligned boundary
            run.append(found)
            if len(run) >= need:
                start = i
                break
        else:
            # No run was long enough. One that reaches the first block still
            # hits (the window covers all of it), cut back to the alignment.
            while run and unaligned and len(run) * size % alignment_tokens:
                run.pop(0)
        null = block_pool.null_block
        run.reverse()
        groups = tuple([null] * start + [found[g] for found in run]
                       for g in range(len(kv_cache_group_ids)))
        if drop_eagle_block and groups[0]:
            width = len(groups[0]) - 1
            while unaligned and width * size % alignment_tokens:
                width -= 1
            for blocks in groups:
                del blocks[width:]
        return groups, len(groups[0]) * size

    def reachable_block_mask(self, start_block: int, end_block: int) -> list[bool] | None:
        """0.32 keys only the blocks ending each aligned segment that a hit at
        the segment's end needs; the ones before them can never be hit."""
        if not self._profile.sliding_window_sparse_caching:
            return None
        alignment = self.cache_hit_alignment_tokens
        size = self.kv_cache_spec.block_size * self.dcp_world_size
        if alignment % size:
            return None
        need = blocks_before_hit_end(self.sliding_window, size, self.use_eagle)
        per_segment = alignment // size
        if need >= per_segment:
            return None
        # An EAGLE run ends one block past the boundary (the block it drops).
        shift = 1 if self.use_eagle else 0
        return [i >= shift and (i - shift) % per_segment >= per_segment - need
                for i in range(start_block, end_block)]

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """With window 4 and 7 tokens computed, the next token (7) reads 4..7,
        so tokens 0..3 are skipped."""
        before = num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        return before if before > 0 else 0
