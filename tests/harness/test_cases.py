"""The cases of the gate: each gives one Case, conformant or with its report;
`kvconform conform` is the gate without fuzz, serially."""

import pytest

from harness.core.exit_codes import ExitCode
from harness.gate.cases import WORKLOADS, Case, run_trace, run_workload
from harness.gate.run import format_table
from impl.profiles import PROFILES

pytestmark = pytest.mark.vllm


def test_workload_conforms():
    case = run_workload(WORKLOADS[0], PROFILES["0.32"])
    assert case.exit_code == ExitCode.OK and case.report == "" and case.events > 5000
    assert (case.kind, case.mode, case.verdict) == ("workload", "lockstep", "conformant")


def test_a_wrong_free_order_in_impl_is_caught(monkeypatch):
    import dataclasses

    import impl.block_pool
    from impl.profiles import FreeOrder, VersionProfile

    # Inject a fault: impl's pool frees like 0.17 while vLLM is 0.32.
    real_init = impl.block_pool.BlockPool.__init__

    def as_017(value):
        if isinstance(value, VersionProfile):
            return dataclasses.replace(value, free_order=FreeOrder.APPEND_ALL)
        return value

    def faulty_init(self, *args, **kwargs):
        real_init(self, *map(as_017, args), **{k: as_017(v) for k, v in kwargs.items()})

    monkeypatch.setattr(impl.block_pool.BlockPool, "__init__", faulty_init)
    case = run_workload(WORKLOADS[0], PROFILES["0.32"])
    assert case.exit_code == ExitCode.DIVERGED and case.verdict == "DIVERGED"
    assert "free_queue" in case.report or "block_ids" in case.report


def test_table_lists_every_case():
    table = format_table([Case("a", "trace", "diff", 10, 0.1, ExitCode.OK),
                          Case("bb", "workload", "lockstep", 5, 0.2, ExitCode.DIVERGED, "x"),
                          Case("c", "trace", "diff", 0, 0.0, ExitCode.BAD_INPUT, "c:1: op: x")])
    rows = table.splitlines()
    assert rows[2].startswith("a ") and rows[2].endswith("conformant")
    assert rows[3].endswith("DIVERGED") and rows[4].endswith("BAD INPUT")
    assert rows[-1] == "3 cases, 15 events checked, 2 failed"


def test_bundled_traces_conform():
    from harness.gate.cases import TRACES_DIR
    from harness.trace import find_traces

    modes = set()
    for path in find_traces([str(TRACES_DIR)]):
        case = run_trace(path)
        assert case.exit_code == ExitCode.OK, case.report
        assert case.name.startswith("traces/") and case.kind == "trace"
        modes.add(case.mode.split()[0])
    # traces/upstream: known upstream bugs, reported apart (exit 0 either way).
    assert modes == {"diff", "replay", "upstream"}


def test_conform_is_the_gate_without_fuzz_run_serially(monkeypatch):
    import harness.gate.run
    from harness.cli.main import main

    calls = []
    monkeypatch.setattr(harness.gate.run, "run_gate", lambda *a: calls.append(a) or ExitCode.OK)
    assert main(["conform"]) == 0
    ((paths, fuzz_seconds, _, _, junit, summary, jobs),) = calls
    assert paths == harness.gate.run.default_paths() and fuzz_seconds == 0 and jobs == "1"
    assert junit is None and summary is None
