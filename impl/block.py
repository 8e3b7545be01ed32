"""A KV cache block's metadata (vLLM: KVCacheBlock)."""

from __future__ import annotations


class KVCacheBlock:
    """One block of the pool.

    A plain slotted class rather than a dataclass: the free queue relinks
    prev/next on every allocation and free, and attribute access on slots is the
    cheapest Python offers.
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

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Hash key (block hash + 4-byte group id) while the block is cached.
        self.block_hash: bytes | None = None
        # Prefix length the hash covers (the block's end for a full block).
        self.block_hash_num_tokens: int | None = None
        # Links of the free queue's doubly linked list; None when not free.
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        # The null block (id 0) pads block tables; it is never freed or cached.
        self.is_null = False

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={h})"
