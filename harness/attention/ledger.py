"""The block ledger: where every token's K/V must be, from the trace alone.

impl's kernels, the float64 reference and vLLM's ops all read the same block
table and write through the same slot mapping, so a wrong block id in either
(a swapped table entry, a slot off by one, a prefix hit handing back another
prefix's block) moves all of them alike and no output comparison can see it.
The ledger is kept apart from all of them: the rows come from the trace's own
`lookup` and `allocate` answers (steps.StepBatch.trace_rows), and per slot of
one KV cache group it remembers

- which token was written there: its identity, the hash of the token and
  everything before it (with the request's salt and LoRA: what makes two
  tokens' keys and values the same in a real model, and what makes vLLM
  share a block);
- a hash of the bytes written (the row as the cache holds it, K and V).

Per batch it then checks that (1) the slot mapping the kernels get puts each
new token where the trace's blocks say; (2) every block-table entry covering a
position a query sees is the block the trace's answers give; (3) every such
position holds the identity of the request's own token there, and the cache
still holds, byte for byte, what was written to that slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from harness.attention.seeded import _mix, _signed

SLOT_MAPPING = "slot mapping"
BLOCK_TABLE = "block table"
BLOCK_CONTENT = "block content"

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@lru_cache(maxsize=16)
def _weights(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0x1ED6E4)
    w = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g, dtype=torch.int64)
    return w | 1


def row_hashes(key: torch.Tensor, value: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [rows]: a hash of each row's bytes (key [rows, ...], and value)."""
    def one(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().cpu().contiguous()
        bits = x.view(_INT_VIEW[x.element_size()]).reshape(x.shape[0], -1).to(torch.int64)
        return _mix((bits * _weights(bits.shape[1])).sum(1))

    h = one(key)
    if value is not None:
        h = _mix(h * _signed(0x9E3779B97F4A7C15) + one(value))
    return h


def identities(hashes: list[int]) -> torch.Tensor:
    return torch.tensor([_signed(h) for h in hashes], dtype=torch.int64)


@dataclass(frozen=True, slots=True)
class LedgerProblem:
    check: str  # SLOT_MAPPING, BLOCK_TABLE or BLOCK_CONTENT
    message: str
    req_id: str


class BlockLedger:
    """The ledger of one KV cache group's slots."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        n = num_blocks * block_size
        self.block_size = block_size
        self.identity = torch.zeros(n, dtype=torch.int64)
        self.content = torch.zeros(n, dtype=torch.int64)
        self.written = torch.zeros(n, dtype=torch.bool)
        # Written before the trace named the token (a speculative position):
        # its identity is not known, only its bytes are checked.
        self.provisional = torch.zeros(n, dtype=torch.bool)
        self.step = torch.full((n,), -1, dtype=torch.int64)
        self.position = torch.full((n,), -1, dtype=torch.int64)
        self.writer = torch.full((n,), -1, dtype=torch.int64)
        self._names: list[str] = []
        self._index: dict[str, int] = {}

    def _who(self, slot: int) -> str:
        if not bool(self.written[slot]):
            return "nothing written there"
        w = int(self.writer[slot])
        name = self._names[w] if w >= 0 else "(setup)"
        return f"request '{name}' position {int(self.position[slot])} " \
               f"(written at step {int(self.step[slot])})"

    def _where(self, slot: int) -> str:
        return f"block {slot // self.block_size} offset {slot % self.block_size}"

    # -- (1) writes -------------------------------------------------------------------

    def slots_of(self, trace_row: list[int] | None, req_id: str, positions: torch.Tensor
                 ) -> torch.Tensor | LedgerProblem:
        """Where the trace's blocks put a request's positions."""
        if not len(positions):
            return torch.empty(0, dtype=torch.int64)
        row = torch.tensor(trace_row or [], dtype=torch.int64)
        index = positions // self.block_size
        last = int(index.max())
        if last >= len(row):
            return LedgerProblem(SLOT_MAPPING, f"request '{req_id}' has {len(row)} blocks in "
                                 f"the trace's answers, position {int(positions.max())} "
                                 f"needs {last + 1}", req_id)
        blocks = row[index]
        return blocks * self.block_size + positions % self.block_size

    def check_writes(self, req_id: str, positions: torch.Tensor, kernel_slots: torch.Tensor,
                     trace_row: list[int] | None) -> LedgerProblem | torch.Tensor:
        """The trace's slots of the positions, or a problem if the kernels'
        differ or fall in the null block."""
        want = self.slots_of(trace_row, req_id, positions)
        if isinstance(want, LedgerProblem):
            return want
        if bool((want < self.block_size).any()):
            bad = int((want < self.block_size).nonzero()[0])
            return LedgerProblem(SLOT_MAPPING, f"request '{req_id}' position "
                                 f"{int(positions[bad])} falls in the null block of the "
                                 "trace's answers", req_id)
        got = kernel_slots.cpu().to(torch.int64)
        if not torch.equal(got, want):
            bad = int((got != want).nonzero()[0])
            return LedgerProblem(SLOT_MAPPING, f"request '{req_id}' position "
                                 f"{int(positions[bad])}: the kernels write slot "
                                 f"{int(got[bad])} ({self._where(int(got[bad]))}), the trace's "
                                 f"blocks put it at slot {int(want[bad])} "
                                 f"({self._where(int(want[bad]))})", req_id)
        return want

    def record(self, slots: torch.Tensor, ids: torch.Tensor, contents: torch.Tensor,
               req_id: str | None, positions: torch.Tensor, step: int,
               num_known: int | None = None) -> None:
        """num_known: positions from this one on were not named yet."""
        if req_id is None:
            writer = -1
        else:
            if req_id not in self._index:
                self._index[req_id] = len(self._names)
                self._names.append(req_id)
            writer = self._index[req_id]
        self.identity[slots] = ids
        self.content[slots] = contents
        self.written[slots] = True
        self.provisional[slots] = (positions >= num_known) if num_known is not None else False
        self.step[slots] = step
        self.position[slots] = positions
        self.writer[slots] = writer

    # -- (2), (3) reads ---------------------------------------------------------------

    def check_reads(self, req_id: str, positions: torch.Tensor, ids: torch.Tensor,
                    kernel_row: torch.Tensor, trace_row: list[int] | None,
                    cache_hashes) -> LedgerProblem | None:
        """positions: what the request's queries see (static sinks excluded);
        ids: their identities; kernel_row: the block-table row the kernels
        get; cache_hashes(slots) -> the row hashes of what impl's cache holds."""
        if not len(positions):
            return None
        bs = self.block_size
        index = positions // bs
        used = index.unique()
        kernel = kernel_row.cpu().to(torch.int64)
        want = self.slots_of(trace_row, req_id, used * bs)
        if isinstance(want, LedgerProblem):
            return want
        want_blocks = want // bs
        got_blocks = kernel[used] if int(used.max()) < len(kernel) else None
        if got_blocks is None or not torch.equal(got_blocks, want_blocks):
            if got_blocks is None:
                return LedgerProblem(BLOCK_TABLE, f"request '{req_id}': its block-table row "
                                     f"has {len(kernel)} entries, position "
                                     f"{int(positions.max())} needs {int(used.max()) + 1}",
                                     req_id)
            bad = int((got_blocks != want_blocks).nonzero()[0])
            return LedgerProblem(BLOCK_TABLE, f"request '{req_id}': entry {int(used[bad])} of "
                                 f"its block-table row is block {int(got_blocks[bad])}, the "
                                 f"trace's answers give block {int(want_blocks[bad])}", req_id)
        return self.check_slots(req_id, positions, kernel[index] * bs + positions % bs, ids,
                                cache_hashes)

    def check_slots(self, req_id: str, positions: torch.Tensor, slots: torch.Tensor,
                    ids: torch.Tensor, cache_hashes) -> LedgerProblem | None:
        """Each slot holds the token it should (identity) and what was
        written there (bytes)."""
        ok = self.written[slots] & ((self.identity[slots] == ids) | self.provisional[slots])
        if not bool(ok.all()):
            bad = int((~ok).nonzero()[0])
            slot = int(slots[bad])
            return LedgerProblem(BLOCK_CONTENT, f"request '{req_id}' position "
                                 f"{int(positions[bad])} reads {self._where(slot)}, which "
                                 f"holds {self._who(slot)}, not this request's token", req_id)
        same = cache_hashes(slots) == self.content[slots]
        if not bool(same.all()):
            bad = int((~same).nonzero()[0])
            slot = int(slots[bad])
            return LedgerProblem(BLOCK_CONTENT, f"{self._where(slot)} holds other bytes than "
                                 f"were written there by {self._who(slot)}", req_id)
        return None
