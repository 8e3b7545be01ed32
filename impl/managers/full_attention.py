"""Full attention (vLLM's name: FullAttentionManager); specs/KV_CACHE_MANAGER.md §9.1.

Every token stays readable, so a hit is the unbroken run of cached blocks from
the first one. MLA latents and sink attention are kept the same way.

Hybrid models hashed finer than this group's block (0.32) can also hit in
the middle of the first block that is not wholly cached, at a prompt
boundary an earlier request registered there as a partial entry.
"""

from collections.abc import Sequence

from impl.block_hash_view import (
    BlockHashListWithBlockSize,
    fine_grained_lookup,
    resolve_block_hashes,
)
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec
from impl.managers.base import (
    HitResult,
    Interval,
    SingleTypeKVCacheManager,
    effective_block_size,
)
from impl.math_utils import cdiv
from impl.profiles import PromptTailBoundary
from impl.request import Request


class FullAttentionManager(SingleTypeKVCacheManager):
    supports_fine_grained_hash_lookup = True
    shares_prefix_by_ref_cnt = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Prompt boundaries can fall inside this group's blocks (0.32 hybrids).
        self._keys_prompt_tail = (self.block_size != self.block_pool.hash_block_size
                                  and self._profile.partial_block_hits)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence, max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: BlockPool,
                               kv_cache_spec: KVCacheSpec, alignment_tokens: int,
                               dcp_world_size: int = 1, pcp_world_size: int = 1, *,
                               drop_eagle_block: bool = False) -> HitResult:
        profile = block_pool.profile
        size = effective_block_size(kv_cache_spec, profile, dcp_world_size, pcp_world_size)
        if len(kv_cache_group_ids) == 1 and size == block_pool.hash_block_size:
            return cached_prefix_run(block_hashes, max_length, kv_cache_group_ids[0],
                                     block_pool, size, alignment_tokens, drop_eagle_block)
        inside = profile.partial_block_hits and cls.supports_fine_grained_hash_lookup
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, size,
                                      profile.coarse_block_hash, inside, alignment_tokens)
        inside = inside and fine_grained_lookup(alignment_tokens, size)
        per_block = (BlockHashListWithBlockSize(hashes, alignment_tokens, size,
                                                profile.coarse_block_hash)
                     if inside else hashes)
        lookup = block_pool.get_cached_block
        groups = tuple([] for _ in kv_cache_group_ids)
        # Whole blocks from the first; hashes chain, so a miss ends the run.
        for i in range(min(max_length // size, len(per_block))):
            found = lookup(per_block[i], kv_cache_group_ids)
            if found is None:
                break
            for blocks, block in zip(groups, found):
                blocks.append(block)
        length = len(groups[0]) * size
        if inside:
            # The next block may still hit at its longest cached interior
            # boundary, tried from the longest down.
            per = size // alignment_tokens
            low = len(groups[0]) * per
            high = min(low + per - 1, max_length // alignment_tokens, len(hashes))
            for unit in range(high - 1, low - 1, -1):
                found = lookup(hashes[unit], kv_cache_group_ids)
                if found is not None:
                    for blocks, block in zip(groups, found):
                        blocks.append(block)
                    length = (unit + 1) * alignment_tokens
                    break
        if drop_eagle_block and length:
            # The drafter needs the last unit recomputed: a hash block when
            # the hit may end inside a block (the block still holds the
            # shorter prefix), else the whole last block.
            length -= min(alignment_tokens, size)
        length -= length % alignment_tokens
        keep = cdiv(length, size)
        for blocks in groups:
            del blocks[keep:]
        return groups, length

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval: Interval = None,
                     replay_boundaries: Sequence[int] = ()) -> None:
        # The shared method, inlined: each decode step of each request ends
        # here. Every block stays reachable, whatever the retention.
        request_id = request.request_id
        done = self.num_cached_block.get(request_id, 0)
        full = (num_tokens // self.block_size if not self.block_pool.num_hash_lookahead_tokens
                else self._num_hashed_blocks(request, num_tokens))
        if done < full:
            self.block_pool.cache_full_blocks(
                request, self.req_to_blocks[request_id], done, full, self.block_size,
                self.kv_cache_group_id,
            )
            self.num_cached_block[request_id] = full
        if self._keys_prompt_tail:
            self._key_prompt_tail(request, num_tokens)

    def _key_prompt_tail(self, request: Request, num_tokens: int) -> None:
        """Once computed, make the prompt's last hash boundary findable when it
        falls inside a block: a resend of the prompt can then hit up to it."""
        unit = self.block_pool.hash_block_size
        # 0.32+: at most num_prompt - 1 tokens of a resend can hit; an EAGLE
        # lookup matches the whole prompt before it drops a unit.
        rule = (PromptTailBoundary.PROMPT_END if self.use_eagle
                else self._profile.prompt_tail_boundary)
        boundary = rule.position(request.num_prompt_tokens, unit)
        if self.block_pool.num_hash_lookahead_tokens:
            boundary = min(boundary, len(request.block_hashes) * unit)
        if not boundary or boundary > num_tokens or not boundary % self.block_size:
            return
        table = self.req_to_blocks[request.request_id]
        index = boundary // self.block_size
        if index < len(table):
            self.block_pool.cache_partial_block(
                request, table[index], boundary, self.kv_cache_group_id, self.block_size)


def cached_prefix_run(hashes: Sequence, max_length: int, group_id: int,
                      pool: BlockPool, size: int, alignment: int,
                      drop_eagle_block: bool = False) -> HitResult:
    """The plain case of the lookup (one group hashed at its own block size),
    probing the map directly: every lookup of a non-hybrid model is this."""
    run = pool.cached_block_hash_to_block.prefix_run(
        hashes[:max_length // size], group_id.to_bytes(4, "big"))
    if drop_eagle_block and run:
        run.pop()
    if alignment != size:
        length = len(run) * size
        length -= length % alignment
        del run[cdiv(length, size):]
    return (run,), len(run) * size
