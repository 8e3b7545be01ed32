"""Token positions to KV cache slots (specs/WORKER_BLOCK_TABLE.md, "Slot mapping").

With context parallelism a manager block spans block_size * world_size
tokens, dealt out to the ranks `interleave` tokens at a time; a rank stores
only its own tokens and maps the others to the padding slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD_SLOT_ID = -1


@dataclass(frozen=True, slots=True)
class ContextParallel:
    """The decode context-parallel world this worker is one rank of."""

    world_size: int = 1
    rank: int = 0
    interleave: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not a rank of a world of {self.world_size}")
        if self.interleave < 1:
            raise ValueError(f"a context-parallel interleave of {self.interleave} tokens")


NO_CONTEXT_PARALLEL = ContextParallel()


def token_rows(query_start_loc: np.ndarray, num_reqs: int) -> np.ndarray:
    """The batch row of every scheduled token."""
    bounds = np.asarray(query_start_loc[:num_reqs + 1], dtype=np.int64)
    return np.repeat(np.arange(num_reqs, dtype=np.int64), np.diff(bounds))


def compute_slots(table: np.ndarray, block_size: int, rows: np.ndarray,
                  positions: np.ndarray, cp: ContextParallel = NO_CONTEXT_PARALLEL) -> np.ndarray:
    """int64 slot of each token (its batch row in `rows`, its position in
    `positions`) through the block ids of `table` ([rows, width] int32)."""
    pos = np.asarray(positions, dtype=np.int64)
    w = cp.world_size
    span = block_size * w  # tokens one manager block covers across the ranks
    column = pos // span
    if column.size and int(column.max()) >= table.shape[1]:
        bad = int(np.argmax(column >= table.shape[1]))
        raise ValueError(f"position {int(pos[bad])} needs entry {int(column[bad])} of a row "
                         f"{table.shape[1]} entries wide")
    blocks = table[rows, column].astype(np.int64)
    if w == 1:
        return blocks * block_size + pos % block_size
    within = pos % span
    owner = (within // cp.interleave) % w
    # The rank's own tokens of this block, packed: whole rounds of
    # `interleave` tokens dealt before, then the place in the current round.
    local = (within // (w * cp.interleave)) * cp.interleave + within % cp.interleave
    return np.where(owner == cp.rank, blocks * block_size + local, PAD_SLOT_ID)
