"""Differential fuzzing throughput: every kind config of harness/fuzz/kind_configs/
against its two backends' serial rate measured in the same run (bound: the
fuzzer keeps at least FUZZ_SHARE of it; ci/bench-table), and a campaign over a
local Ray cluster with one worker and with two (scaling efficiency; bound: two
workers at 1.6x one).

A fuzz campaign's speed is mostly its backends' speed, and that depends on the
processor (impl's lead over vLLM does too: specs/FUZZING.md, "Speed"). So the
bound is not a number of ops per second but what the fuzzer (drawing programs,
turning actions into calls, comparing answers, impl's invariant checker, which
both sides of the ratio run) keeps of the rate at which the same backends run
the same calls by themselves, one after the other: vLLM alone, then impl alone,
each built per case as the fuzzer builds them.

Start-up (vLLM's import, the first backends) is paid before the clock, as the
fuzzer itself reports it apart.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.fuzz.campaign import build_backends, case_rng, fuzz, run_case, start_up
from harness.fuzz.distributed import kind_configs
from harness.fuzz.generate import draw_case
from impl.profiles import get_profile

P = get_profile("0.32")
SECONDS_PER_CONFIG = 5.0
MAX_OPS = 40
RAY_SECONDS = 20.0
RAY_ROUNDS = 2
ROOT = Path(__file__).resolve().parents[1]
# "fuzz --ray seed 1: 2 workers, 23 configs, 1234 cases, ... (5,678 ops/s)"
_RAY_TOTALS = re.compile(r"workers, \d+ configs, (\d+) cases, .*?\(([\d,]+) ops/s\)")


def _calls_of_cases(fc, seed: int, cases: int) -> list:
    """The calls the campaign made, case by case: the same seeded draws run
    again (each case's calls depend on the answers, so they are replayed from
    a run, not drawn)."""
    out = []
    for case in range(cases):
        config, actions = draw_case(case_rng(seed, case), fc, MAX_OPS, P.hash_lookahead_tokens)
        run = run_case(config, actions, P)
        if run.refused is None and run.events:
            out.append((config, [e for e, _ in run.events]))
    return out


def _backends_alone(calls: list) -> tuple[float, float]:
    """CPU seconds vLLM alone and impl alone take on the calls, each backend
    built per case (as the fuzzer builds it) and run by itself."""
    seconds = [0.0, 0.0]
    for config, events in calls:
        for i in (0, 1):
            t0 = time.process_time()
            backend = build_backends(config, P)[i]
            run = backend.run
            for e in events:
                run(e)
            seconds[i] += time.process_time() - t0
    return seconds[0], seconds[1]


@pytest.mark.benchmark(group="fuzz-kinds")
def test_fuzz_ops_per_second_per_kind_config(benchmark, tmp_path):
    import gc

    start_up(P)
    rows = {}
    try:
        for name, fc in kind_configs().items():
            c0 = time.process_time()
            r = fuzz(P, SECONDS_PER_CONFIG, 1, str(tmp_path), max_ops=MAX_OPS, fuzz_config=fc,
                     started=True)
            fuzz_cpu = time.process_time() - c0
            assert r.finding is None, r.finding
            calls = _calls_of_cases(fc, 1, r.cases)
            ops = sum(len(ev) for _, ev in calls)
            vllm_s, impl_s = _backends_alone(calls)
            # Both sides of the bound in CPU seconds: the machine is shared.
            rows[name] = {"ops_per_s": r.ops_per_s, "cases": r.cases,
                          "ops_per_cpu_s": r.ops / fuzz_cpu,
                          "serial_ops_per_cpu_s": ops / (vllm_s + impl_s),
                          "impl_over_vllm": vllm_s / impl_s}
    finally:
        gc.unfreeze()
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info["seconds_per_config"] = SECONDS_PER_CONFIG
    for name, row in rows.items():
        for key, value in row.items():
            benchmark.extra_info[f"{key}:{name}"] = value


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
                    capture_output=True, text=True, timeout=1800, cwd=ROOT,
                    env=head.client_env())
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
