"""`kvconform`: the command line (DESIGN.md §6).

Exit codes for every verb: 0 conformant, 1 a divergence, 2 bad input or usage,
3 the environment is wrong (vLLM missing, or a version with no profile).
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2, in one line
        self.print_usage(sys.stderr)
        print(f"kvconform: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _cmd_conform(args: argparse.Namespace) -> int:
    from harness import conform

    return conform.main()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvconform", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    p = sub.add_parser(
        "conform",
        help="run the bundled scenarios and seeded workloads live, impl vs installed vLLM",
    )
    p.set_defaults(func=_cmd_conform)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
