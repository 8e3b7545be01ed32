"""What the HiSparse coordinator hands the worker each step; spec §14.4.

Field names are vLLM's: its connector and worker read them.
"""

from dataclasses import dataclass
from typing import NamedTuple

# A page this close to the end of a request's table may still be written by
# a step in flight, so it is never given back to the pool.
ACTIVE_TAIL_PAGES = 2


@dataclass(frozen=True, slots=True)
class SparseKVPageTransfer:
    """One page copied between the host block and its GPU blocks: a
    write-back to the host (`restore` False) or a restore to the GPU."""

    transfer_id: int
    host_block_id: int
    resident_block_ids: tuple[int, ...]
    # Run after the step's forward (a page it writes) or before it.
    after_forward: bool
    restore: bool = False


@dataclass(frozen=True, slots=True)
class SparseKVRowMirror:
    """Rows of one page span written on the GPU this step, to mirror into
    the host page (row = block id x block size + offset)."""

    source_starts: tuple[int, ...]
    destination_start: int
    num_rows: int


@dataclass(frozen=True, slots=True)
class SparseKVResidencyUpdate:
    """The GPU block each listed page is read from, per resident group (the
    null block: read from the host)."""

    pages: list[int]
    block_ids: tuple[list[int], ...]


@dataclass(slots=True)
class SparseKVOffloadCommand:
    """The transfers of one step."""

    page_transfers: list[SparseKVPageTransfer]


class HostBlockCopy(NamedTuple):
    """A copy-on-write copy between two host blocks."""

    src_block_id: int
    dst_block_id: int
