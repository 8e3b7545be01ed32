"""A block table per KV cache group, driven together (vLLM: MultiGroupBlockTable)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from impl.worker.block_table import BlockTable, SlotMappingMode, table_width
from impl.worker.slot_mapping import NO_CONTEXT_PARALLEL, ContextParallel


@dataclass(slots=True)
class MultiGroupBlockTable:
    block_tables: list[BlockTable]

    @classmethod
    def build(cls, max_num_reqs: int, block_sizes: Sequence[int],
              max_num_blocks: Sequence[int],
              modes: Sequence[SlotMappingMode] | None = None,
              cp: ContextParallel = NO_CONTEXT_PARALLEL) -> MultiGroupBlockTable:
        modes = list(modes) if modes is not None else (
            [SlotMappingMode.TOKEN_TO_KV_SLOT] * len(block_sizes))
        if not len(modes) == len(max_num_blocks) == len(block_sizes):
            raise ValueError(f"{len(block_sizes)} block sizes, {len(max_num_blocks)} row "
                             f"lengths and {len(modes)} slot mapping modes: one each per group")
        tables = []
        for size, n, mode in zip(block_sizes, max_num_blocks, modes):
            # State groups address a block per request state: no token units.
            align = None if mode is SlotMappingMode.NONE else 128
            tables.append(BlockTable(size, max_num_reqs, table_width(n, size, align), mode, cp))
        return cls(tables)

    def __getitem__(self, group: int) -> BlockTable:
        return self.block_tables[group]

    def __len__(self) -> int:
        return len(self.block_tables)

    def append_row(self, block_ids: Sequence[Sequence[int]], row: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=True):
            table.append_row(ids, row)

    def add_row(self, block_ids: Sequence[Sequence[int]], row: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=True):
            table.add_row(ids, row)

    def clear_row(self, row: int) -> None:
        for table in self.block_tables:
            table.clear_row(row)

    def move_row(self, src: int, tgt: int) -> None:
        for table in self.block_tables:
            table.move_row(src, tgt)

    def swap_row(self, a: int, b: int) -> None:
        for table in self.block_tables:
            table.swap_row(a, b)

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: np.ndarray,
                             positions: np.ndarray) -> list[np.ndarray | None]:
        return [t.compute_slot_mapping(num_reqs, query_start_loc, positions)
                for t in self.block_tables]
