"""The pool every KV cache group draws blocks from (vLLM's name: BlockPool); spec §6.

A block's life: free and unkeyed -> handed out (ref_cnt 1) -> keyed once its
tokens are final (prefix lookups can now find it) -> released (ref_cnt 0,
back in the free queue, still findable) -> either found again by a hit
(`touch` takes it out of the queue) or reused, which drops its keys (eviction).

Keys: `block.block_hash` is a block's primary key. A block may also be
findable from a prompt boundary inside it (a partial entry, hybrid models
with hits inside blocks); such extra keys are listed per block in
`cached_block_hashes_by_block`, so that eviction drops them all at once.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass

from impl.block import BlockList, KVCacheBlock
from impl.block_hash_map import BlockHashToBlockMap
from impl.block_hash_view import resolve_block_hashes
from impl.free_queue import FreeKVCacheBlockQueue
from impl.kv_cache_metrics import KVCacheMetricsCollector
from impl.kv_events import MEDIUM_GPU, AllBlocksCleared, KVCacheEvent, KVEventBuilder
from impl.profiles import FreeOrder, VersionProfile
from impl.request import Request


@dataclass(eq=False)
class BlockPool:
    num_gpu_blocks: int
    enable_caching: bool
    hash_block_size: int
    enable_kv_cache_events: bool = False
    _: KW_ONLY
    profile: VersionProfile
    # KV events carry 64-bit int hashes (vLLM's default) or the raw bytes.
    events_use_int_hashes: bool = True
    # Tokens after a block its hash covers (lookahead hashing, 0.33).
    num_hash_lookahead_tokens: int = 0
    # Where the blocks live, as KV events say it (HiSparse's host pool: CPU).
    medium: str = MEDIUM_GPU
    # Samples block residency (spec §16.8); None: nothing is followed.
    metrics_collector: KVCacheMetricsCollector | None = None

    # What the pool is made of (HiSparse's host blocks also know their pool).
    _block_type = KVCacheBlock

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1:
            raise ValueError(f"a pool needs at least its null block; got {self.num_gpu_blocks}")
        self.blocks = [self._block_type(i) for i in range(self.num_gpu_blocks)]
        queue = self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}
        # Block 0 pads block tables where a request skips a block; it is
        # never handed out, released or keyed.
        null = self.null_block = queue.popleft()
        null.is_null = True
        self.kv_event_queue: list[KVCacheEvent] = []
        self._events = (KVEventBuilder(self.profile, self.events_use_int_hashes,
                                       self.num_hash_lookahead_tokens, self.medium)
                        if self.enable_kv_cache_events else None)
        # Released blocks still read until reused (unpin_blocks): block id ->
        # what to tell when the pool hands the block out again.
        self._watched: dict[int, Callable[[KVCacheBlock], None]] = {}
        # Pools of other blocks this pool's free_blocks may be given (HiSparse).
        self._routes_foreign = False
        # Where released blocks go (profile.free_order): all to the back
        # (None); the unkeyed ones (never to be hit) in front for reuse first
        # (True); all of them in front (False). Blocks a group drops as they
        # leave its window may follow another rule (0.23).
        self._split_on_release, self._split_on_skip = _release_rules(
            self.profile.free_order, self.enable_caching)
        # Whether touch and free keep the null block's ref count (up to 0.32).
        self._count_null = self.profile.null_block_refcount

    # -- keys -----------------------------------------------------------------

    def _attach(self, block: KVCacheBlock, key: bytes, num_tokens: int | None) -> None:
        """Make `block` findable under `key` (a no-op if it already is)."""
        if block.block_hash == key:
            return
        index = self.cached_block_hash_to_block
        if index.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.block_hash = key
            block.block_hash_num_tokens = num_tokens
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)
        index.insert(key, block)

    def _detach_all(self, block: KVCacheBlock) -> list[bytes]:
        """Make `block` unfindable; the keys that did find it, primary first."""
        keys = [] if block.block_hash is None else [block.block_hash]
        extra = self.cached_block_hashes_by_block.pop(block.block_id, None)
        if extra:
            keys += extra
        if not keys:
            return keys
        pop = self.cached_block_hash_to_block.pop
        block_id = block.block_id
        gone = [key for key in keys if pop(key, block_id) is not None]
        block.block_hash = block.block_hash_num_tokens = None
        return gone

    def _announce_removed(self, keys: list[bytes]) -> None:
        if self._events is not None and keys:
            self.kv_event_queue.extend(self._events.removed(key) for key in keys)

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: Sequence[int]) -> BlockList | None:
        """A block carrying `block_hash` in each group; None if a group has none."""
        find = self.cached_block_hash_to_block.get_one_block
        found = []
        for group_id in kv_cache_group_ids:
            block = find(block_hash + group_id.to_bytes(4, "big"))
            if block is None:
                return None
            found.append(block)
        return found

    def cache_full_blocks(self, request: Request, blocks: BlockList, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        """Key blocks [num_cached_blocks, num_full_blocks) of a request's
        table (null and masked-out blocks stay unkeyed)."""
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        if block_size != self.hash_block_size:
            hashes = resolve_block_hashes(hashes, self.hash_block_size, block_size,
                                          self.profile.coarse_block_hash)
        suffix = kv_cache_group_id.to_bytes(4, "big")
        index = self.cached_block_hash_to_block
        keyed: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (block_mask is not None
                                 and not block_mask[i - num_cached_blocks]):
                continue
            key = hashes[i] + suffix
            end = (i + 1) * block_size
            if block.block_hash is None:
                block.block_hash = key
                block.block_hash_num_tokens = end
                index.insert(key, block)
            else:
                # Only a partial entry (a prompt boundary inside this block)
                # can be there before the block is full: replace it.
                if block.block_hash_num_tokens >= end:
                    raise AssertionError(f"block {block.block_id} is keyed for "
                                         f"{block.block_hash_num_tokens} tokens already")
                self._announce_removed(self._detach_all(block))
                self._attach(block, key, end)
            keyed.append(i)
        if self._events is not None:
            self.kv_event_queue.append(self._events.stored(
                request, [hashes[i] for i in keyed],
                hashes[num_cached_blocks - 1] if num_cached_blocks else None,
                # The range spans skipped blocks too: vLLM publishes it so.
                num_cached_blocks * block_size, num_full_blocks * block_size, block_size,
                kv_cache_group_id, [(i * block_size, (i + 1) * block_size) for i in keyed],
            ))

    def cache_partial_block(self, request: Request, block: KVCacheBlock, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> bytes | None:
        """Make `block` findable from the prefix boundary `num_tokens` (a
        multiple of the hash block size that ends inside it). Returns the key,
        None for the null block."""
        if block.is_null:
            return None
        unit = self.hash_block_size
        if block_size % unit or num_tokens % unit:
            raise AssertionError(f"a partial entry at {num_tokens} tokens does not fall on "
                                 f"the {unit}-token hash grid of a {block_size}-token block")
        n = num_tokens // unit
        block_hash = request.block_hashes[n - 1]
        key = block_hash + kv_cache_group_id.to_bytes(4, "big")
        present = block.block_hash == key or self.cached_block_hash_to_block.contain(
            key, block.block_id)
        if replace_existing_hashes:
            self._announce_removed(self._detach_all(block))
            present = False
        elif (not present and block.block_hash is not None
              and block.block_hash_num_tokens < num_tokens):
            # A longer prefix of the same block supersedes the shorter entry.
            self._announce_removed(self._detach_all(block))
        self._attach(block, key, num_tokens)
        if self._events is not None and not present:
            start = num_tokens - unit
            self.kv_event_queue.append(self._events.stored(
                request, [block_hash], request.block_hashes[n - 2] if n > 1 else None,
                start, num_tokens, unit, kv_cache_group_id, [(start, num_tokens)],
            ))
        return key

    def emit_cached_block_events(self, request: Request, num_cached_blocks: int,
                                 block_size: int, kv_cache_group_id: int) -> None:
        """Publish the first `num_cached_blocks` blocks of a request's hit as
        stored again (for consumers that asked for full reports): one
        BlockStored from the first block, keys and block state untouched."""
        if self._events is None or not num_cached_blocks:
            return
        hashes = request.block_hashes
        if block_size != self.hash_block_size:
            hashes = resolve_block_hashes(hashes, self.hash_block_size, block_size,
                                          self.profile.coarse_block_hash)
        ranges = [(i * block_size, (i + 1) * block_size) for i in range(num_cached_blocks)]
        self.kv_event_queue.append(self._events.stored(
            request, [hashes[i] for i in range(num_cached_blocks)], None, 0,
            num_cached_blocks * block_size, block_size, kv_cache_group_id, ranges))

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """Re-home src_block's entries on dst_block (a copy the cache keeps
        while src_block's owner overwrites it). The entries stay live: no event."""
        if dst_block.block_hash is not None:
            raise AssertionError(f"block {dst_block.block_id} is keyed already")
        covered = src_block.block_hash_num_tokens
        for key in self._detach_all(src_block):
            self._attach(dst_block, key, covered)

    # -- handing out and taking back --------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> BlockList:
        """The `num_blocks` blocks at the front of the free queue, each with
        one reference; a keyed one is evicted from the cache first."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(f"{num_blocks} blocks wanted, {queue.num_free_blocks} free")
        taken = queue.popleft_n(num_blocks)
        if self._watched:
            self._tell_reused(taken)
        if self.enable_caching:
            for block in taken:
                if block.block_hash is not None:
                    self._announce_removed(self._detach_all(block))
                block.ref_cnt += 1
        else:
            for block in taken:
                block.ref_cnt += 1
        metrics = self.metrics_collector
        if metrics is not None:
            # Per block, in hand-out order: a caching pool first ends the
            # block's previous life (vLLM ends none without caching), then a
            # new one may start.
            for block in taken:
                if self.enable_caching:
                    metrics.on_block_evicted(block)
                metrics.on_block_allocated(block)
        return taken

    def _tell_reused(self, blocks: Iterable[KVCacheBlock]) -> None:
        watched = self._watched
        for block in blocks:
            tell = watched.pop(block.block_id, None)
            if tell is not None:
                tell(block)

    def unpin_blocks(self, blocks: Iterable[KVCacheBlock],
                     on_reuse: Callable[[KVCacheBlock], None]) -> None:
        """Give back one reference of each block while its contents are still
        read: the pool may reuse it (it is free), and `on_reuse` hears when it
        does. Freed ones go to the back of the queue, keyed or not."""
        released = []
        for block in blocks:
            if block.ref_cnt <= 0 or block.is_null:
                raise AssertionError(f"block {block.block_id} is not held; nothing to unpin")
            block.ref_cnt -= 1
            self._watched[block.block_id] = on_reuse
            if not block.ref_cnt:
                released.append(block)
        self.free_block_queue.append_n(released)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """One more holder for each hit block; an evictable one leaves the queue."""
        queue = self.free_block_queue
        count_null = self._count_null
        metrics = self.metrics_collector
        for block in blocks:
            if metrics is not None:
                metrics.on_block_accessed(block)
            if block.is_null:
                if count_null:
                    block.ref_cnt += 1
                continue
            if not block.ref_cnt:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock],
                    skipped: bool = False) -> None:
        """One holder fewer for each block; blocks nobody holds any more go back
        to the free queue. `ordered_blocks` is eviction priority, first
        evicted first; where they land is the profile's free_order (`skipped`:
        the blocks leave a window or state, or a sliding-window table is freed)."""
        if self._routes_foreign:
            self._free_across_pools(ordered_blocks, skipped)
            return
        self._release(ordered_blocks, skipped)

    def _release(self, ordered_blocks: Iterable[KVCacheBlock], skipped: bool = False) -> None:
        front: list[KVCacheBlock] = []
        back: list[KVCacheBlock] = []
        split = self._split_on_skip if skipped else self._split_on_release
        count_null = self._count_null
        for block in ordered_blocks:
            if block.is_null and not count_null:
                continue
            block.ref_cnt -= 1
            # The null block's count is not kept; it never re-enters the queue.
            if block.ref_cnt or block.is_null:
                continue
            if split is None:
                back.append(block)
            elif split and block.block_hash is not None:
                back.append(block)
            else:
                front.append(block)
        if front:
            self.free_block_queue.prepend_n(front)
        if back:
            self.free_block_queue.append_n(back)

    def _free_across_pools(self, ordered_blocks: Iterable[KVCacheBlock],
                           skipped: bool = False) -> None:
        """Blocks of another pool (they carry it) are freed there, after this
        pool's own, each pool's in the given order."""
        own: list[KVCacheBlock] = []
        others: dict[int, tuple[BlockPool, list[KVCacheBlock]]] = {}
        for block in ordered_blocks:
            pool = getattr(block, "pool", self)
            if pool is self:
                own.append(block)
            else:
                others.setdefault(id(pool), (pool, []))[1].append(block)
        self._release(own, skipped)
        for pool, blocks in others.values():
            pool.free_blocks(blocks, skipped)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the keys of the given blocks; holders and queue position stay.
        Iterates a set of the ids, as vLLM does, so removal events come out
        in the same order."""
        for block_id in set(block_ids):
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"no block {block_id} in a pool of {self.num_gpu_blocks}")
            self._evict(self.blocks[block_id])

    def evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Make one block unfindable (its content is about to be replaced),
        announcing each key it loses; False when it had none."""
        return self._evict(block)

    def _evict(self, block: KVCacheBlock) -> bool:
        # A followed block's life ends here too, keyed or not.
        if self.metrics_collector is not None:
            self.metrics_collector.on_block_evicted(block)
        gone = self._detach_all(block)
        self._announce_removed(gone)
        return bool(gone)

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        """Whether one holder may change the block in place: it holds it
        alone and no lookup can find it."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def reset_prefix_cache(self) -> bool:
        """Forget every key; refused (False) while any block is held."""
        if self.free_block_queue.num_free_blocks != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        if self._watched:
            # Every block still read elsewhere is as good as reused now.
            self._tell_reused([self.blocks[i] for i in list(self._watched)])
        for block in self.blocks:
            block.block_hash = block.block_hash_num_tokens = None
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        if self._events is not None:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    # -- reading ---------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        usable = self.num_gpu_blocks - 1  # the null block is never usable
        if not usable:
            return 0
        return 1.0 - self.free_block_queue.num_free_blocks / usable

    def take_events(self) -> list[KVCacheEvent]:
        if self._events is None:
            return []
        drained, self.kv_event_queue = self.kv_event_queue, []
        return drained



def _release_rules(order: FreeOrder, enable_caching: bool) -> tuple[bool | None, bool | None]:
    """How released blocks are split (see BlockPool.free_blocks), for a plain
    release and for blocks a group skips."""
    if order is FreeOrder.APPEND_ALL:
        return None, None
    if order is FreeOrder.UNHASHED_FIRST_ON_SKIP:
        # Skipped blocks are split by their hash; with caching off none has one.
        return None, True
    if order is FreeOrder.UNHASHED_FIRST_IF_CACHING and not enable_caching:
        return None, None
    return enable_caching, enable_caching
