"""The block pool: allocation, ref counts, prefix-cache bookkeeping, eviction, events.

vLLM: BlockPool. Block 0 is the null block, taken out of the free queue at
construction. A free block with a hash is still cached: a prefix hit "touches" it
out of the free queue; allocation pops the queue head and evicts its hash.

A block has one primary hash (`block.block_hash`) and, in hybrid models with
hash_block_size < block_size, possibly more keys: a partial entry for a prompt
boundary inside the block (`cache_partial_block`). The extra keys live in
`cached_block_hashes_by_block` so eviction, reset and promotion drop them all;
only a block with a primary hash ever has extra keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from impl.block import KVCacheBlock
from impl.block_hash import (
    block_extra_keys,
    event_extra_keys,
    get_block_hash,
    get_group_id,
)
from impl.block_hash_map import BlockHashToBlockMap
from impl.block_hash_view import resolve_block_hashes
from impl.free_queue import FreeKVCacheBlockQueue
from impl.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from impl.profiles import FreeOrder, VersionProfile
from impl.request import Request

_INT64_MASK = (1 << 64) - 1


def external_block_hash(block_hash: bytes, as_int: bool) -> bytes | int:
    """A hash as KV events publish it: the low 64 bits of its big-endian value by
    default (vLLM: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the raw bytes."""
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & _INT64_MASK


class BlockPool:
    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        profile: VersionProfile,
        enable_kv_cache_events: bool = False,
        events_use_int_hashes: bool = True,
    ) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.profile = profile
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # block id -> its keys besides the primary one (partial entries).
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.events_use_int_hashes = events_use_int_hashes
        self.kv_event_queue: list[KVCacheEvent] = []
        self._unhashed_first = profile.free_order is FreeOrder.UNHASHED_FIRST

    # -- lookup and caching -------------------------------------------------

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """The cached block for `block_hash` in every group, or None on any miss."""
        get = self.cached_block_hash_to_block.get_one_block
        out = []
        for group_id in kv_cache_group_ids:
            block = get(block_hash + group_id.to_bytes(4, "big"))
            if block is None:
                return None
            out.append(block)
        return out

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Give blocks [num_cached_blocks, num_full_blocks) of a request their hash
        and make them findable by prefix lookups. Null or masked blocks are skipped.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        if block_size != self.hash_block_size:
            hashes = resolve_block_hashes(
                hashes, self.hash_block_size, block_size, self.profile.coarse_block_hash
            )
        group_suffix = kv_cache_group_id.to_bytes(4, "big")
        insert = self.cached_block_hash_to_block.insert
        events = self.enable_kv_cache_events
        stored: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (
                block_mask is not None and not block_mask[i - num_cached_blocks]
            ):
                continue
            key = hashes[i] + group_suffix
            if blk.block_hash is None:
                blk.block_hash = key
                blk.block_hash_num_tokens = (i + 1) * block_size
                insert(key, blk)
            else:
                # Only a partial entry may precede the full one (a prompt
                # boundary inside this block): promote it.
                assert blk.block_hash_num_tokens < (i + 1) * block_size, (
                    f"block {blk.block_id} already cached"
                )
                self._emit_removed(self._remove_cached_block_hashes(blk))
                self._insert_block_hash(key, blk, (i + 1) * block_size)
            if events:
                stored.append(i)
        if events:
            self._emit_stored(
                request, hashes, stored, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id,
            )

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock, num_tokens: int) -> None:
        if block.block_hash == key:
            return
        if self.cached_block_hash_to_block.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.block_hash = key
            block.block_hash_num_tokens = num_tokens
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)
        self.cached_block_hash_to_block.insert(key, block)

    def cache_partial_block(
        self,
        request: Request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """Make `block` findable from the prefix boundary `num_tokens` (a
        multiple of hash_block_size inside the block); return the key, or None
        for the null block."""
        if block.is_null:
            return None
        hbs = self.hash_block_size
        assert block_size % hbs == 0 and num_tokens % hbs == 0
        num_hash_blocks = num_tokens // hbs
        block_hash = request.block_hashes[num_hash_blocks - 1]
        key = block_hash + kv_cache_group_id.to_bytes(4, "big")
        already_cached = block.block_hash == key or self.cached_block_hash_to_block.contain(
            key, block.block_id
        )
        if replace_existing_hashes:
            self._emit_removed(self._remove_cached_block_hashes(block))
            already_cached = False
        elif (
            not already_cached
            and block.block_hash is not None
            and block.block_hash_num_tokens < num_hash_blocks * hbs
        ):
            # A shorter entry of the same block is superseded.
            self._emit_removed(self._remove_cached_block_hashes(block))
        self._insert_block_hash(key, block, num_hash_blocks * hbs)
        if self.enable_kv_cache_events and not already_cached:
            as_int = self.events_use_int_hashes
            start = (num_hash_blocks - 1) * hbs
            parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
            lora = request.lora
            carry = self.profile.kv_events_carry_group
            self.kv_event_queue.append(
                BlockStored(
                    block_hashes=[external_block_hash(block_hash, as_int)],
                    parent_block_hash=None if parent is None
                    else external_block_hash(parent, as_int),
                    token_ids=request.all_token_ids[start:num_tokens],
                    block_size=num_tokens - start,
                    lora_id=lora.int_id if lora else None,
                    medium=MEDIUM_GPU,
                    lora_name=lora.name if lora else None,
                    extra_keys=[event_extra_keys(block_extra_keys(
                        request, start, num_tokens, self.profile.tagged_extra_keys))],
                    group_idx=kv_cache_group_id if carry else None,
                    session_id=request.session_id if carry else None,
                )
            )
        return key

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """Re-point src_block's cache entries at dst_block (a private copy the
        cache keeps while the owner goes on writing src_block); no events."""
        assert dst_block.block_hash is None
        num_tokens = src_block.block_hash_num_tokens
        for key in self._remove_cached_block_hashes(src_block):
            self._insert_block_hash(key, dst_block, num_tokens)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        """Drop every key of the block from the map; return those that were
        there (primary first)."""
        keys = [] if block.block_hash is None else [block.block_hash]
        extra = self.cached_block_hashes_by_block.pop(block.block_id, None)
        if extra:
            keys.extend(extra)
        if not keys:
            return []
        pop = self.cached_block_hash_to_block.pop
        removed = [k for k in keys if pop(k, block.block_id) is not None]
        block.block_hash = None
        block.block_hash_num_tokens = None
        return removed

    def _emit_removed(self, keys: list[bytes]) -> None:
        if not self.enable_kv_cache_events:
            return
        carry = self.profile.kv_events_carry_group
        for key in keys:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[
                        external_block_hash(get_block_hash(key), self.events_use_int_hashes)
                    ],
                    medium=MEDIUM_GPU,
                    group_idx=get_group_id(key) if carry else None,
                )
            )

    def _emit_stored(
        self,
        request: Request,
        hashes,
        stored: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        as_int = self.events_use_int_hashes
        tagged = self.profile.tagged_extra_keys
        parent = (
            None
            if num_cached_blocks == 0
            else external_block_hash(hashes[num_cached_blocks - 1], as_int)
        )
        extra = [
            event_extra_keys(
                block_extra_keys(request, i * block_size, (i + 1) * block_size, tagged)
            )
            for i in stored
        ]
        # The token range spans every newly full block, including null/masked
        # ones whose hashes are left out (that is what vLLM publishes).
        start = num_cached_blocks * block_size
        end = num_full_blocks * block_size
        lora = request.lora
        carry = self.profile.kv_events_carry_group
        self.kv_event_queue.append(
            BlockStored(
                block_hashes=[external_block_hash(hashes[i], as_int) for i in stored],
                parent_block_hash=parent,
                token_ids=request.all_token_ids[start:end],
                block_size=block_size,
                lora_id=lora.int_id if lora else None,
                medium=MEDIUM_GPU,
                lora_name=lora.name if lora else None,
                # vLLM publishes no list at all when every block was skipped.
                extra_keys=extra or None,
                group_idx=group_id if carry else None,
                session_id=request.session_id if carry else None,
            )
        )

    # -- allocation and release --------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue, evicting their hashes."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:
            for block in ret:
                if block.block_hash is not None:
                    self._evict_cached_block(block)
                block.ref_cnt += 1
        else:
            for block in ret:
                block.ref_cnt += 1
        return ret

    def _evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop a block's keys from the prefix cache; True if it had any."""
        removed = self._remove_cached_block_hashes(block)
        if not removed:
            return False
        self._emit_removed(removed)
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the queue."""
        remove = self.free_block_queue.remove
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference on each block; blocks reaching 0 become free.

        `ordered_blocks` is in eviction priority (first = evict first). Where they
        re-enter the queue is a version difference (profile.free_order).
        """
        if self._unhashed_first:
            first: list[KVCacheBlock] = []
            last: list[KVCacheBlock] = []
            caching = self.enable_caching
            for block in ordered_blocks:
                block.ref_cnt -= 1
                if block.ref_cnt == 0 and not block.is_null:
                    if block.block_hash is None or not caching:
                        first.append(block)
                    else:
                        last.append(block)
            if first:
                self.free_block_queue.prepend_n(first)
            if last:
                self.free_block_queue.append_n(last)
        else:
            released = []
            for block in ordered_blocks:
                block.ref_cnt -= 1
                if block.ref_cnt == 0 and not block.is_null:
                    released.append(block)
            if released:
                self.free_block_queue.append_n(released)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache (they stay allocated/free).

        vLLM takes a set and iterates it; we build the same set so that removal
        events come out in the same order.
        """
        for block_id in set(block_ids):
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(
                    f"Invalid block_id {block_id} >= {self.num_gpu_blocks}"
                )
            self._evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use."""
        if self.num_gpu_blocks - self.free_block_queue.num_free_blocks != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks:
            block.block_hash = None
            block.block_hash_num_tokens = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        """Whether its sole owner may overwrite the block in place."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    # -- state --------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1  # the null block is never usable
        if not total:
            return 0
        return 1.0 - (self.free_block_queue.num_free_blocks / total)

    def take_events(self) -> list[KVCacheEvent]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
