"""The worker-side block table and the slot mapping."""

import pytest
import torch

from impl.attention_batch import ScheduledRequest, build_attention_batch
from impl.block_table import NULL_BLOCK_ID, PAD_SLOT_ID, BlockTable


def test_rows_grow_append_only_and_pad_with_the_null_block():
    t = BlockTable(block_size=4, max_num_blocks_per_req=8)
    t.add_row("a", [5, 2])
    t.add_row("b", [7])
    t.append_row("a", [9])
    assert t.row("a") == [5, 2, 9]
    table = t.tensor(["b", "a"])
    assert table.dtype == torch.int32
    assert table.tolist() == [[7, NULL_BLOCK_ID, NULL_BLOCK_ID], [5, 2, 9]]
    assert t.tensor(["a"], width=5).tolist() == [[5, 2, 9, 0, 0]]
    t.add_row("a", [3])  # preempted and rescheduled: a fresh row
    assert t.row("a") == [3]
    t.remove_row("a")
    assert "a" not in t.rows


def test_slot_mapping_is_block_times_size_plus_offset_and_pads_with_minus_one():
    t = BlockTable(block_size=4, max_num_blocks_per_req=8)
    t.add_row("a", [5, 2, 9])
    t.add_row("b", [7])
    slots = t.slot_mapping(["a", "b"], [range(3, 6), range(0, 2)], num_padding=2)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [5 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 7 * 4 + 0, 7 * 4 + 1,
                              PAD_SLOT_ID, PAD_SLOT_ID]


def test_writing_past_a_row_or_into_the_null_block_is_refused():
    t = BlockTable(block_size=4, max_num_blocks_per_req=2)
    t.add_row("a", [NULL_BLOCK_ID, 3])  # a sliding window dropped block 0
    assert t.slot_mapping(["a"], [range(4, 6)]).tolist() == [12, 13]
    with pytest.raises(ValueError, match="null block"):
        t.slot_mapping(["a"], [range(0, 1)])
    with pytest.raises(ValueError, match="no block"):
        t.slot_mapping(["a"], [range(8, 9)])
    with pytest.raises(ValueError, match="room"):
        t.append_row("a", [4])


def test_attention_batch_metadata():
    t = BlockTable(block_size=4, max_num_blocks_per_req=8)
    t.add_row("a", [5, 2, 9])
    t.add_row("b", [7])
    batch = build_attention_batch(
        [ScheduledRequest("a", num_computed=8, num_new=1),
         ScheduledRequest("b", num_computed=0, num_new=3)], t, num_padding=1)
    assert batch.query_start_loc.tolist() == [0, 1, 4]
    assert batch.seq_lens.tolist() == [9, 3]
    assert batch.slot_mapping.tolist() == [9 * 4 + 0, 28, 29, 30, -1]
    assert batch.block_table.tolist() == [[5, 2, 9], [7, 0, 0]]
    assert (batch.max_query_len, batch.max_seq_len, batch.num_actual_tokens) == (3, 9, 4)


def test_static_sinks_go_in_front_of_every_row():
    from impl.attention_batch import with_static_sinks

    t = BlockTable(block_size=4, max_num_blocks_per_req=8)
    t.add_row("a", [5, 2])
    t.add_row("b", [7])
    batch = build_attention_batch([ScheduledRequest("a", 6, 1), ScheduledRequest("b", 0, 3)], t)
    sunk = with_static_sinks(batch, sink_len=8, block_size=4)
    assert sunk.block_table.tolist() == [[1, 2, 5, 2], [1, 2, 7, 0]]
    assert sunk.seq_lens.tolist() == [15, 11] and sunk.max_seq_len == 15
    assert torch.equal(sunk.slot_mapping, batch.slot_mapping)  # writes stay where they were
    with pytest.raises(ValueError, match="multiple of the block size"):
        with_static_sinks(batch, sink_len=6, block_size=4)
