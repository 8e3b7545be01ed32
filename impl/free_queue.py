"""The queue of free blocks (vLLM's name: FreeKVCacheBlockQueue); specs/KV_CACHE_MANAGER.md §2.

The list lives in the blocks' own `prev_free_block` / `next_free_block`
fields, bracketed by two sentinel blocks, so taking a block out of the middle
(a prefix hit on an evictable block) is as cheap as popping the front, and no
operation creates an object. Front = reused (and evicted) first.
"""

from collections.abc import Iterable, Iterator

from impl.block import BlockList, KVCacheBlock


class CorruptFreeQueue(AssertionError):
    """The list's sentinels lost their links: the queue can no longer be trusted."""


class FreeKVCacheBlockQueue:
    __slots__ = ("num_free_blocks", "fake_free_list_head", "fake_free_list_tail")

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.num_free_blocks = 0
        self._splice(self.fake_free_list_head, blocks, self.fake_free_list_tail)

    # -- taking blocks out ---------------------------------------------------

    def popleft(self) -> KVCacheBlock:
        if not self.num_free_blocks:
            raise ValueError("the free queue is empty")
        front = self.fake_free_list_head
        first = front.next_free_block
        after = first.next_free_block
        front.next_free_block = after
        after.prev_free_block = front
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> BlockList:
        if not 0 <= n <= self.num_free_blocks:
            raise CorruptFreeQueue(f"asked for {n} of {self.num_free_blocks} free blocks")
        taken = [None] * n
        cursor = self.fake_free_list_head.next_free_block
        for i in range(n):
            taken[i] = cursor
            after = cursor.next_free_block
            cursor.prev_free_block = cursor.next_free_block = None
            cursor = after
        if n:
            front = self.fake_free_list_head
            front.next_free_block = cursor
            cursor.prev_free_block = front
            self.num_free_blocks -= n
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        before, after = block.prev_free_block, block.next_free_block
        if before is None or after is None:
            raise RuntimeError(f"{block!r} is not in the free queue")
        before.next_free_block = after
        after.prev_free_block = before
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    # -- putting blocks back ---------------------------------------------------

    def _last(self) -> KVCacheBlock:
        last = self.fake_free_list_tail.prev_free_block
        if last is None:
            raise CorruptFreeQueue("the tail sentinel has no predecessor")
        return last

    def append(self, block: KVCacheBlock) -> None:
        last = self._last()
        back = self.fake_free_list_tail
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = back
        back.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """At the back, in the given order."""
        self._splice(self._last(), blocks, self.fake_free_list_tail)

    def prepend_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """At the front, in the given order (the first given is reused first)."""
        old_first = self.fake_free_list_head.next_free_block
        if old_first is None:
            raise CorruptFreeQueue("the head sentinel has no successor")
        self._splice(self.fake_free_list_head, blocks, old_first)

    def _splice(self, after: KVCacheBlock, blocks: Iterable[KVCacheBlock],
                before: KVCacheBlock) -> None:
        """Link `blocks`, in order, between the neighbours `after` and `before`."""
        count = 0
        for block in blocks:
            after.next_free_block = block
            block.prev_free_block = after
            after = block
            count += 1
        after.next_free_block = before
        before.prev_free_block = after
        self.num_free_blocks += count

    # -- reading ------------------------------------------------------------------

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Front (next reused) to back."""
        back = self.fake_free_list_tail
        cursor = self.fake_free_list_head.next_free_block
        while cursor is not back:
            yield cursor
            cursor = cursor.next_free_block

    def get_all_free_blocks(self) -> BlockList:
        return list(self)

    def block_ids(self) -> list[int]:
        return [block.block_id for block in self]
