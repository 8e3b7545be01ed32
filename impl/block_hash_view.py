"""A request's hashes read at a larger block size; specs/KV_CACHE_MANAGER.md §4.

A hybrid model hashes requests every `hash_block_size` tokens, the GCD of its
group block sizes. A group whose block spans `k` hash blocks needs one name
per block; which one is a version difference (profile.coarse_block_hash).
vLLM's name for the view is BlockHashListWithBlockSize.
"""

from collections.abc import Iterator, Sequence

from impl.profiles import CoarseBlockHash


class BlockHashListWithBlockSize:
    """Lazy: reads the underlying list on access, so a request's view stays
    current as hashes are appended."""

    __slots__ = ("block_hashes", "scale_factor", "_by_last")

    def __init__(self, block_hashes: Sequence, hash_block_size: int,
                 target_block_size: int, coarse: CoarseBlockHash) -> None:
        k, rest = divmod(target_block_size, hash_block_size)
        if rest:
            raise ValueError(f"a {target_block_size}-token block is not a whole number "
                             f"of {hash_block_size}-token hash blocks")
        self.block_hashes = block_hashes
        self.scale_factor = k
        # The last hash inside a block chains over its whole prefix already.
        self._by_last = coarse is CoarseBlockHash.LAST

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    def __getitem__(self, index: int):
        count = len(self)
        if index < 0:
            index += count
        if index < 0 or index >= count:
            raise IndexError(f"block {index} of {count}")
        k = self.scale_factor
        if self._by_last:
            return self.block_hashes[index * k + k - 1]
        return b"".join(self.block_hashes[index * k:index * k + k])

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))


def fine_grained_lookup(alignment_tokens: int | None, block_size: int) -> bool:
    """Whether hits may end at hash boundaries inside a block: the alignment
    is a proper divisor of the block size."""
    return (alignment_tokens is not None and alignment_tokens < block_size
            and block_size % alignment_tokens == 0)


def resolve_block_hashes(block_hashes: Sequence, hash_block_size: int, block_size: int,
                         coarse: CoarseBlockHash, fine_grained: bool = False,
                         alignment_tokens: int | None = None) -> Sequence:
    """The hashes a group of `block_size` looks up: the raw list at the hash
    granularity (or for a fine-grained lookup, which probes inside blocks),
    else a view with one hash per block."""
    if hash_block_size == block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        # Read at another granularity, its entries would name other blocks.
        if block_hashes.scale_factor * hash_block_size != block_size:
            raise AssertionError(
                f"hash view spans {block_hashes.scale_factor} hash blocks per entry; "
                f"a {block_size}-token group over {hash_block_size}-token hashes needs "
                f"{block_size / hash_block_size:g}")
        return block_hashes
    if fine_grained and fine_grained_lookup(alignment_tokens, block_size):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size, coarse)
