"""Differential fuzzing throughput: every kind config of harness/fuzz/kind_configs/
(bound: 5,000 ops/s each), and a campaign over a local Ray cluster with one
worker and with two (scaling efficiency; bound: two workers at 1.6x one).

Start-up (vLLM's import, the first backends) is paid before the clock, as the
fuzzer itself reports it apart.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fuzz.campaign import fuzz, start_up
from harness.fuzz.distributed import kind_configs
from impl.profiles import get_profile

P = get_profile("0.32")
SECONDS_PER_CONFIG = 5.0
RAY_SECONDS = 20.0
RAY_ROUNDS = 2
ROOT = Path(__file__).resolve().parents[1]
# "fuzz --ray seed 1: 2 workers, 23 configs, 1234 cases, ... (5,678 ops/s)"
_RAY_TOTALS = re.compile(r"workers, \d+ configs, (\d+) cases, .*?\(([\d,]+) ops/s\)")


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
    two of a local 2-CPU cluster, alternated RAY_ROUNDS times (the best of
    each: the machine is shared, and its load moves). Each campaign is the
    `kvconform fuzz --ray` command a user runs, in its own process, as the
    Ray tests run it (a driver connected from inside pytest could stall)."""
    from harness.fuzz.ray_cluster import local_head

    rates: dict[int, tuple] = {}
    with local_head(num_cpus=2) as head:
        for i in range(RAY_ROUNDS):
            for workers in (1, 2):
                done = subprocess.run(
                    [sys.executable, "-m", "harness.cli.main", "fuzz", "--ray", head.address,
                     "--workers", str(workers), "--seconds", str(RAY_SECONDS), "--seed", "1",
                     "--out", str(tmp_path / f"{workers}-{i}")],
                    capture_output=True, text=True, timeout=1800, cwd=ROOT)
                assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
                m = _RAY_TOTALS.search(done.stdout)
                assert m is not None, done.stdout[-1500:]
                cases, rate = int(m.group(1)), int(m.group(2).replace(",", ""))
                if rate > rates.get(workers, (0,))[0]:
                    rates[workers] = (rate, cases)
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info.update({f"ops_per_s_{w}_workers": v[0] for w, v in rates.items()})
    benchmark.extra_info.update({f"cases_{w}_workers": v[1] for w, v in rates.items()})
    benchmark.extra_info["scaling_2_over_1"] = rates[2][0] / rates[1][0]
    benchmark.extra_info["load_average_1min"] = os.getloadavg()[0]
