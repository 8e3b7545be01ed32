"""Differential fuzzing throughput: every kind config of harness/fuzz/kind_configs/
(bound: 5,000 ops/s each), and a campaign over a local Ray cluster with one
worker and with two (scaling efficiency; bound: two workers at 1.6x one).

Start-up (vLLM's import, the first backends) is paid before the clock, as the
fuzzer itself reports it apart.
"""

import os
import time

import pytest

from harness.fuzz.campaign import fuzz, start_up
from harness.fuzz.distributed import kind_configs
from impl.profiles import get_profile

P = get_profile("0.32")
SECONDS_PER_CONFIG = 5.0
RAY_SECONDS = 8.0
RAY_ROUNDS = 3


@pytest.mark.benchmark(group="fuzz-kinds")
def test_fuzz_ops_per_second_per_kind_config(benchmark, tmp_path):
    import gc

    start_up(P)
    rates = {}
    try:
        for name, fc in kind_configs().items():
            r = fuzz(P, SECONDS_PER_CONFIG, 1, str(tmp_path), fuzz_config=fc, started=True)
            assert r.finding is None, r.finding
            rates[name] = (r.ops_per_s, r.cases)
    finally:
        gc.unfreeze()
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info["seconds_per_config"] = SECONDS_PER_CONFIG
    for name, (rate, cases) in rates.items():
        benchmark.extra_info[f"ops_per_s:{name}"] = rate
        benchmark.extra_info[f"cases:{name}"] = cases


@pytest.mark.benchmark(group="fuzz-ray")
def test_ray_fuzz_one_worker_vs_two(benchmark, tmp_path):
    """The same campaign (every kind config, RAY_SECONDS) on one worker and on
    two of a local 2-CPU cluster, alternated ROUNDS times (the best of each:
    the machine is shared, and its load moves)."""
    from harness.fuzz.distributed import fuzz_on_ray
    from harness.ray_cluster import WorkerPool, connect, local_head

    rates: dict[int, tuple] = {}
    with local_head(num_cpus=2) as head:
        ray = connect(head.address)
        pool = WorkerPool(ray, 2)
        try:
            pool.start(P.name)
            for i in range(RAY_ROUNDS):
                for workers in (1, 2):
                    c0 = time.process_time()
                    r = fuzz_on_ray(pool.first(workers), P.name, RAY_SECONDS, 1,
                                    str(tmp_path / f"{workers}-{i}"), kind_configs())
                    driver = (time.process_time() - c0) / r.seconds
                    assert not r.findings and not r.lost_units
                    if r.ops_per_s > rates.get(workers, (0,))[0]:
                        rates[workers] = (r.ops_per_s, r.cases, driver)
        finally:
            pool.close()
            ray.shutdown()
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info.update({f"ops_per_s_{w}_workers": v[0] for w, v in rates.items()})
    benchmark.extra_info.update({f"cases_{w}_workers": v[1] for w, v in rates.items()})
    benchmark.extra_info.update({f"driver_cpu_share_{w}_workers": v[2] for w, v in rates.items()})
    benchmark.extra_info["scaling_2_over_1"] = rates[2][0] / rates[1][0]
    benchmark.extra_info["load_average_1min"] = os.getloadavg()[0]
