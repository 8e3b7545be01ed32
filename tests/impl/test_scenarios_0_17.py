"""The scenarios recorded from vLLM 0.17.1 (`*-v0.17.yaml`): impl with the 0.17
profile must give the recorded answers and the hand-derived expectations; with
the 0.17 overlay installed they run live too."""

from pathlib import Path

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.core.compare import check_expected
from harness.trace import open_trace

SCENARIOS = Path(__file__).resolve().parents[2] / "traces" / "scenarios"
TRACES_017 = sorted(p.name for p in SCENARIOS.glob("*-v0.17.yaml"))


def _run(backend, trace) -> None:
    for rec in trace.records:
        answer = backend.run(rec.event)
        assert check_expected(answer, rec.expect) is None, f"{trace.path}:{rec.line}"
        assert answer == rec.answer, f"{trace.path}:{rec.line}"


@pytest.mark.parametrize("name", TRACES_017)
def test_0_17_scenario_on_impl(name):
    trace = open_trace(str(SCENARIOS / name))
    assert trace.profile.name == "0.17"
    _run(ImplBackend(trace.header.cache, trace.profile, check=True), trace)


@pytest.mark.vllm017
@pytest.mark.parametrize("name", TRACES_017)
def test_0_17_scenario_live(name):
    from harness.backends.vllm_backend import VllmBackend

    trace = open_trace(str(SCENARIOS / name))
    _run(VllmBackend(trace.header.cache, trace.profile), trace)
