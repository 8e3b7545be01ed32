"""Every attention kind and hybrid, differential against the installed vLLM:
seeded fuzz cases (every answer compared, impl's invariants checked after every
call) and scheduler-like workloads over hybrid configs."""

from __future__ import annotations

import collections

import pytest

from harness.fuzz.campaign import case_rng, run_case
from harness.fuzz.configs import TEMPLATES, templates_for
from harness.fuzz.generate import draw_case
from harness.fuzz.slices import load_kind_config as kind_config
from harness.gate.cases import WORKLOADS, run_workload
from harness.report.text import format_failure
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P32 = get_profile("0.32")
CASES = 40


def fuzz_cases(kind: str, profile, cases: int = CASES, seed: int = 11):
    """Run `cases` cases of `kind`; return counters of what they reached."""
    seen: collections.Counter = collections.Counter()
    fc = kind_config(kind)
    for i in range(cases):
        config, actions = draw_case(case_rng(seed, i), fc, 40)
        run = run_case(config, actions, profile)
        assert not run.failed, f"{kind} case {i}: {format_failure(run.failure)}"
        sizes = [g.block_size for g in config.groups]
        for event, answer in run.events:
            seen[event.kind] += 1
            if event.kind == "lookup" and answer["hit_tokens"]:
                seen["hit"] += 1
                seen["null in hit"] += any(0 in ids for ids in answer["block_ids"])
                seen["hit inside a block"] += any(answer["hit_tokens"] % b for b in sizes)
            if event.kind == "allocate":
                seen["refused" if "refused" in answer else "allocated"] += 1
            if event.kind == "take_block_copies":
                seen["copies"] += len(answer["copies"])
    return seen


@pytest.mark.parametrize("kind", TEMPLATES)
def test_kind_conforms(kind):
    seen = fuzz_cases(kind, P32)
    assert seen["allocated"] > 50 and seen["refused"] > 0
    if kind not in ("cross_attention",):
        assert seen["hit"] > 0, seen
    if kind in ("sliding_window", "chunked_local_attention", "hybrid_sliding_window",
                "hybrid_chunked_local", "hybrid_mamba", "mamba"):
        assert seen["null in hit"] > 0, seen


def test_hits_inside_blocks_and_copies_are_reached():
    seen = fuzz_cases("hybrid_mamba", P32, cases=150)
    assert seen["hit inside a block"] > 0 and seen["copies"] > 0, seen


@pytest.mark.parametrize("case", [w for w in WORKLOADS if len(w.config.groups) > 1
                                  or w.config.groups[0].kind != "full_attention"],
                         ids=lambda w: w.name)
def test_hybrid_workloads_conform(case):
    result = run_workload(case, P32)
    assert result.exit_code == 0, result.report
    assert result.events > 5000


@pytest.mark.vllm017
@pytest.mark.parametrize("kind", templates_for(get_profile("0.17")))
def test_kind_conforms_0_17(kind):
    profile = get_profile("0.17")
    seen = fuzz_cases(kind, profile, cases=25)
    assert seen["allocated"] > 0
