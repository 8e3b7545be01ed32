"""The branches of vLLM's KV core a fuzz slice reaches (harness/fuzz/core_coverage.py)."""

import re

from harness.backends.vllm_backend import installed_vllm_profile
from harness.fuzz import core_coverage as cc
from harness.fuzz.campaign import fuzz
from harness.fuzz.slices import load_kind_config


def _fuzzed(data_dir, kind: str, cases: int, tmp_path) -> None:
    with cc.measured(str(data_dir), f"fuzz[{kind},seed=0]"):
        fuzz(installed_vllm_profile(), 1e9, 0, str(tmp_path / "found"),
             fuzz_config=load_kind_config(kind), max_cases=cases)


def test_a_slice_that_never_calls_vllm_reaches_no_branch(tmp_path):
    # The negative control: measured, but vLLM's KV core never ran.
    with cc.measured(str(tmp_path / "cov"), "idle"):
        sum(range(1000))
    b = cc.combined(str(tmp_path / "cov"))
    assert b is not None and b.covered == 0 and b.total > 1000 and b.slices == 1


def test_slices_combine_to_more_than_either(tmp_path):
    one, both = tmp_path / "one", tmp_path / "both"
    _fuzzed(one, "full_attention", 30, tmp_path)
    _fuzzed(both, "full_attention", 30, tmp_path)
    _fuzzed(both, "hybrid_mamba", 30, tmp_path)
    a, b = cc.combined(str(one)), cc.combined(str(both))
    assert 0 < a.covered < b.covered < b.total == a.total
    assert b.slices == 2
    # Every source file of the packages counts, imported or not: the total
    # is at least the branch count of the files the Mamba slice never
    # needs, so two runs' figures compare.
    assert re.search(rf"{b.covered:,} of {b.total:,} branches", b.line())


def test_nothing_measured_is_no_figure(tmp_path):
    assert cc.combined(str(tmp_path / "absent")) is None
    assert cc.combined(str(tmp_path)) is None
