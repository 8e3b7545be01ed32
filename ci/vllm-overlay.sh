#!/usr/bin/env bash
# Build the overlay of one vLLM release: its pure-Python KV cache code, from the
# release's wheel (pip --no-deps --target, through pip's cache, or from the
# wheels in $KVCONFORM_WHEELS), trimmed to the packages that code imports, in
# .vllm-VERSION/ (harness/releases/vllm_overlay.py). Prints the overlay's path; builds
# nothing when a whole overlay is already there (--force rebuilds).
#
#   ci/vllm-overlay.sh VERSION [--force]          VERSION: 0.25.1, or a minor: 0.25
#   kvconform --vllm VERSION VERB ...              any verb on that release
#   PYTHONPATH=.vllm-VERSION .venv/bin/python -m pytest -m vllm017 tests
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m harness.releases.vllm_overlay "$@"
