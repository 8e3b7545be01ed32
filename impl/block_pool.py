"""The block pool: allocation, ref counts, prefix-cache bookkeeping, eviction, events.

vLLM: BlockPool. Block 0 is the null block, taken out of the free queue at
construction. A free block with a hash is still cached: a prefix hit "touches" it
out of the free queue; allocation pops the queue head and evicts its hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from impl.block import KVCacheBlock
from impl.block_hash import (
    block_extra_keys,
    event_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from impl.block_hash_map import BlockHashToBlockMap
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
        if block_size != self.hash_block_size:
            raise NotImplementedError(
                "block_size != hash_block_size (hybrid groups) is not implemented yet"
            )
        hashes = request.block_hashes
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
            # A block reaching here is fresh from get_new_blocks (hash evicted) or
            # was never cached: prefix-hit blocks are below num_cached_blocks.
            assert blk.block_hash is None, f"block {blk.block_id} already cached"
            key = hashes[i] + group_suffix
            blk.block_hash = key
            blk.block_hash_num_tokens = (i + 1) * block_size
            insert(key, blk)
            if events:
                stored.append(i)
        if events:
            self._emit_stored(
                request, stored, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id,
            )

    def _emit_stored(
        self,
        request: Request,
        stored: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        hashes = request.block_hashes
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
                extra_keys=extra,
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
        """Drop a block's hash from the prefix cache; True if it had one."""
        key = block.block_hash
        if key is None:
            return False
        removed = self.cached_block_hash_to_block.pop(key, block.block_id)
        block.block_hash = None
        block.block_hash_num_tokens = None
        if removed is None:
            return False
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[
                        external_block_hash(get_block_hash(key), self.events_use_int_hashes)
                    ],
                    medium=MEDIUM_GPU,
                    group_idx=get_group_id(key)
                    if self.profile.kv_events_carry_group
                    else None,
                )
            )
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
        for block in self.blocks:
            block.block_hash = None
            block.block_hash_num_tokens = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

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
