"""HiSparse differential against the installed vLLM: seeded fuzz cases of the
hisparse kind config (every answer compared, impl's invariants checked after
every call), which must reach HiSparse's states, not just run."""

from __future__ import annotations

import collections

import pytest

from harness.fuzz.campaign import case_rng, run_case
from harness.fuzz.generate import draw_case
from harness.fuzz.slices import load_kind_config as kind_config
from harness.report.text import format_failure
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm


def test_hisparse_fuzz_cases_conform_and_reach_hisparse_states():
    seen: collections.Counter = collections.Counter()
    fc = kind_config("hisparse")
    for i in range(200):
        config, actions = draw_case(case_rng(5, i), fc, 40)
        run = run_case(config, actions, get_profile("0.32"))
        assert not run.failed, f"case {i}: {format_failure(run.failure)}"
        for event, answer in run.events:
            if event.kind == "hisparse_step":
                transfers = answer["transfers"] or []
                seen["write-back"] += sum(not t["restore"] for t in transfers)
                seen["restore"] += sum(t["restore"] for t in transfers)
                seen["host pages read"] += not answer["all_resident"]
                seen["page lost"] += sum(0 in ids for u in answer["residency"].values()
                                         for ids in u["block_ids"])
            elif event.kind == "hisparse_ack":
                seen["transfer done"] += len(event.completed)
                seen["import failed"] += len(event.failed_imports)
            elif event.kind == "lookup" and answer["hit_tokens"]:
                seen["host prefix hit"] += 1
            elif event.kind == "checkpoint" and "hisparse" in answer:
                seen["reclamation pending"] += answer["hisparse"]["pending_reclamation"]
                seen["published"] += sum(e.get("medium") == "CPU" for e in answer["events"])
            elif event.kind == "allocate" and "refused" in answer:
                seen["refused"] += 1
    for state in ("write-back", "restore", "host pages read", "page lost", "transfer done",
                  "import failed", "host prefix hit", "reclamation pending", "published",
                  "refused"):
        assert seen[state] > 0, (state, seen)


def test_an_injected_hisparse_fault_is_found_and_shrunk(tmp_path):
    """Negative control: impl publishing host pages before they are durable
    diverges from vLLM within a bounded number of hisparse cases."""
    from harness.fuzz.campaign import fuzz
    from harness.fuzz.faults import KIND_FAULTS, inject
    from harness.sources.replay import check_trace

    name = "hisparse-publish-before-durable"
    result = fuzz(get_profile("0.32"), float("inf"), seed=1, out_dir=str(tmp_path),
                  fuzz_config=kind_config(KIND_FAULTS[name][0]), fault=name, max_cases=300)
    f = result.finding
    assert f is not None, f"not found in {result.cases} cases"
    assert f.num_calls <= 15, f"shrunk to {f.num_calls} calls only"
    assert check_trace(f.path, ["impl"], check_invariants=True).exit_code == 0
    with inject(name):
        assert check_trace(f.path, ["impl"], check_invariants=True).exit_code == 1
