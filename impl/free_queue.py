"""The free block queue (vLLM: FreeKVCacheBlockQueue).

A doubly linked list threaded through the blocks themselves, between two sentinel
blocks, so that popping the head, removing from the middle (a prefix hit on a
cached free block) and appending/prepending at the ends are O(1) and allocate
nothing. The head is the next block to be handed out (and, if cached, evicted).
"""

from __future__ import annotations

from collections.abc import Iterator

from impl.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    __slots__ = ("num_free_blocks", "head", "tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        prev = self.head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.tail
        self.tail.prev_free_block = prev
        self.num_free_blocks = len(blocks)

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        block = self.head.next_free_block
        nxt = block.next_free_block
        self.head.next_free_block = nxt
        nxt.prev_free_block = self.head
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks, {self.num_free_blocks} free")
        out = []
        block = self.head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.head.next_free_block = block
        block.prev_free_block = self.head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() of a block not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.tail
        self.tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks) -> None:
        last = self.tail.prev_free_block
        n = 0
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
            n += 1
        last.next_free_block = self.tail
        self.tail.prev_free_block = last
        self.num_free_blocks += n

    def prepend_n(self, blocks) -> None:
        first = self.head.next_free_block
        prev = self.head
        n = 0
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
            n += 1
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += n

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Free blocks from head (next to be reused) to tail."""
        block = self.head.next_free_block
        tail = self.tail
        while block is not tail:
            yield block
            block = block.next_free_block

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self]
