"""Which row of the worker's block tables each request holds: the model
runner's persistent batch (vLLM 0.32's InputBatch add/remove/condense and the
decode-first reorder; specs/WORKER_BLOCK_TABLE.md, "The model runner's
moves"). It sends every row operation to each side's tables."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class BatchRows:
    tables: Sequence  # each side's tables (harness/backends/worker_tables.py)
    row_of: dict[str, int] = field(default_factory=dict)
    req_at: dict[int, str] = field(default_factory=dict)
    # Rows left by removed requests, ascending: the lowest is refilled first.
    removed: list[int] = field(default_factory=list)
    # Rows ever used: the part of the tables any operation touched.
    high_water: int = 0

    @property
    def num_reqs(self) -> int:
        return len(self.row_of)

    def _each(self, op: str, *args) -> None:
        for t in self.tables:
            getattr(t, op)(*args)

    def remove(self, req: str) -> None:
        row = self.row_of.pop(req, None)
        if row is None:
            return
        del self.req_at[row]
        bisect.insort(self.removed, row)
        self._each("clear_row", row)

    def append(self, req: str, block_ids: Sequence[Sequence[int]]) -> None:
        if any(block_ids):
            self._each("append_row", block_ids, self.row_of[req])

    def add(self, req: str, block_ids: Sequence[Sequence[int]], max_num_reqs: int) -> None:
        row = self.removed.pop(0) if self.removed else self.num_reqs
        if row >= max_num_reqs:
            raise ValueError(f"request '{req}' would be request {row + 1} of a batch of "
                             f"at most {max_num_reqs}")
        self.row_of[req], self.req_at[row] = row, req
        self.high_water = max(self.high_water, row + 1)
        self._each("add_row", block_ids, row)

    def condense(self) -> None:
        """Fill the lowest empty rows from the highest held ones."""
        if not self.num_reqs:
            self.removed.clear()
            return
        last = self.num_reqs + len(self.removed) - 1
        while self.removed:
            while last not in self.req_at:  # every row below is held or removed
                last -= 1
            empty = self.removed[0]
            if empty >= last:
                break
            self.removed.pop(0)
            req = self.req_at.pop(last)
            self.row_of[req], self.req_at[empty] = empty, req
            self._each("move_row", last, empty)
            last -= 1
        self.removed.clear()

    def swap(self, a: int, b: int) -> None:
        ra, rb = self.req_at[a], self.req_at[b]
        self.req_at[a], self.req_at[b] = rb, ra
        self.row_of[ra], self.row_of[rb] = b, a
        self._each("swap_row", a, b)

    def reorder(self, region_of: dict[str, int]) -> None:
        """Sort the batch by region (0 first), stably, by following each
        cycle of the permutation with swaps."""
        n = self.num_reqs
        regions = [region_of[self.req_at[i]] for i in range(n)]
        target = sorted(regions)
        out_of_place = [i for i in range(n) if regions[i] != target[i]]
        if not out_of_place:
            return
        # The out-of-place rows, in region order, go to the out-of-place slots in row order.
        sources = sorted(out_of_place, key=lambda i: regions[i])
        dest = dict(zip(sources, out_of_place))
        for src in list(dest):
            dst = dest[src]
            while src != dst:
                self.swap(src, dst)
                nxt = dest.get(dst, dst)
                dest[dst] = dst
                dst = nxt
