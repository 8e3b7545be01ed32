"""Map from block hash (+ group id) to the cached block(s) carrying it.

vLLM: BlockHashToBlockMap. Identical blocks are not de-duplicated when cached
(block tables are append-only, so a block id, once handed out, never changes), so
one key may map to several blocks: a lookup returns the first one cached.
The value is a block, or a dict {block_id: block} only when there are several,
which keeps the common case free of an inner dict.
"""

from __future__ import annotations

from impl.block import KVCacheBlock


class BlockHashToBlockMap:
    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or blocks.__class__ is KVCacheBlock:
            return blocks
        return next(iter(blocks.values()))

    def contain(self, key: bytes, block_id: int) -> bool:
        blocks = self._cache.get(key)
        if blocks is None:
            return False
        if blocks.__class__ is KVCacheBlock:
            return blocks.block_id == block_id
        return block_id in blocks

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif blocks.__class__ is KVCacheBlock:
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove `block_id` under `key`; return it, or None if it was not there."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if blocks.__class__ is KVCacheBlock:
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def items(self):
        """(key, block) for every cached block; for the invariant checker."""
        for key, blocks in self._cache.items():
            if blocks.__class__ is KVCacheBlock:
                yield key, blocks
            else:
                for block in blocks.values():
                    yield key, block

    def __len__(self) -> int:
        return len(self._cache)
