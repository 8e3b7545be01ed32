"""The worker-side block table and slot mapping (vLLM: v1 worker BlockTable).

The scheduler tells the worker, per request and KV cache group, the block ids
it newly allocated; the worker appends them to the request's row, so a row only
grows (a preempted request comes back with a fresh row). Unused entries hold
the null block id (0: vLLM's null block, never handed out), so a kernel that
reads past a row reads a block that belongs to nobody.

A token at position p of a request lives at slot
    block_table[row, p // block_size] * block_size + p % block_size
and the slot mapping lists that slot for every token of a batch, -1 for
padding tokens (which reshape_and_cache skips).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1


@dataclass(slots=True)
class BlockTable:
    block_size: int
    max_num_blocks_per_req: int
    null_block_id: int = NULL_BLOCK_ID
    rows: dict[str, list[int]] = field(default_factory=dict)

    def add_row(self, req_id: str, block_ids: Sequence[int]) -> None:
        """A request (re)starts with these blocks."""
        self.rows[req_id] = []
        self.append_row(req_id, block_ids)

    def append_row(self, req_id: str, block_ids: Sequence[int]) -> None:
        row = self.rows.setdefault(req_id, [])
        if len(row) + len(block_ids) > self.max_num_blocks_per_req:
            raise ValueError(f"request '{req_id}' would hold {len(row) + len(block_ids)} "
                             f"blocks; a row has room for {self.max_num_blocks_per_req}")
        row.extend(block_ids)

    def remove_row(self, req_id: str) -> None:
        self.rows.pop(req_id, None)

    def row(self, req_id: str) -> list[int]:
        return self.rows[req_id]

    def tensor(self, req_ids: Sequence[str], device: torch.device | str = "cpu",
               width: int | None = None) -> torch.Tensor:
        """int32 [len(req_ids), width] (default: the longest row), rows padded
        with the null block id."""
        rows = [self.rows[r] for r in req_ids]
        width = max((len(r) for r in rows), default=0) if width is None else width
        out = torch.full((len(rows), max(width, 1)), self.null_block_id, dtype=torch.int32)
        for i, r in enumerate(rows):
            if len(r) > width:
                raise ValueError(f"a row of {len(r)} blocks does not fit width {width}")
            out[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return out.to(device)

    def slot_mapping(self, req_ids: Sequence[str], positions: Sequence[Sequence[int]],
                     num_padding: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
        """int64 slots of every token: request i's tokens at positions[i], in
        order, then num_padding padding slots (-1)."""
        slots: list[int] = []
        for req_id, pos in zip(req_ids, positions, strict=True):
            row = self.rows[req_id]
            for p in pos:
                index = p // self.block_size
                if index >= len(row):
                    raise ValueError(f"request '{req_id}' has no block for position {p} "
                                     f"({len(row)} blocks of {self.block_size})")
                if row[index] == self.null_block_id:
                    raise ValueError(f"request '{req_id}' would write position {p} "
                                     "into the null block")
                slots.append(row[index] * self.block_size + p % self.block_size)
        slots.extend([PAD_SLOT_ID] * num_padding)
        return torch.tensor(slots, dtype=torch.int64, device=device)
