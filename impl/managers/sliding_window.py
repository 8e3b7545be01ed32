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
from impl.managers.base import HitResult, Interval, SingleTypeKVCacheManager
from impl.math_utils import cdiv
from impl.profiles import SlidingWindowSparseCaching


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

    def _block_mask(self, request, start, end, retention_interval, replay_boundaries):
        sparse = self._profile.sliding_window_sparse_caching
        if sparse is SlidingWindowSparseCaching.NONE:
            return None  # 0.17-0.21 key every full block
        alignment = self.cache_hit_alignment_tokens
        if sparse is SlidingWindowSparseCaching.HYBRID_ONLY and alignment is not None and (
                alignment <= self.kv_cache_spec.block_size * self.dcp_world_size):
            return None  # 0.22 masks only hybrids hit on coarser boundaries
        return super()._block_mask(request, start, end, retention_interval, replay_boundaries)

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, alignment_tokens: int | None,
                             kv_cache_spec: KVCacheSpec, use_eagle: bool,
                             retention_interval: Interval = None,
                             reachable_boundaries: Sequence[int] = (), dcp_world_size: int = 1,
                             final_segment_end_block: int | None = None) -> list[bool] | None:
        """A hit at a boundary needs only the window's tail before it (one
        block more under EAGLE, whose hit runs a block past the boundary and
        drops it), so only such tails are keyed: at the end of every segment
        (the alignment when dense, the retention interval when sparse) and
        before every reachable boundary when sparse. None: all blocks."""
        if not isinstance(kv_cache_spec, SlidingWindowSpec):
            raise AssertionError(f"a sliding-window mask for a {type(kv_cache_spec).__name__}")
        if alignment_tokens is None:
            return None
        size = kv_cache_spec.block_size * dcp_world_size
        if alignment_tokens % size:
            # A boundary inside a block cannot be told apart block by block:
            # keep everything rather than lose a reachable tail.
            return None
        need = blocks_before_hit_end(kv_cache_spec.sliding_window, size, use_eagle)
        shift = 1 if use_eagle else 0
        keep = [False] * (end_block - start_block)
        segment = alignment_tokens if retention_interval is None else retention_interval
        if segment:
            per_segment = segment // size
            if need >= per_segment:
                return None
            first_kept = per_segment - need
            for i in range(max(start_block, shift), end_block):
                if (i - shift) % per_segment >= first_kept:
                    keep[i - start_block] = True
            if not use_eagle and final_segment_end_block is not None:
                # A request's last segment may stop short; its tail is reachable too.
                partial = final_segment_end_block % per_segment
                if partial:
                    low = max(final_segment_end_block - partial, final_segment_end_block - need,
                              start_block)
                    for i in range(low, min(end_block, final_segment_end_block)):
                        keep[i - start_block] = True
        if retention_interval is not None:
            for boundary in reachable_boundaries:
                edge = boundary - boundary % alignment_tokens
                stop = edge // size + shift
                for i in range(max(start_block, stop - need), min(end_block, stop)):
                    keep[i - start_block] = True
        return keep

    def free(self, request_id: str) -> None:
        table = self.pop_blocks_for_free(request_id)
        if table:
            # Freed as blocks leaving the window are (free_order).
            self.block_pool.free_blocks(reversed(table), skipped=True)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """With window 4 and 7 tokens computed, the next token (7) reads 4..7,
        so tokens 0..3 are skipped."""
        before = num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        return before if before > 0 else 0
