"""The CPU offload tier as a fuzz kind config (harness/fuzz/kind_configs/
offload_cpu_tier.yaml): a slice of the gate's fuzz budget and a config of
`kvconform fuzz`; a bug planted in impl's tier fails the slice naming the
operation (negative control), a release whose tier impl does not model is
labelled, never run, and a bad config is one line, exit 2."""

from __future__ import annotations

import dataclasses

import pytest
import vllm.v1.kv_offload.cpu.manager  # noqa: F401  (fail loudly without vLLM)

from harness.cli.main import main
from harness.core.exit_codes import ExitCode
from harness.fuzz.offload_driver import OffloadFuzzConfig
from harness.fuzz.slices import fuzz_config_of, fuzz_slices, load_kind_config
from harness.gate.cases import run_offload_fuzz
from impl.kv_offload.policies.arc import ARCCachePolicy
from impl.profiles import get_profile

P = get_profile("0.32")
CONFIG = "harness/fuzz/kind_configs/offload_cpu_tier.yaml"


def test_the_kind_config_is_a_slice_of_the_gates_budget():
    assert load_kind_config("offload_cpu_tier") == OffloadFuzzConfig(("lru", "arc"))
    assert "offload_cpu_tier" in {kind for kind, _, _ in fuzz_slices(60, 1, P)}


def test_a_slice_agrees_and_a_planted_bug_fails_it_naming_the_operation(monkeypatch):
    fc = load_kind_config("offload_cpu_tier")
    case = run_offload_fuzz("offload", P, None, 3, fc, programs=20)
    assert case.exit_code == ExitCode.OK and case.events > 2_000, case.report
    # The bug: ARC evicts from T2 first, whatever its target.
    real = ARCCachePolicy.evict

    def evict_t2_first(self, n, protected):
        self.target_t1_size = float(self.cache_capacity)
        return real(self, n, protected)

    monkeypatch.setattr(ARCCachePolicy, "evict", evict_t2_first)
    arc_only = OffloadFuzzConfig(("arc",))
    case = run_offload_fuzz("offload", P, None, 3, arc_only, programs=40)
    assert case.exit_code == ExitCode.DIVERGED
    assert "op #" in case.report and "rerun it: python -m harness.fuzz.offload_driver" in (
        case.report)


def test_a_release_whose_tier_impl_does_not_model_is_labelled():
    older = dataclasses.replace(P, offload_cpu_tier=False)
    case = run_offload_fuzz("offload", older, 5.0, 1, OffloadFuzzConfig())
    assert case.exit_code == ExitCode.OK and case.events == 0
    assert case.verdict.startswith("not modelled on 0.32")


@pytest.mark.parametrize("doc, problem", [
    ({"offload": {"cache_policies": ["mru"]}}, "cache_policies"),
    ({"offload": {"chunks": 4}}, "unknown field(s) chunks"),
    ({"offload": {}, "kinds": ["full_attention"]}, "nothing else"),
])
def test_a_bad_offload_config_is_refused(doc, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        fuzz_config_of(doc)


def test_a_bad_offload_config_file_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("offload:\n  cache_policies: [mru]\n")
    assert main(["fuzz", "--seconds", "1", "--config", str(path)]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "cache_policies" in err[0]


def test_fuzz_with_the_offload_config_runs_the_tier(capsys):
    assert main(["fuzz", "--seconds", "60", "--max-cases", "5", "--seed", "2",
                 "--config", CONFIG]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "fuzz offload seed 2: 5 programs" in out and "no divergence" in out
