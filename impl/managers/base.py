"""What every single-type manager shares (vLLM: SingleTypeKVCacheManager).

A single-type manager owns the block lists of one KV cache group: which blocks
each request holds (its block table, in token order) and how many of them are
already cached. Attention kinds differ in which blocks a prefix hit may reuse
and which blocks a request may drop (`get_num_skipped_tokens`); the bookkeeping
below is common to all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    # Whether get_num_skipped_tokens can be > 0 (windowed kinds); lets full
    # attention skip remove_skipped_blocks on every allocation.
    skips_tokens = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        dcp_world_size: int = 1,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.block_size = kv_cache_spec.block_size * dcp_world_size
        self.dcp_world_size = dcp_world_size
        # request id -> its blocks, in token order (the block table).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request id -> how many of its leading blocks are cached. Present only
        # for requests that hold blocks: presence means "running".
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    # -- sizing ---------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> int:
        """Free blocks this allocation would consume, counting prefix-hit blocks
        that sit in the free queue (touching them takes them out of it)."""
        num_required = cdiv(num_tokens, self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            # A running request gets no new prefix hits.
            return max(num_required - num_held, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // (
            self.block_size
        )
        num_local = len(new_computed_blocks) + num_held
        num_new = max(num_required - max(num_skipped_blocks, num_local), 0)
        skip_from_hit = max(0, num_skipped_blocks - num_held)
        num_evictable = 0
        for blk in new_computed_blocks[skip_from_hit:]:
            if blk.ref_cnt == 0 and not blk.is_null:
                num_evictable += 1
        return num_new + num_evictable

    # -- allocation -------------------------------------------------------------

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Adopt a new request's prefix-hit blocks (first allocation only)."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not req_blocks, "prefix hits are adopted by a request holding nothing"
        num_skipped_blocks = self.get_num_skipped_tokens(
            num_local_computed_tokens + num_external_computed_tokens
        ) // self.block_size
        if num_skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        else:
            assert not new_computed_blocks, "prefix hits with caching disabled"
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            raise NotImplementedError(
                "a prefix hit ending inside a block (copy-on-write) needs "
                "hash_block_size < block_size, which is not implemented yet"
            )

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Blocks for tokens a KV connector will load (after all groups touched
        their hits, so this cannot evict another group's hit)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped = self.get_num_skipped_tokens(total)
        if num_skipped > 0:
            num_external_computed_tokens = min(
                total - num_skipped, num_external_computed_tokens
            )
        if num_external_computed_tokens <= 0:
            return
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = max(0, cdiv(total, self.block_size) - len(req_blocks))
        req_blocks.extend(self.block_pool.get_new_blocks(num_new))

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the request's block table to hold `num_tokens`; return new blocks."""
        req_blocks = self.req_to_blocks.get(request_id)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[request_id] = []
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    # -- caching ------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that `num_tokens` computed tokens fill."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self.block_size,
            self.kv_cache_group_id,
        )
        self.num_cached_block[request_id] = num_full

    # -- release --------------------------------------------------------------------

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request_id: str) -> None:
        # Tail blocks first: they are the least likely to be shared, so they
        # should be evicted before the prefix.
        blocks = self.pop_blocks_for_free(request_id)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace blocks that attention no longer reads with the null block."""
        if not self.skips_tokens:
            return
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if num_skipped <= 0:
            return
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        last = min(num_skipped // self.block_size, len(blocks))
        freed = []
        # Backwards, stopping at the first null: earlier calls nulled the rest.
        for i in range(last - 1, -1, -1):
            if blocks[i] is self._null_block:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens attention will never read again; 0 unless windowed."""
        return 0

    def new_step_starts(self) -> None:
        return None

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
        raise NotImplementedError
