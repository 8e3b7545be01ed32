"""The worker's block tables behind one interface, impl's and vLLM's
(specs/WORKER_BLOCK_TABLE.md); the model runner's moves that drive them are
harness/sources/worker.py.

`WorkerLayout` is what a worker knows of the KV cache groups: block sizes,
row lengths, which groups map tokens to slots, the attention backend's kernel
block size, the context-parallel world. Both sides are built from the same
layout and receive the same row operations; `ImplWorkerTables` is impl's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.core.cache_config import CacheConfig
from impl.profiles import ContextParallelBlockSize, VersionProfile
from impl.worker import kernel_blocks
from impl.worker.block_table import SlotMappingMode
from impl.worker.multi_group import MultiGroupBlockTable
from impl.worker.slot_mapping import ContextParallel

# Kinds whose tokens the worker maps to slots through the decoder's
# positions. Mamba reads state by block (no slots at all); the others' slots
# are not the decoder positions' (cross attention: the encoder's tokens; a
# circular buffer, R-SWA and HiSparse's regions wrap or page), so their
# tables are compared and their slots are not.
SLOTTED_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention",
                           "sliding_window", "chunked_local_attention", "sliding_window_mla"})
STATE_KINDS = frozenset({"mamba"})
# Lookahead and draft tokens may reach a little past max_model_len.
ROW_SLACK_BLOCKS = 64


def slot_world_size(cache: CacheConfig, profile: VersionProfile) -> int:
    """The context-parallel ranks a worker deals a block's tokens out to: the
    ranks the manager's block spans. To 0.25 (blocks of B x dcp x pcp) the
    table interleaves over dcp x pcp ranks; 0.32's and 0.33's pass the DCP
    world only (prefill ranks split a prefill's queries and gather its KV),
    so a PCP-only world maps every token as without parallelism."""
    if profile.context_parallel_block_size is ContextParallelBlockSize.DCP_TIMES_PCP:
        return cache.dcp_world_size * cache.pcp_world_size
    return cache.dcp_world_size


@dataclass(frozen=True, slots=True)
class WorkerLayout:
    block_sizes: tuple[int, ...]
    max_num_blocks: tuple[int, ...]
    modes: tuple[SlotMappingMode, ...]
    slotted: tuple[bool, ...]  # whether a group's slot mapping is compared
    # The attention backend's block size per group (None: the manager's).
    kernel_block_sizes: tuple[int | None, ...]
    max_num_reqs: int
    max_num_batched_tokens: int
    cp_world_size: int = 1
    cp_interleaves: tuple[int, ...] = (1,)

    @classmethod
    def of(cls, cache: CacheConfig, max_num_reqs: int, profile: VersionProfile,
           max_num_batched_tokens: int = 8192) -> WorkerLayout:
        """The layout the differential runs a cache config with: every
        attention group split into kernel blocks of half its block size (the
        split is checked on every case), context parallelism over the ranks
        the release shards KV slots across, each with an interleave of 1
        token and of a block."""
        world = slot_world_size(cache, profile)
        sizes = tuple(g.block_size for g in cache.groups)
        blocks = tuple(-(-cache.max_model_len // (b * world)) + ROW_SLACK_BLOCKS for b in sizes)
        modes = tuple(SlotMappingMode.NONE if g.kind in STATE_KINDS
                      else SlotMappingMode.TOKEN_TO_KV_SLOT for g in cache.groups)
        slotted = tuple(g.kind in SLOTTED_KINDS for g in cache.groups)
        kernel = tuple(b // 2 if s and b % 2 == 0 else None for b, s in zip(sizes, slotted))
        interleaves = (1,) if world == 1 else tuple(sorted({1, min(sizes)}))
        return cls(sizes, blocks, modes, slotted, kernel, max_num_reqs,
                   max_num_batched_tokens, world, interleaves)

    def context_parallel_ranks(self) -> list[ContextParallel]:
        """Every (rank, interleave) a slot mapping is compared for."""
        return [ContextParallel(self.cp_world_size, r, i)
                for i in self.cp_interleaves for r in range(self.cp_world_size)]


@dataclass(slots=True)
class GroupView:
    """One group's table as it stands: the arrays are the side's own (read
    them before the next operation)."""

    table: np.ndarray  # int32 [max_num_reqs, width]
    num_blocks_per_row: np.ndarray  # int32 [max_num_reqs]


class ImplWorkerTables:
    name = "impl"

    def __init__(self, layout: WorkerLayout) -> None:
        self.layout = layout
        self.tables = MultiGroupBlockTable.build(layout.max_num_reqs, layout.block_sizes,
                                                 layout.max_num_blocks, layout.modes)
        self.ranks = layout.context_parallel_ranks()

    def add_row(self, block_ids, row: int) -> None:
        self.tables.add_row(block_ids, row)

    def append_row(self, block_ids, row: int) -> None:
        self.tables.append_row(block_ids, row)

    def clear_row(self, row: int) -> None:
        self.tables.clear_row(row)

    def move_row(self, src: int, tgt: int) -> None:
        self.tables.move_row(src, tgt)

    def swap_row(self, a: int, b: int) -> None:
        self.tables.swap_row(a, b)

    def views(self) -> list[GroupView]:
        return [GroupView(t.table, t.num_blocks_per_row) for t in self.tables.block_tables]

    def slot_mappings(self, group: int, num_reqs: int, query_start_loc: np.ndarray,
                      positions: np.ndarray) -> list[np.ndarray]:
        """The group's slots of the batch's tokens, one array per rank of
        layout.context_parallel_ranks()."""
        table = self.tables[group]
        out = []
        for cp in self.ranks:
            table.cp = cp
            out.append(table.compute_slot_mapping(num_reqs, query_start_loc, positions))
        return out

    def kernel_table(self, group: int, num_reqs: int, cols: int) -> np.ndarray:
        table = self.tables[group]
        return kernel_blocks.kernel_block_table(table.table[:num_reqs, :cols], table.block_size,
                                  self.layout.kernel_block_sizes[group])
