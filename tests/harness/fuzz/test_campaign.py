"""The fuzzer, live against vLLM: it finds known faults within a few hundred
cases and shrinks them small; it is deterministic; a clean impl gives no
divergence. Campaigns are bounded by cases, not seconds (NO_TIME_LIMIT), so
they do the same work on a loaded machine."""

import filecmp

import pytest

from harness.fuzz.campaign import fuzz
from harness.fuzz.faults import FAULT_KINDS, FAULTS, inject
from harness.fuzz.generate import FuzzConfig
from harness.report.text import format_failure
from harness.sources.replay import check_trace
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P = get_profile("0.32")
NO_TIME_LIMIT = float("inf")
# Seed 1 finds each fault within 30 cases; the bound leaves room for changes
# to the generator without letting a fault go unnoticed for long.
FAULT_CASES = 400


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_injected_fault_is_found_and_shrunk(tmp_path, fault):
    kinds = FAULT_KINDS.get(fault)
    result = fuzz(P, NO_TIME_LIMIT, seed=1, out_dir=str(tmp_path), fault=fault,
                  max_cases=FAULT_CASES, fuzz_config=FuzzConfig(kinds=kinds) if kinds else None)
    f = result.finding
    assert f is not None, f"{fault} not found in {result.cases} cases"
    assert f.num_calls <= 12, f"{fault}: shrunk to {f.num_calls} calls only"
    # The trace holds vLLM's answers: the correct impl replays it cleanly, the
    # faulty one diverges at the same place.
    assert check_trace(f.path, ["impl"], check_invariants=True).exit_code == 0
    with inject(fault):
        faulty = check_trace(f.path, ["impl"], check_invariants=True)
    assert faulty.exit_code == 1
    assert faulty.divergence.event.kind == f.failure.event.kind


def test_same_seed_same_finding_byte_identical(tmp_path):
    a = fuzz(P, NO_TIME_LIMIT, seed=3, out_dir=str(tmp_path / "a"),
             fault="longest-hit-off-by-one", max_cases=FAULT_CASES)
    b = fuzz(P, NO_TIME_LIMIT, seed=3, out_dir=str(tmp_path / "b"),
             fault="longest-hit-off-by-one", max_cases=FAULT_CASES)
    assert a.finding is not None and b.finding is not None
    assert (a.cases, a.finding.case) == (b.cases, b.finding.case)
    assert filecmp.cmp(a.finding.path, b.finding.path, shallow=False)


def test_clean_impl_short_run(tmp_path):
    result = fuzz(P, NO_TIME_LIMIT, seed=5, out_dir=str(tmp_path), max_cases=150)
    assert result.cases == 150
    assert result.finding is None, result.finding and format_failure(result.finding.failure)
    assert result.ops > 2000 and len(result.states) > 100
    assert list(tmp_path.iterdir()) == []


def test_start_up_is_apart_and_too_few_cases_say_so(tmp_path):
    """vLLM's import and the first backends are timed apart; a campaign whose
    time ends before MIN_CASES cases is 'too few cases', in the gate too."""
    from harness.core.exit_codes import ExitCode
    from harness.gate.cases import TOO_FEW_CASES, fuzz_case

    r = fuzz(P, 1e-9, seed=0, out_dir=str(tmp_path))
    assert r.startup_seconds > 0 and r.seconds < r.startup_seconds and r.cases <= 1
    assert r.too_few_cases
    case = fuzz_case("fuzz[seed=0]", r)
    assert (case.exit_code, case.verdict) == (ExitCode.ENVIRONMENT, TOO_FEW_CASES)
    assert "too few to mean anything" in case.report
    # A budget given in cases is what was asked for: not too few.
    r = fuzz(P, NO_TIME_LIMIT, seed=0, out_dir=str(tmp_path), max_cases=5)
    assert r.cases == 5 and not r.too_few_cases
    assert fuzz_case("fuzz[seed=0]", r).exit_code == ExitCode.OK


def test_cases_of_a_seed_run_anywhere(tmp_path):
    """Cases first_case.. are the very cases a campaign from 0 draws there."""
    whole = fuzz(P, NO_TIME_LIMIT, seed=2, out_dir=str(tmp_path), max_cases=12)
    head = fuzz(P, NO_TIME_LIMIT, seed=2, out_dir=str(tmp_path), max_cases=7)
    tail = fuzz(P, NO_TIME_LIMIT, seed=2, out_dir=str(tmp_path), max_cases=5, first_case=7)
    assert head.ops + tail.ops == whole.ops
    assert head.states | tail.states == whole.states


def test_cli_reports_start_up_and_too_few_cases(tmp_path, capsys):
    from harness.cli.main import main

    assert main(["fuzz", "--seconds", "1e-9", "--out", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    assert "start-up (vLLM's import, the first backends)" in out and "not counted" in out
    assert "too few to mean anything" in err and "no divergence" not in out
