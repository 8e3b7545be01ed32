"""One block of the KV cache pool (vLLM's name: KVCacheBlock); specs/KV_CACHE_MANAGER.md §1."""


class KVCacheBlock:
    """A run of token slots and the bookkeeping the pool keeps about it.

    Slots, not a dataclass: the free queue relinks two of these fields on
    every allocation and release, and a pool may hold a million blocks, so the
    cheapest attributes Python has and no per-block dict. Equality is
    identity: two blocks are never interchangeable.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "block_hash_num_tokens",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int, ref_cnt: int = 0, *, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        # Cache key (hash bytes + 4-byte group id) while prefix lookups can
        # find the block; the prefix length it stands for.
        self.block_hash = None
        self.block_hash_num_tokens = None
        # Free-queue neighbours; both None while the block is not queued.
        self.prev_free_block = None
        self.next_free_block = None
        self.is_null = is_null

    def set_block_hash(self, block_hash, num_tokens: int | None = None) -> None:
        if self.block_hash is not None:
            raise AssertionError(f"block {self.block_id} is keyed already; "
                                 "drop its key before giving it another")
        self.block_hash = block_hash
        self.block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        self.block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self) -> str:
        key = self.block_hash
        short = key.hex()[:8] if isinstance(key, bytes) else key
        return f"<block {self.block_id} refs={self.ref_cnt} key={short}>"


# Blocks in token order: a request's block table, or a run of blocks.
BlockList = list[KVCacheBlock]


def null_head_len(blocks) -> int:
    """How many null entries lead a block table (a window's skipped prefix)."""
    n = 0
    while n < len(blocks) and blocks[n].is_null:
        n += 1
    return n
