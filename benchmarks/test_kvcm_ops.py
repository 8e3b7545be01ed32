"""KV cache manager operations per second: impl vs the installed vLLM, on the
identical seeded scheduler workload (group `kvcm-ops`).

Each round builds a fresh manager and runs every call of the workload through
the driver protocol: request creation and block hashing, lookups, allocations,
token appends, preemptions and frees. Checkpoints (harness observations, not
manager calls) are left out of the timed list.
"""

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.backends.vllm_backend import VllmBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import Checkpoint
from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
from impl.profiles import get_profile

P = get_profile("0.32")
CONFIG = CacheConfig(num_blocks=40, groups=(GroupConfig(16),), enable_kv_cache_events=False)
SPEC = WorkloadSpec(seed=1, block_size=16)
MAKE = {"impl": lambda: ImplBackend(CONFIG, P), "vllm": lambda: VllmBackend(CONFIG, P)}


@pytest.fixture(scope="module")
def events():
    # The calls vLLM's answers lead the scheduler to make.
    stream = SchedulerWorkload(SPEC, P, CONFIG.num_blocks).events()
    evs = [e for e, _ in drive(stream, MAKE["vllm"]().run) if not isinstance(e, Checkpoint)]
    # Identical answers on both sides before anything is timed.
    impl, vllm = MAKE["impl"](), MAKE["vllm"]()
    for i, e in enumerate(evs):
        assert impl.run(e) == vllm.run(e), f"event #{i} {e!r} diverges"
    return evs


@pytest.mark.benchmark(group="kvcm-ops")
@pytest.mark.parametrize("backend", ["impl", "vllm"])
def test_kvcm_ops(benchmark, backend, events):
    def setup():
        return (MAKE[backend]().run,), {}

    def run_all(run):
        for e in events:
            run(e)

    benchmark.pedantic(run_all, setup=setup, rounds=15, warmup_rounds=2)
    benchmark.extra_info["ops"] = len(events)
    benchmark.extra_info["ops_per_s"] = len(events) / benchmark.stats.stats.median
