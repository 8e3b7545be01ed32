#!/usr/bin/env python3
"""Print ops/s per backend and the impl/vLLM ratio from pytest-benchmark JSON.

    python ci/bench_ratio.py .bench/results.json
"""

import json
import sys


def main(path: str) -> int:
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        if b["group"] != "kvcm-ops":
            continue
        ops = b["extra_info"]["ops"]
        rows[b["param"]] = (ops / b["stats"]["median"], ops / b["stats"]["max"],
                            ops / b["stats"]["min"])
    print(f"{'backend':<8} {'ops/s (median)':>15} {'worst':>10} {'best':>10}")
    for name, (med, worst, best) in sorted(rows.items()):
        print(f"{name:<8} {med:>15,.0f} {worst:>10,.0f} {best:>10,.0f}")
    if "impl" in rows and "vllm" in rows:
        print(f"impl/vLLM ops/s ratio (median): {rows['impl'][0] / rows['vllm'][0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".bench/results.json"))
