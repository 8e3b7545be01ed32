"""The worker differential (harness/sources/worker.py): vLLM's worker block
tables driven by a trace's answers against impl's, and the bugs it must catch.
Needs the installed vLLM (its worker tables); a missing vLLM fails loudly."""

from __future__ import annotations

import numpy as np
import pytest

import impl.worker.block_table as impl_table
import impl.worker.kernel_blocks as impl_kernel_blocks
from harness.core.exit_codes import ExitCode
from harness.gate.cases import run_worker_trace
from impl.worker.slot_mapping import NO_CONTEXT_PARALLEL, ContextParallel

SWAPS = "traces/golden/v0.32/multi-turn-chat.jsonl"  # decode-first reorder swaps rows
CP = "traces/scenarios/context-parallel.yaml"  # DCP 2, blocks of 4
PCP = "traces/scenarios/prefill-context-parallel.yaml"  # PCP 2, DCP 1
HYBRID = "traces/scenarios/sliding-window-hybrid.yaml"


@pytest.mark.parametrize("path", [SWAPS, CP, PCP, HYBRID, "traces/scenarios/mamba-align.yaml"])
def test_conformant(path):
    case = run_worker_trace(path)
    assert case.exit_code == ExitCode.OK, case.report
    assert case.kind == "worker" and case.events > 0


def _diverged(path: str) -> str:
    case = run_worker_trace(path)
    assert case.exit_code == ExitCode.DIVERGED, case.report
    for word in ("worker step", "group", "request '"):
        assert word in case.report
    return case.report


def test_swapped_row_is_caught(monkeypatch):
    def swap_tables_only(self, a, b):  # the counts stay behind
        self.table[[a, b]] = self.table[[b, a]]

    monkeypatch.setattr(impl_table.BlockTable, "swap_row", swap_tables_only)
    assert "blocks in the row" in _diverged(SWAPS)


def test_off_by_one_interleave_is_caught(monkeypatch):
    right = impl_table.compute_slots

    def off_by_one(table, block_size, rows, positions, cp=NO_CONTEXT_PARALLEL):
        if cp.world_size > 1:
            cp = ContextParallel(cp.world_size, cp.rank, cp.interleave + 1)
        return right(table, block_size, rows, positions, cp)

    monkeypatch.setattr(impl_table, "compute_slots", off_by_one)
    assert "context-parallel rank" in _diverged(CP)


def test_wrong_kernel_block_split_is_caught(monkeypatch):
    def reversed_split(table, block_size, kernel_block_size, stride=0):
        k = block_size // kernel_block_size
        expanded = table.astype(np.int32)[:, :, None] * k + np.arange(k - 1, -1, -1,
                                                                       dtype=np.int32)
        return expanded.reshape(table.shape[0], -1)

    monkeypatch.setattr(impl_kernel_blocks, "kernel_block_table", reversed_split)
    assert "kernel block table entry" in _diverged(HYBRID)


def test_prefill_context_parallel_deals_slots_over_the_dcp_ranks_only():
    from harness.backends.worker_tables import WorkerLayout
    from harness.trace.reader import open_trace
    from impl.profiles import get_profile

    cache = open_trace(PCP).header.cache
    assert (cache.pcp_world_size, cache.dcp_world_size) == (2, 1)
    # 0.32: PCP ranks hold the DCP shard (here all of it); 0.25: blocks and
    # slots span dcp x pcp ranks.
    assert WorkerLayout.of(cache, 4, get_profile("0.32.0")).cp_world_size == 1
    assert WorkerLayout.of(cache, 4, get_profile("0.25.1")).cp_world_size == 2
    case = run_worker_trace(PCP)
    assert case.exit_code == ExitCode.OK, case.report
    assert "9 steps" in case.mode


def test_a_slot_off_by_one_under_prefill_context_parallelism_is_caught(monkeypatch):
    right = impl_table.compute_slots

    def shifted(table, block_size, rows, positions, cp=NO_CONTEXT_PARALLEL):
        return right(table, block_size, rows, positions, cp) + 1

    monkeypatch.setattr(impl_table, "compute_slots", shifted)
    assert "slot of position" in _diverged(PCP)
