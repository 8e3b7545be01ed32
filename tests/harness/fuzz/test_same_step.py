"""Bursts (harness/fuzz/generate.py): several requests admitted from one
document's prefix within one scheduler step. A bug that needs two of them in
one step, planted in vLLM, is found in a few hundred cases with bursts and
not without them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.core.compare import FailureKind
from harness.fuzz.actions import New, Schedule, StepBoundary
from harness.fuzz.campaign import case_rng, fuzz
from harness.fuzz.generate import FuzzConfig, draw_case
from harness.fuzz.slices import load_kind_config


def _shared_steps(fc: FuzzConfig, cases: int) -> int:
    """Steps in which two new requests whose prompts share a first block are
    both scheduled."""
    found = 0
    for i in range(cases):
        _, actions = draw_case(case_rng(5, i), fc, 40)
        prompts, scheduled = {}, []
        for a in actions + [StepBoundary()]:
            if isinstance(a, New):
                prompts[a.req] = a.prompt
            elif isinstance(a, Schedule) and a.req in prompts:
                scheduled.append(a.req)
            elif isinstance(a, StepBoundary):
                heads = [prompts[r][:4] for r in dict.fromkeys(scheduled)
                         if len(prompts[r]) >= 4]
                found += len(heads) > len(set(heads))
                prompts, scheduled = {}, []
    return found


def test_bursts_meet_on_the_same_blocks_within_a_step():
    fc = replace(FuzzConfig(), block_sizes=(4,))
    without = replace(fc, weights={**fc.weights, "burst": 0})
    assert _shared_steps(fc, 200) > 2 * _shared_steps(without, 200)


@pytest.mark.vllm
def test_a_bug_that_needs_two_copies_in_one_step_is_found(monkeypatch, tmp_path):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from harness.backends.vllm_backend import installed_vllm_profile

    real = KVCacheManager.take_kv_cache_block_copies

    def one_copy_per_source(self):
        # The planted bug: a second request's copy of the same source block
        # in the same step is dropped, and the blocks it kept stay referenced.
        copies, kept = real(self)
        seen, first = set(), []
        for c in copies:
            if c.src_block_id not in seen:
                seen.add(c.src_block_id)
                first.append(c)
        dropped = {c.dst_block_id for c in copies} - {c.dst_block_id for c in first}
        return first, [b for b in kept if b.block_id not in dropped]

    monkeypatch.setattr(KVCacheManager, "take_kv_cache_block_copies", one_copy_per_source)
    fc = load_kind_config("hybrid_mamba")
    profile = installed_vllm_profile()
    r = fuzz(profile, 1e9, 1, str(tmp_path / "with"), fuzz_config=fc, max_cases=600)
    assert r.finding is not None, r.cases
    failure = r.finding.failure
    assert failure.kind is FailureKind.UPSTREAM and failure.event.kind == "take_block_copies"
    # Without bursts the same cases find nothing (seed 1 needs ~3,000).
    quiet = replace(fc, weights={**fc.weights, "burst": 0})
    r0 = fuzz(profile, 1e9, 1, str(tmp_path / "without"), fuzz_config=quiet, max_cases=600)
    assert r0.finding is None
