"""A request's block hashes seen at a group's block size (vLLM:
BlockHashListWithBlockSize, resolve_block_hashes).

Requests are hashed every `hash_block_size` tokens (the GCD of the group block
sizes of a hybrid model). A group whose blocks are `scale` times larger reads
one hash per block out of those; how it does so is a version difference
(profile.coarse_block_hash): the last hash inside the block, which already
chains over the whole prefix (0.32), or the concatenation of the block's
hashes (0.17).
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.profiles import CoarseBlockHash


class BlockHashListWithBlockSize:
    __slots__ = ("block_hashes", "scale_factor", "_last")

    def __init__(
        self, block_hashes: Sequence[bytes], hash_block_size: int, target_block_size: int,
        coarse: CoarseBlockHash,
    ) -> None:
        if target_block_size % hash_block_size:
            raise ValueError(f"block size {target_block_size} is not a multiple of the "
                             f"hash block size {hash_block_size}")
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size
        self._last = coarse is CoarseBlockHash.LAST

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    def __getitem__(self, idx: int) -> bytes:
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(idx)
        scale = self.scale_factor
        if self._last:
            return self.block_hashes[(idx + 1) * scale - 1]
        return b"".join(self.block_hashes[idx * scale:(idx + 1) * scale])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def resolve_block_hashes(
    block_hashes: Sequence[bytes],
    hash_block_size: int,
    block_size: int,
    coarse: CoarseBlockHash,
    fine_grained: bool = False,
    alignment_tokens: int | None = None,
) -> Sequence[bytes]:
    """The hashes a group of `block_size` reads. A fine-grained lookup (hits
    at hash-block boundaries inside a block) keeps the raw hashes."""
    if block_size == hash_block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        return block_hashes
    if (
        fine_grained
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size, coarse)
