"""Run `kvconform capture ...` against vLLM 0.17.1's pure-Python code (its
overlay, `ci/vllm-overlay.sh 0.17.1`), for the golden v0.17 traces. Not run by CI.

    PYTHONPATH=.vllm-0.17.1 .venv/bin/python ci/vllm017_capture.py \
        capture scheduler --all --out traces/golden/v0.17
"""

import argparse
import sys


def main() -> int:
    import vllm

    if not vllm.__version__.startswith("0.17."):
        print(f"ci/vllm017_capture.py: vLLM {vllm.__version__} is imported, not 0.17.x "
              "(PYTHONPATH=.vllm-0.17.1; ci/vllm-overlay.sh 0.17.1)", file=sys.stderr)
        return 3
    from harness.capture.cli import register
    from harness.capture.overlay_platform import use_cpu_platform_without_kernels

    use_cpu_platform_without_kernels()
    parser = argparse.ArgumentParser(prog="kvconform")
    register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
