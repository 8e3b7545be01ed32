"""Which blocks a cache key finds (vLLM's name: BlockHashToBlockMap); specs §5.

Equal content is not merged: a block id handed to a request stays in its
block table, so two requests that filled identical blocks each keep their
own, and both are findable under one key. A lookup returns the earliest.

Storage: key -> block when one block has it (nearly always), key -> {id:
block} when several do; the common case then costs no inner container. (A
dict is what tells them apart: blocks may be of a KVCacheBlock subclass.)
"""

from collections.abc import Iterator

from impl.block import KVCacheBlock


class BlockHashToBlockMap:
    # `_cache` keeps the name vLLM's own tests reach into.
    __slots__ = ("_cache", "_entries")

    def __init__(self) -> None:
        self._cache: dict = {}
        # (key, block) entries, kept so that a checker need not count them.
        self._entries = 0

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        found = self._cache.get(key)
        if found is None or type(found) is not dict:
            return found
        for block in found.values():
            return block
        return None

    def prefix_run(self, block_hashes, suffix: bytes) -> list[KVCacheBlock]:
        """For the hashes in order (each + suffix), the block get_one_block
        would give, up to the first key with none: the cached prefix of a
        chain of hashes. (The loop of every plain prefix lookup, kept here so
        it reads the storage directly.)"""
        store = self._cache
        run = []
        for block_hash in block_hashes:
            found = store.get(block_hash + suffix)
            if found is None:
                break
            if type(found) is dict:
                found = next(iter(found.values()))
            run.append(found)
        return run

    def contain(self, key: bytes, block_id: int) -> bool:
        found = self._cache.get(key)
        if found is None:
            return False
        if type(found) is not dict:
            return found.block_id == block_id
        return block_id in found

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        store = self._cache
        found = store.get(key)
        if found is None:
            store[key] = block
        elif type(found) is not dict:
            if found is block:
                return
            store[key] = {found.block_id: found, block.block_id: block}
        elif block.block_id in found:
            found[block.block_id] = block
            return
        else:
            found[block.block_id] = block
        self._entries += 1

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Take block `block_id` out from under `key`; None when it is not
        there (other blocks under the key stay)."""
        store = self._cache
        found = store.get(key)
        if found is None:
            return None
        if type(found) is not dict:
            if found.block_id != block_id:
                return None
            del store[key]
            self._entries -= 1
            return found
        block = found.pop(block_id, None)
        if not found:
            del store[key]
        if block is not None:
            self._entries -= 1
        return block

    def items(self) -> Iterator[tuple[bytes, KVCacheBlock]]:
        """Every (key, block) entry."""
        for key, found in self._cache.items():
            if type(found) is not dict:
                yield key, found
            else:
                for block in found.values():
                    yield key, block

    def clear(self) -> None:
        self._cache.clear()
        self._entries = 0

    def num_entries(self) -> int:
        return self._entries

    def __len__(self) -> int:
        """The number of keys (vLLM's meaning), not of entries."""
        return len(self._cache)
