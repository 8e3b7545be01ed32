"""The fuzzer, live against vLLM: it finds known faults fast and shrinks them
small; it is deterministic; a clean impl gives no divergence."""

import filecmp

import pytest

from harness.fuzz.campaign import fuzz
from harness.fuzz.faults import FAULTS, inject
from harness.replay import check_trace
from harness.report import format_failure
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P = get_profile("0.32")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_injected_fault_is_found_and_shrunk(tmp_path, fault):
    result = fuzz(P, 30, seed=1, out_dir=str(tmp_path), fault=fault)
    f = result.finding
    assert f is not None, f"{fault} not found in 30 s ({result.cases} cases)"
    assert f.num_calls <= 12, f"{fault}: shrunk to {f.num_calls} calls only"
    # The trace holds vLLM's answers: the correct impl replays it cleanly, the
    # faulty one diverges at the same place.
    assert check_trace(f.path, ["impl"], check_invariants=True).exit_code == 0
    with inject(fault):
        faulty = check_trace(f.path, ["impl"], check_invariants=True)
    assert faulty.exit_code == 1
    assert faulty.divergence.event.kind == f.divergence.event.kind


def test_same_seed_same_finding_byte_identical(tmp_path):
    a = fuzz(P, 30, seed=3, out_dir=str(tmp_path / "a"), fault="longest-hit-off-by-one")
    b = fuzz(P, 30, seed=3, out_dir=str(tmp_path / "b"), fault="longest-hit-off-by-one")
    assert a.finding is not None and b.finding is not None
    assert (a.cases, a.finding.case) == (b.cases, b.finding.case)
    assert filecmp.cmp(a.finding.path, b.finding.path, shallow=False)


def test_clean_impl_short_run(tmp_path):
    result = fuzz(P, 8, seed=5, out_dir=str(tmp_path))
    assert result.finding is None, result.finding and format_failure(result.finding.failure)
    assert result.ops > 2000 and len(result.states) > 100
    assert list(tmp_path.iterdir()) == []
