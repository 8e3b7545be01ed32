"""The conformance runner reports conformance, and divergence when there is one."""

import pytest

from harness.conform import WORKLOADS, CaseResult, format_table, run_workload
from impl.profiles import PROFILES

pytestmark = pytest.mark.vllm


def test_workload_conforms():
    result = run_workload(WORKLOADS[0], PROFILES["0.32"])
    assert result.problem is None and result.num_events > 5000


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
    result = run_workload(WORKLOADS[0], PROFILES["0.32"])
    assert result.problem is not None
    assert "free_queue" in result.problem or "block_ids" in result.problem


def test_table_lists_every_case():
    table = format_table([CaseResult("a", "diff", 10, 0.1, None),
                          CaseResult("bb", "lockstep", 5, 0.2, "x", 1)])
    assert "a " in table and "conformant" in table and "DIVERGED" in table
    assert "2 cases, 15 events checked, 1 failed" in table


def test_bundled_traces_conform():
    from harness.conform import TRACES_DIR, run_trace
    from harness.trace import find_traces

    for path in find_traces([str(TRACES_DIR)]):
        result = run_trace(path)
        assert result.problem is None, result.problem
