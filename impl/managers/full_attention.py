"""Full attention (vLLM: FullAttentionManager): every token stays readable, so a
prefix hit is the longest run of cached blocks from the start of the prompt.

MLA latents are managed the same way. In a hybrid model whose hash block is
smaller than this group's block, a hit may also end inside the first block that
is not fully cached (fine-grained lookup), at a prompt boundary some earlier
request registered as a partial entry (`_cache_partial_tail_block`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from impl.block import KVCacheBlock
from impl.block_hash_view import BlockHashListWithBlockSize, resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.managers.base import SingleTypeKVCacheManager, cdiv
from impl.request import Request


class FullAttentionManager(SingleTypeKVCacheManager):
    supports_fine_grained_hash_lookup = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Whether a prompt boundary may fall inside this group's blocks.
        self._partial_tail = (
            self.block_size != self.block_pool.hash_block_size
            and self.block_pool.profile.partial_block_hits
        )

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
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        if len(kv_cache_group_ids) == 1 and block_size == block_pool.hash_block_size:
            # One group at the hash granularity: probe the map directly (every
            # lookup of a plain full-attention model walks this loop).
            get_one = block_pool.cached_block_hash_to_block.get_one_block
            suffix = kv_cache_group_ids[0].to_bytes(4, "big")
            hit = computed[0]
            for i in range(min(max_length // block_size, len(block_hashes))):
                block = get_one(block_hashes[i] + suffix)
                if block is None:  # hashes are chained: the first miss ends it
                    break
                hit.append(block)
            hit_length = len(hit) * block_size
            hit_length -= hit_length % alignment_tokens
            del hit[-(-hit_length // block_size):]
            return computed, hit_length

        profile = block_pool.profile
        fine_grained_ok = profile.partial_block_hits and cls.supports_fine_grained_hash_lookup
        block_hashes = resolve_block_hashes(
            block_hashes, block_pool.hash_block_size, block_size,
            profile.coarse_block_hash, fine_grained_ok, alignment_tokens,
        )
        fine_grained = (
            fine_grained_ok
            and alignment_tokens < block_size
            and block_size % alignment_tokens == 0
        )
        full_block_hashes = (
            BlockHashListWithBlockSize(
                block_hashes, alignment_tokens, block_size, profile.coarse_block_hash
            )
            if fine_grained else block_hashes
        )
        get_cached = block_pool.get_cached_block
        # Phase 1: the run of cached full blocks from the start.
        for block_hash in islice(full_block_hashes, max_length // block_size):
            cached = get_cached(block_hash, kv_cache_group_ids)
            if cached is None:
                break
            for blocks, block in zip(computed, cached):
                blocks.append(block)
        hit_length = len(computed[0]) * block_size
        if fine_grained:
            # Phase 2: extend into the next block at its longest cached interior
            # boundary.
            scale = block_size // alignment_tokens
            first = len(computed[0]) * scale
            last = min(first + scale - 1, max_length // alignment_tokens, len(block_hashes))
            for fine_idx in range(last - 1, first - 1, -1):
                cached = get_cached(block_hashes[fine_idx], kv_cache_group_ids)
                if cached is None:
                    continue
                for blocks, block in zip(computed, cached):
                    blocks.append(block)
                hit_length = (fine_idx + 1) * alignment_tokens
                break
        hit_length -= hit_length % alignment_tokens
        num_blocks = cdiv(hit_length, block_size)
        for blocks in computed:
            del blocks[num_blocks:]
        return computed, hit_length

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        # The base method, inlined: every decode step of every request comes here.
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached < num_full:
            self.block_pool.cache_full_blocks(
                request, self.req_to_blocks[request_id], num_cached, num_full,
                self.block_size, self.kv_cache_group_id,
            )
            self.num_cached_block[request_id] = num_full
        if self._partial_tail:
            self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> None:
        """Register the prompt's last hash boundary when it falls inside a
        block, so a resend of the prompt can hit up to it."""
        hbs = self.block_pool.hash_block_size
        # A resend hits at most prompt_len - 1 tokens.
        boundary = (request.num_prompt_tokens - 1) // hbs * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[request.request_id]
        block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return
        self.block_pool.cache_partial_block(
            request, blocks[block_idx], boundary, self.kv_cache_group_id, self.block_size
        )
