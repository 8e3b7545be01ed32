"""harness/peer/adapters/worker.py: vLLM's worker table and per-rank length
names over impl, held to vLLM's own objects on the same calls (vLLM is
required: these import it)."""

import numpy as np
import pytest
import torch

from harness.backends.vllm_worker import _overrides_registered
from harness.peer.adapters import worker


def _drive(tables):
    tables.add_row(([1, 2, 3], [7]), 0)
    tables.add_row(([4], [8, 9]), 1)
    tables.append_row(([5], []), 1)
    tables.add_row(([6, 10], [11]), 2)
    tables.move_row(2, 0)
    tables.swap_row(0, 1)
    tables.clear_row(1)
    tables.add_row(([12], [13]), 2)


def test_tables_match_vllms_after_the_same_row_operations():
    from vllm.v1.worker.block_table import MultiGroupBlockTable, SlotMappingMode

    kw = dict(max_num_reqs=4, max_num_batched_tokens=32, pin_memory=False,
              device=torch.device("cpu"), block_sizes=[4, 16], max_num_blocks=[5, 3],
              slot_mapping_modes=[SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.NONE])
    ref, ours = MultiGroupBlockTable(**kw), worker.MultiGroupBlockTable(**kw)
    _drive(ref)
    _drive(ours)
    for a, b in zip(ref.block_tables, ours.block_tables):
        assert a.max_num_blocks_per_req == b.max_num_blocks_per_req
        assert np.array_equal(a.block_table.np, b.block_table.np)
        assert np.array_equal(a.num_blocks_per_row, b.num_blocks_per_row)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    pos = torch.tensor([0, 4, 9, 2, 3], dtype=torch.int64)
    ours.compute_slot_mapping(2, qsl, pos)
    _overrides_registered()  # vLLM's CPU slot-mapping op, as the gate runs it
    ref.commit_block_table(2)
    ref.compute_slot_mapping(2, qsl, pos)
    assert ours[0].slot_mapping.np[:5].tolist() == ref[0].slot_mapping.gpu[:5].tolist()
    assert ours[0].slot_mapping.np[:5].tolist() == [16, 20, 1, 2, 3]
    # Field-by-field equality (as vLLM's InputBatch test compares tables) is
    # over impl's arrays: one differing entry makes two tables unequal.
    other = worker.MultiGroupBlockTable(**kw)
    _drive(other)
    assert ours[0].block_table == other[0].block_table
    other.append_row(([99], []), 0)
    assert ours[0].block_table != other[0].block_table
    assert "_impl" not in dir(ours[0])


@pytest.mark.parametrize("world,interleave", [(2, 16), (4, 16), (8, 16), (4, 1), (2, 3)])
def test_per_rank_lengths_match_vllms(world, interleave):
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    lens = torch.tensor([0, 1, 2, 10, 33, 100, 257], dtype=torch.int32)
    assert torch.equal(worker.get_dcp_local_seq_lens(lens, world, None, interleave),
                       get_dcp_local_seq_lens(lens, world, None, interleave))
    for r in range(world):
        assert torch.equal(worker.get_dcp_local_seq_lens(lens, world, r, interleave),
                           get_dcp_local_seq_lens(lens, world, r, interleave))


def test_the_input_batch_builds_impls_table_once_rebound():
    from vllm.v1.worker import gpu_input_batch

    from harness.peer import rebind

    saved = gpu_input_batch.MultiGroupBlockTable
    try:
        rebind.rebind_vllm_callers()
        assert gpu_input_batch.MultiGroupBlockTable is worker.MultiGroupBlockTable
    finally:
        gpu_input_batch.MultiGroupBlockTable = saved
