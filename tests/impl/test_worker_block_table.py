"""impl/worker against specs/WORKER_BLOCK_TABLE.md, by hand (the vLLM
comparison is tests/harness/test_worker_differential.py)."""

import numpy as np
import pytest

from impl.worker.block_table import BlockTable, SlotMappingMode, table_width
from impl.worker.kernel_blocks import kernel_block_table
from impl.worker.multi_group import MultiGroupBlockTable
from impl.worker.slot_mapping import ContextParallel, compute_slots


def test_width_aligns_to_128_tokens():
    assert table_width(10, 16) == 16  # 8 blocks a unit
    assert table_width(10, 48) == 16  # 128 / gcd(128, 48) = 8
    assert table_width(3, 256) == 3
    assert table_width(10, 16, None) == 10
    with pytest.raises(ValueError):
        table_width(10, 16, 0)


def test_row_operations():
    t = BlockTable(4, 4, 8)
    t.add_row([5, 6], 0)
    t.append_row([7], 0)
    t.add_row([9], 1)
    t.move_row(0, 2)
    assert t.table[2, :3].tolist() == [5, 6, 7] and t.num_blocks_per_row[0] == 0
    assert t.table[0].tolist() == [0] * 8
    t.swap_row(1, 2)
    assert t.table[1, :3].tolist() == [5, 6, 7] and t.num_blocks_per_row.tolist()[:3] == [0, 3, 1]
    t.clear_row(1)
    assert t.table[1].tolist() == [0] * 8


def test_slots_with_and_without_context_parallelism():
    table = np.array([[5, 6, 0, 0]], dtype=np.int32)
    rows = np.zeros(3, dtype=np.int64)
    pos = np.array([14, 15, 16])
    assert compute_slots(table, 16, rows, pos).tolist() == [94, 95, 96]
    assert compute_slots(table, 16, rows, pos, ContextParallel(2, 0)).tolist() == [87, -1, 88]
    assert compute_slots(table, 16, rows, pos, ContextParallel(2, 1)).tolist() == [-1, 87, -1]
    # interleave 2: tokens 14,15 are one round of rank 1 (14 // 2 = 7, odd)
    assert compute_slots(table, 16, rows, pos, ContextParallel(2, 1, 2)).tolist() == [86, 87, -1]


def test_state_groups_have_no_slots_and_no_alignment():
    m = MultiGroupBlockTable.build(2, [16, 16], [10, 3],
                                   [SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.NONE])
    assert [t.width for t in m.block_tables] == [16, 3]
    m.add_row(([1], [2]), 0)
    slots = m.compute_slot_mapping(1, np.array([0, 1]), np.array([3]))
    assert slots[0].tolist() == [19] and slots[1] is None


def test_kernel_blocks():
    table = np.array([[3, 0]], dtype=np.int32)
    assert kernel_block_table(table, 16, 8).tolist() == [[6, 7, 0, 1]]
    assert kernel_block_table(table, 16, 8, stride=5).tolist() == [[15, 16, 0, 1]]
    with pytest.raises(ValueError):
        kernel_block_table(table, 16, 5)


def test_per_rank_lengths_count_the_slot_mappings_tokens():
    from impl.worker.cp_local_lengths import dcp_local_seq_lens, skips_context_attention

    # Every length, world and interleave: a rank's length is the number of
    # positions the slot mapping gives it a slot for.
    for world in (1, 2, 4):
        for interleave in (1, 3, 16):
            block = interleave * 2
            table = np.arange(1, 65, dtype=np.int32)[None, :]
            for length in (0, 1, 5, 31, 64, 100):
                pos = np.arange(length)
                per_rank = dcp_local_seq_lens([length], world, None, interleave)[0]
                for r in range(world):
                    slots = compute_slots(table, block, np.zeros(length, dtype=np.int64), pos,
                                          ContextParallel(world, r, interleave))
                    assert per_rank[r] == int((slots >= 0).sum()), (world, interleave, length)
                    assert dcp_local_seq_lens([length], world, r, interleave)[0] == per_rank[r]
    assert dcp_local_seq_lens(np.array([10]), 4, None, 16).tolist() == [[10, 0, 0, 0]]
    assert skips_context_attention([0, 0]) and not skips_context_attention([0, 5])
    with pytest.raises(ValueError):
        dcp_local_seq_lens([4], 2, 2)


def test_forward_tables_null_entries_below_the_window_from_0_33():
    from impl.kv_cache_spec import FullAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
    from impl.profiles import get_profile
    from impl.worker.forward_tables import gather_forward_table, window_reach

    p32, p33 = get_profile("0.32.0"), get_profile("0.33.0")
    swa = SlidingWindowSpec(4, sliding_window=8)
    assert (window_reach(swa, p32), window_reach(swa, p33)) == (0, 7)
    assert window_reach(SlidingWindowSpec(4, sliding_window=8, extra_retained_tokens=4), p33) == 11
    assert window_reach(SlidingWindowMLASpec(4, sliding_window=8), p33) == 7
    assert window_reach(FullAttentionSpec(4), p33) == 0

    t = BlockTable(4, 3, 8)
    t.add_row([5, 6, 7, 8, 9], 0)
    t.add_row([3, 4], 1)
    # Request 0 starts at position 17: it reads from 17 - 7 = 10 on, in
    # entry 2 (tokens 8-11), which stays; entries 0 and 1 are nulled.
    # Request 1 (first position 5) reads from 0: nothing nulled. Batch
    # order is the rows given.
    got = gather_forward_table(t, [1, 0], [5, 17], window_reach(swa, p33))
    assert got[0, :2].tolist() == [3, 4] and got[1, :5].tolist() == [0, 0, 7, 8, 9]
    assert t.table[0, :5].tolist() == [5, 6, 7, 8, 9]  # the row itself is kept
    assert got[:, 5:].tolist() == [[0] * 3] * 2
    # 0.32, full attention, context parallelism: every used entry.
    for reach, world in ((window_reach(swa, p32), 1), (0, 1), (7, 2)):
        assert gather_forward_table(t, [0], [17], reach, world)[0, :5].tolist() == [5, 6, 7, 8, 9]
    # Far past the row's blocks: never more than the row's entries.
    assert gather_forward_table(t, [1], [400], 7)[0].tolist() == [0] * 8
