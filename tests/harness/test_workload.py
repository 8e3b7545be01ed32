"""The seeded scheduler-like workload, live: impl and vLLM give identical answers
to every call of >= 5,000 (block ids, hit tokens, free-queue order after every
free and preemption, KV events, stats)."""

from collections import Counter

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import Checkpoint, Free, Preempt
from harness.report.text import format_failure
from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
from impl.profiles import get_profile

P = get_profile("0.32")
CONFIG = CacheConfig(num_blocks=24, groups=(GroupConfig(16),))
SPEC = WorkloadSpec(seed=11, block_size=16)


def test_workload_is_deterministic_and_reaches_the_corners():
    def kinds_and_answers():
        backend = ImplBackend(CONFIG, P)
        return list(drive(SchedulerWorkload(SPEC, P, CONFIG.num_blocks).events(), backend.run))

    first, second = kinds_and_answers(), kinds_and_answers()
    assert [(e, a) for e, a in first] == [(e, a) for e, a in second]
    kinds = Counter(e.kind for e, _ in first)
    assert sum(kinds.values()) >= 5000
    assert kinds["preempt"] > 0 and kinds["free"] == SPEC.num_requests
    hits = [a["hit_tokens"] for e, a in first if e.kind == "lookup"]
    assert sum(h > 0 for h in hits) > 50
    refused = [a for e, a in first if e.kind == "allocate" and "refused" in a]
    assert len(refused) > 10
    # Every free and preemption is followed by a free-queue checkpoint (its
    # digest: O(1) at any pool size), and the run ends with the whole queue.
    for (e, _), (nxt, _) in zip(first, first[1:]):
        if isinstance(e, (Free, Preempt)):
            assert isinstance(nxt, Checkpoint) and "free_queue_digest" in nxt.fields
    assert "free_queue" in first[-1][0].fields


@pytest.mark.vllm
def test_workload_identical_on_impl_and_vllm():
    from harness.backends.vllm_backend import VllmBackend

    stream = SchedulerWorkload(SPEC, P, CONFIG.num_blocks).events()
    result = run_lockstep(stream, [VllmBackend(CONFIG, P), ImplBackend(CONFIG, P, check=True)])
    assert result.failure is None, format_failure(result.failure)
    assert result.num_events >= 5000


@pytest.mark.vllm017
def test_workload_identical_on_impl_and_vllm_0_17():
    from harness.backends.vllm_backend import VllmBackend

    p017 = get_profile("0.17")
    stream = SchedulerWorkload(SPEC, p017, CONFIG.num_blocks).events()
    result = run_lockstep(stream, [VllmBackend(CONFIG, p017),
                                   ImplBackend(CONFIG, p017, check=True)])
    assert result.failure is None, format_failure(result.failure)
