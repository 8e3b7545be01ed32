"""impl's forward-pass tables (impl/worker/forward_tables.py) against vLLM
0.33's own gather kernel, run from the 0.33 overlay's source in Triton's
interpreter (harness/backends/vllm_forward_tables.py). The overlay is built
if missing (ci/vllm-overlay.sh); a machine that cannot build it fails loudly."""

from __future__ import annotations

import random

import numpy as np
import pytest

import impl.worker.forward_tables as ft
from harness.backends.vllm_forward_tables import gather_kernel, vllm_forward_tables
from harness.releases import vllm_overlay
from impl.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec
from impl.profiles import get_profile
from impl.worker.block_table import BlockTable

CASES = 40


@pytest.fixture(scope="module")
def kernel():
    return gather_kernel(vllm_overlay.ensure("0.33.0", progress=False).path)


def _case(rng: random.Random):
    """Groups (a spec each) with rows of random blocks, a batch of rows and
    every row's computed tokens."""
    specs = [FullAttentionSpec(rng.choice((4, 16)))]
    for _ in range(rng.randint(1, 2)):
        specs.append(SlidingWindowSpec(rng.choice((2, 4, 16)), sliding_window=rng.randint(1, 40),
                                       extra_retained_tokens=rng.choice((0, 0, 3))))
    reqs, width = 6, 16
    tables = []
    for spec in specs:
        t = BlockTable(spec.block_size, reqs, width)
        for row in range(reqs):
            t.add_row([rng.randint(1, 500) for _ in range(rng.randint(0, width))], row)
        tables.append(t)
    batch = rng.sample(range(reqs), rng.randint(1, reqs))
    computed = np.array([rng.randint(0, 16 * 20) for _ in range(reqs)], dtype=np.int32)
    return specs, tables, batch, computed


def _impl(specs, tables, batch, computed, profile):
    return [ft.gather_forward_table(t, batch, [int(computed[r]) for r in batch],
                                    ft.window_reach(s, profile))
            for s, t in zip(specs, tables)]


def _vllm(kernel, specs, tables, batch, computed, profile):
    return vllm_forward_tables(kernel, [t.table for t in tables],
                               [t.num_blocks_per_row for t in tables],
                               [t.block_size for t in tables],
                               [ft.window_reach(s, profile) for s in specs], batch, computed)


def _first_difference(kernel, profile) -> str:
    rng = random.Random(22)
    nulled = 0
    for i in range(CASES):
        specs, tables, batch, computed = _case(rng)
        ours = _impl(specs, tables, batch, computed, profile)
        theirs = _vllm(kernel, specs, tables, batch, computed, profile)
        for g, (a, b) in enumerate(zip(theirs, ours)):
            if not np.array_equal(a, b):
                return f"case {i}, group {g}: vLLM {a.tolist()} impl {b.tolist()}"
            nulled += int(((a == 0) & (np.arange(a.shape[1]) < np.array(
                [tables[g].num_blocks_per_row[r] for r in batch])[:, None])).sum())
    assert nulled > 0, "no case nulled an entry: the cases test nothing"
    return ""


def test_impl_gathers_as_vllm_0_33(kernel):
    assert _first_difference(kernel, get_profile("0.33.0")) == ""


def test_an_off_by_one_window_is_caught(kernel, monkeypatch):
    right = ft.entries_below_window
    monkeypatch.setattr(ft, "entries_below_window",
                        lambda first, reach, size: right(first + 1, reach, size))
    assert "group" in _first_difference(kernel, get_profile("0.33.0"))
