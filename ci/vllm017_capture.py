"""Run `kvconform capture ...` against vLLM 0.17.1's pure-Python code (its
overlay, `ci/vllm-overlay.sh 0.17.1`), for the golden v0.17 traces. Not run by CI.

    PYTHONPATH=.vllm-0.17.1 .venv/bin/python ci/vllm017_capture.py \
        capture scheduler --all --out traces/golden/v0.17
"""

import sys

from harness.cli.support import Parser, run_verb
from harness.core.exit_codes import ExitCode, fail


def main() -> int:
    import vllm

    if not vllm.__version__.startswith("0.17."):
        return fail(f"vLLM {vllm.__version__} is imported, not 0.17.x "
                    "(PYTHONPATH=.vllm-0.17.1; ci/vllm-overlay.sh 0.17.1)", ExitCode.ENVIRONMENT)
    from harness.capture.overlay_platform import use_cpu_platform_without_kernels
    from harness.cli.capture import register

    use_cpu_platform_without_kernels()
    parser = Parser(prog="kvconform")
    register(parser.add_subparsers(dest="verb", required=True, parser_class=Parser))
    args = parser.parse_args()
    return run_verb(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
