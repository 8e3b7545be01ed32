"""What every single-type manager shares (vLLM: SingleTypeKVCacheManager).

A single-type manager owns the block lists of one KV cache group: which blocks
each request holds (its block table, in token order) and how many of them are
already cached. Attention kinds differ in which blocks a prefix hit may reuse
and which blocks a request may drop (`get_num_skipped_tokens`); the bookkeeping
below is common to all of them.

A hit may end inside a block (hybrid models with hash_block_size < block_size):
the request then shares a block it must not write. It is redirected to a
private copy on its first allocation (copy-on-write): the copy takes the shared
block's place in the block table, and both stay referenced until the scheduler
drains the pending copies (`take_pending_cow_copies`).
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.profiles import ContextParallelBlockSize
from impl.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    # Whether get_num_skipped_tokens can be > 0 (windowed kinds, Mamba); lets
    # full attention skip remove_skipped_blocks on every allocation.
    skips_tokens = False
    # Whether hits may end at hash-block boundaries inside a block.
    supports_fine_grained_hash_lookup = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        if block_pool.profile.context_parallel_block_size is ContextParallelBlockSize.DCP_TIMES_PCP:
            self.dcp_world_size, self.pcp_world_size = dcp_world_size, pcp_world_size
            scale = dcp_world_size * pcp_world_size
        else:
            # Replicated caches (Mamba state) are not split across CP ranks.
            sharded = kv_cache_spec.dcp_sharded
            self.dcp_world_size = dcp_world_size if sharded else 1
            self.pcp_world_size = pcp_world_size if sharded else 1
            scale = self.dcp_world_size
        self.block_size = kv_cache_spec.block_size * scale
        self.scheduler_block_size = scheduler_block_size or self.block_size
        # The token granularity of hits; the hybrid coordinator may lower it to
        # the hash block size (fine-grained hits).
        self.cache_hit_alignment_tokens = self.scheduler_block_size
        # Recycling kinds (sliding window, chunked local) cap what a request can
        # hold at once; full_sequence_must_fit admission uses the cap.
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        # request id -> its blocks, in token order (the block table).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request id -> how many of its leading blocks are cached. Present only
        # for requests that hold blocks: presence means "running".
        self.num_cached_block: dict[str, int] = {}
        # request id -> (block index, shared block) of a hit ending inside it,
        # until allocate_new_blocks redirects it to a private copy.
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        # (source, copy) pairs whose copy the worker still has to make.
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        self._null_block = block_pool.null_block
        self._prefix_cacheable = kv_cache_spec.prefix_cacheable

    # -- sizing ---------------------------------------------------------------

    def _has_partial_local_hit(
        self, new_computed_blocks: Sequence[KVCacheBlock], num_local_computed_tokens: int
    ) -> bool:
        return bool(new_computed_blocks) and num_local_computed_tokens % self.block_size != 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Free blocks this allocation would consume, counting prefix-hit blocks
        that sit in the free queue (touching them takes them out of it)."""
        num_required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks_per_request is not None:
            num_required = min(num_required, self.max_admission_blocks_per_request)
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
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            num_new += 1  # a hit inside a block: the private copy of that block
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
        if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):
            # The hit ends inside its last block: copy it before writing, and
            # re-cache the copy once it is full.
            block_idx = num_local_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (block_idx, new_computed_blocks[-1])
            self.num_cached_block[request_id] = block_idx

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Blocks for tokens a KV connector will load."""
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped = self.get_num_skipped_tokens(total)
        trim = num_skipped > 0 if self.block_pool.profile.external_trim_on_skipped_tokens else (
            num_skipped >= self.block_size)
        if trim:
            # External tokens the window has already left need no blocks.
            num_external_computed_tokens = min(
                total - num_skipped, num_external_computed_tokens
            )
        if num_external_computed_tokens <= 0:
            return
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = max(0, cdiv(total, self.block_size) - len(req_blocks))
        req_blocks.extend(self.block_pool.get_new_blocks(num_new))

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int = 0
    ) -> list[KVCacheBlock]:
        """Grow the request's block table to hold `num_tokens`; return new blocks
        (a partial hit's private copy first)."""
        cow_blocks: list[KVCacheBlock] = []
        if request_id in self._partial_hit_reqs:
            block_idx, source = self._partial_hit_reqs.pop(request_id)
            cow = self.block_pool.get_new_blocks(1)[0]
            self._apply_cow(request_id, block_idx, source, cow)
            cow_blocks.append(cow)
        req_blocks = self.req_to_blocks.get(request_id)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[request_id] = []
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return cow_blocks
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return cow_blocks + new_blocks if cow_blocks else new_blocks

    def _apply_cow(
        self, request_id: str, block_idx: int, source: KVCacheBlock, cow: KVCacheBlock
    ) -> None:
        """Put the private copy in the shared block's place. Both ends stay
        referenced until the copy has run: the source keeps the hit's reference,
        the copy takes one more than the request's."""
        req_blocks = self.req_to_blocks[request_id]
        assert req_blocks[block_idx] is source and source.ref_cnt > 0
        req_blocks[block_idx] = cow
        self._pending_cow_copies.append((source, cow))
        cow.ref_cnt += 1

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        pending, self._pending_cow_copies = self._pending_cow_copies, []
        return pending

    # -- caching ------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that `num_tokens` computed tokens fill."""
        if not self._prefix_cacheable:
            return
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
            self.reachable_block_mask(num_cached, num_full),
        )
        self.num_cached_block[request_id] = num_full

    def reachable_block_mask(self, start_block: int, end_block: int) -> list[bool] | None:
        """Which of blocks [start, end) a future hit can use (None: all)."""
        return None

    # -- release --------------------------------------------------------------------

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request_id: str) -> None:
        # Tail blocks first: they are the least likely to be shared, so they
        # should be evicted before the prefix.
        blocks = self.pop_blocks_for_free(request_id)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Replace blocks that attention no longer reads with the null block."""
        if not self.skips_tokens:
            return
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if num_skipped <= 0:
            return
        blocks = self.req_to_blocks.setdefault(request_id, [])
        self._remove_blocks_in_range(
            request_id, 0, min(num_skipped // self.block_size, len(blocks))
        )

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """Free blocks [first, last) into the null block, backwards, stopping at
        the first null: earlier calls nulled the rest."""
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None or first >= last:
            return
        last = min(last, len(blocks))
        freed = []
        null = self._null_block
        for i in range(last - 1, first - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
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
        block_size: int,
        dcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest prefix (at most `max_length` tokens, a multiple of
        `alignment_tokens`) cached in every group of `kv_cache_group_ids`:
        blocks per group (skipped ones as the null block) and its length."""
        raise NotImplementedError
