#!/usr/bin/env python3
"""Print the benchmark results that matter from pytest-benchmark JSON:
KV-manager ops/s per backend with the impl/vLLM ratio, trace events/s, and
streaming-replay peak memory.

    python ci/bench_ratio.py .bench/results.json
"""

import json
import sys


def main(path: str) -> int:
    with open(path) as f:
        data = json.load(f)
    ops = {}
    for b in data["benchmarks"]:
        info, group = b["extra_info"], b["group"]
        if group == "kvcm-ops":
            ops[b["param"]] = info["ops"] / b["stats"]["median"]
        elif group == "trace-events":
            print(f"trace {b['param']:<6} {info['events_per_s']:>10,.0f} events/s "
                  f"({info['events']} events)")
        elif group == "trace-memory":
            print("streaming replay peak RSS: " + ", ".join(
                f"{k.removeprefix('peak_rss_mb_')} events {v:.1f} MB"
                for k, v in info.items() if k.startswith("peak_rss_mb_")))
    for name, rate in sorted(ops.items()):
        print(f"kvcm-ops {name:<6} {rate:>10,.0f} ops/s (median)")
    if "impl" in ops and "vllm" in ops:
        print(f"impl/vLLM ops/s ratio: {ops['impl'] / ops['vllm']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".bench/results.json"))
