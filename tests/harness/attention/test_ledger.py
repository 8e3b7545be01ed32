"""The block ledger on its own: slots from the trace's blocks, block-table
rows, identities and bytes, each with the divergence it must name."""

import torch

from harness.attention.ledger import (
    BLOCK_CONTENT,
    BLOCK_TABLE,
    SLOT_MAPPING,
    BlockLedger,
    LedgerProblem,
    row_hashes,
)

BS = 4
ROW = [5, 2, 7]  # the trace's blocks for request 'r'


def _ledger_with(positions=range(10)):
    ledger = BlockLedger(num_blocks=8, block_size=BS)
    pos = torch.tensor(list(positions))
    slots = ledger.check_writes("r", pos, torch.tensor(ROW)[pos // BS] * BS + pos % BS, ROW)
    ids = pos * 1000 + 1
    rows = torch.arange(len(pos) * 6, dtype=torch.float32).view(len(pos), 2, 3)
    ledger.record(slots, ids, row_hashes(rows), "r", pos, step=0)
    cache = {int(s): rows[i] for i, s in enumerate(slots)}
    return ledger, pos, ids, cache


def _hashes_of(cache):
    return lambda slots: row_hashes(torch.stack([cache.get(int(s), torch.full((2, 3), 9.0))
                                                 for s in slots]))


def test_writes_must_land_where_the_trace_puts_them():
    ledger = BlockLedger(8, BS)
    pos = torch.arange(6)
    right = torch.tensor(ROW)[pos // BS] * BS + pos % BS
    assert torch.equal(ledger.check_writes("r", pos, right, ROW), right)
    wrong = right.clone()
    wrong[5] += 1
    p = ledger.check_writes("r", pos, wrong, ROW)
    assert isinstance(p, LedgerProblem) and p.check == SLOT_MAPPING
    assert "position 5: the kernels write slot 10 (block 2 offset 2)" in p.message
    p = ledger.check_writes("r", torch.arange(14), torch.zeros(14), ROW)
    assert p.check == SLOT_MAPPING and "needs 4" in p.message
    p = ledger.check_writes("r", pos, right, [0, 2])
    assert p.check == SLOT_MAPPING and "null block" in p.message


def test_reads_through_the_right_row_of_the_right_tokens_pass():
    ledger, pos, ids, cache = _ledger_with()
    kernel_row = torch.tensor(ROW + [0], dtype=torch.int32)
    assert ledger.check_reads("r", pos, ids, kernel_row, ROW, _hashes_of(cache)) is None


def test_a_swapped_block_table_entry_is_named():
    ledger, pos, ids, cache = _ledger_with()
    swapped = torch.tensor([2, 5, 7], dtype=torch.int32)
    p = ledger.check_reads("r", pos, ids, swapped, ROW, _hashes_of(cache))
    assert p.check == BLOCK_TABLE
    assert "entry 0 of its block-table row is block 2, the trace's answers give block 5" \
        in p.message


def test_another_tokens_row_or_other_bytes_are_named():
    ledger, pos, ids, cache = _ledger_with()
    row = torch.tensor(ROW, dtype=torch.int32)
    other = ids.clone()
    other[3] += 1  # the request's token 3 is not what was written at its slot
    p = ledger.check_reads("r", pos, other, row, ROW, _hashes_of(cache))
    assert p.check == BLOCK_CONTENT and "position 3 reads block 5 offset 3" in p.message
    assert "holds request 'r' position 3 (written at step 0)" in p.message
    clobbered = dict(cache)
    clobbered[2 * BS + 1] = torch.zeros(2, 3)  # block 2 offset 1 overwritten
    p = ledger.check_reads("r", pos, ids, row, ROW, _hashes_of(clobbered))
    assert p.check == BLOCK_CONTENT and "block 2 offset 1 holds other bytes" in p.message


def test_a_slot_never_written_is_named():
    ledger, pos, ids, cache = _ledger_with(range(6))
    p = ledger.check_reads("r", torch.arange(8), torch.arange(8) * 1000 + 1,
                           torch.tensor(ROW, dtype=torch.int32), ROW, _hashes_of(cache))
    assert p.check == BLOCK_CONTENT and "nothing written there" in p.message


def test_row_hashes_see_every_bit_and_the_value_too():
    x = torch.randn(5, 2, 8).bfloat16()
    h = row_hashes(x, x)
    y = x.clone()
    y.view(torch.int16)[3, 1, 7] ^= 1  # one bit of one element
    assert (row_hashes(y, x) != h).tolist() == [False, False, False, True, False]
    assert (row_hashes(x, y) != h).tolist() == [False, False, False, True, False]
    assert len(set(h.tolist())) == 5
