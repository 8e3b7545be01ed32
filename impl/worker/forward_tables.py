"""The block tables a forward pass reads, gathered from the per-request rows
(specs/WORKER_BLOCK_TABLE.md, "Forward-pass tables").

The new model runner keeps a row per request state and copies the batch's
rows, in batch order, into the tables the attention kernels read. From 0.33
(profile field `worker_nulls_below_window`) a sliding-window group's entries
that lie wholly below the window of the request's first scheduled token are
the null block there: the sliding-window manager may have freed and reused
those blocks, and a kernel tile that straddles the window's start would still
load them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from impl.kv_cache_spec import KVCacheSpec, SlidingWindowSpec
from impl.profiles import VersionProfile
from impl.uniform_type_spec import UniformTypeKVCacheSpecs
from impl.worker.block_table import NULL_BLOCK_ID, BlockTable


def window_reach(spec: KVCacheSpec | UniformTypeKVCacheSpecs, profile: VersionProfile) -> int:
    """Tokens below a request's first scheduled position a group's attention
    may still read; 0: the group's entries are never nulled."""
    layer = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    if not profile.worker_nulls_below_window or not isinstance(layer, SlidingWindowSpec):
        return 0
    return layer.retained_tokens


def entries_below_window(first_position: int, reach: int, block_size: int) -> int:
    """How many leading entries no query from `first_position` on can read."""
    if reach <= 0:
        return 0
    return max(first_position - reach, 0) // block_size


def gather_forward_table(table: BlockTable, rows: Sequence[int],
                         first_positions: Sequence[int], reach: int = 0,
                         cp_world_size: int = 1) -> np.ndarray:
    """int32 [len(rows), width]: each batch request's row (its used entries;
    0 past them), leading entries below its window nulled. Under context
    parallelism an entry does not cover a contiguous run of positions, so
    nothing is nulled."""
    out = np.full((len(rows), table.width), NULL_BLOCK_ID, dtype=np.int32)
    if cp_world_size > 1:
        reach = 0
    for i, (row, first) in enumerate(zip(rows, first_positions, strict=True)):
        n = int(table.num_blocks_per_row[row])
        skip = min(entries_below_window(int(first), reach, table.block_size), n)
        out[i, skip:n] = table.table[row, skip:n]
    return out
