"""What the block tables of particular attention kinds must look like;
specs/KV_CACHE_MANAGER.md §13 rule 7. impl/invariants.py checks every table
of a group of such a kind after each call that changed it.
"""

from collections.abc import Callable, Sequence

from impl.block import KVCacheBlock
from impl.managers.circular_buffer import CircularBufferManager
from impl.managers.rswa import RSWAManager

# A rule returns what is wrong with a table, or None.
TableRule = Callable[[Sequence[KVCacheBlock]], str | None]


def _one_ring(table: Sequence[KVCacheBlock]) -> str | None:
    """A circular buffer is one real block for the request's whole life,
    never findable by a prefix lookup."""
    if len(table) > 1:
        return f"a circular buffer holds {len(table)} blocks; a ring is one"
    if table and table[0].is_null:
        return "a circular buffer holds the null block"
    if table and table[0].block_hash is not None:
        return f"circular buffer block {table[0].block_id} is cached"
    return None


def _one_gap(table: Sequence[KVCacheBlock]) -> str | None:
    """R-SWA gives back one gap between the prompt and the window: its null
    entries are one run, after the prompt's first block."""
    nulls = [i for i, block in enumerate(table) if block.is_null]
    if not nulls:
        return None
    if nulls[0] == 0:
        return "an R-SWA table gave back the prompt's first block"
    if nulls[-1] - nulls[0] + 1 != len(nulls):
        return f"an R-SWA table has null entries at {nulls}: more than one gap"
    return None


TABLE_RULES: dict[type, TableRule] = {
    CircularBufferManager: _one_ring,
    RSWAManager: _one_gap,
}


def table_rule(manager) -> TableRule | None:
    return TABLE_RULES.get(type(manager))
