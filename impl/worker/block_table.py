"""One KV cache group's worker block table (specs/WORKER_BLOCK_TABLE.md).

Rows are addressed by index: which request holds which row is the model
runner's concern. Unused entries are 0, the null block, so that reading past
a row's blocks reads a block no request owns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from impl.worker.slot_mapping import (
    NO_CONTEXT_PARALLEL,
    ContextParallel,
    compute_slots,
    token_rows,
)

NULL_BLOCK_ID = 0
# Rows of token-slotted groups cover whole units of this many tokens.
TOKEN_ALIGNMENT = 128


class SlotMappingMode(Enum):
    TOKEN_TO_KV_SLOT = "token_to_kv_slot"
    # The group reads per-request state by block (Mamba): no token slots.
    NONE = "none"


def table_width(max_num_blocks: int, block_size: int,
                token_alignment: int | None = TOKEN_ALIGNMENT) -> int:
    """Entries per row: max_num_blocks, rounded up so that a row spans a whole
    number of `token_alignment`-token units (None: not rounded)."""
    if token_alignment is None:
        return max_num_blocks
    if token_alignment <= 0:
        raise ValueError(f"a token alignment of {token_alignment}")
    unit = token_alignment // math.gcd(token_alignment, block_size)
    return -(-max_num_blocks // unit) * unit


@dataclass(slots=True)
class BlockTable:
    block_size: int
    max_num_reqs: int
    width: int
    mode: SlotMappingMode = SlotMappingMode.TOKEN_TO_KV_SLOT
    cp: ContextParallel = NO_CONTEXT_PARALLEL
    table: np.ndarray = field(init=False)
    num_blocks_per_row: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.table = np.zeros((self.max_num_reqs, self.width), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(self.max_num_reqs, dtype=np.int32)

    def append_row(self, block_ids: Sequence[int], row: int) -> None:
        n = len(block_ids)
        if not n:
            return
        start = int(self.num_blocks_per_row[row])
        if start + n > self.width:
            raise ValueError(f"row {row} would hold {start + n} blocks; it has room "
                             f"for {self.width}")
        self.table[row, start:start + n] = block_ids
        self.num_blocks_per_row[row] = start + n

    def add_row(self, block_ids: Sequence[int], row: int) -> None:
        # Entries past the new count keep their old ids: the count says what
        # is in use (as in vLLM, where a re-added row is not cleared first).
        self.num_blocks_per_row[row] = 0
        self.append_row(block_ids, row)

    def clear_row(self, row: int) -> None:
        self.table[row, :self.num_blocks_per_row[row]] = NULL_BLOCK_ID
        self.num_blocks_per_row[row] = 0

    def move_row(self, src: int, tgt: int) -> None:
        n = int(self.num_blocks_per_row[src])
        self.table[tgt, :n] = self.table[src, :n]
        self.num_blocks_per_row[tgt] = n
        # The vacated row must not keep naming blocks it no longer owns.
        self.table[src, :n] = NULL_BLOCK_ID
        self.num_blocks_per_row[src] = 0

    def swap_row(self, a: int, b: int) -> None:
        self.table[[a, b]] = self.table[[b, a]]
        self.num_blocks_per_row[[a, b]] = self.num_blocks_per_row[[b, a]]

    def clear(self) -> None:
        self.table.fill(NULL_BLOCK_ID)

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: np.ndarray,
                             positions: np.ndarray) -> np.ndarray | None:
        """The slot of every scheduled token (None for a group without slots)."""
        if self.mode is SlotMappingMode.NONE:
            return None
        return compute_slots(self.table, self.block_size, token_rows(query_start_loc, num_reqs),
                             positions, self.cp)
