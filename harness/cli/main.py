"""`kvconform`: the command line (specs/ARCHITECTURE.md).

A verb is declared one way: its module exposes `register(subparsers)`, which
adds the verb's parser (its flags, help and description) and sets its handler
as `func`; VERBS below lists the modules, in the order `--help` shows them.
The capture verb's sources are sub-verbs of `capture`, declared the same way
inside harness/cli/capture.py.

Exit codes for every verb are harness/core/exit_codes.py's: 0 conformant, 1 a
divergence, 2 bad input or usage, 3 the environment is wrong (vLLM missing, or
a version with no profile). Over several traces `worst()` decides; every trace
is still run and reported.
"""

from __future__ import annotations

import os
import sys

from harness.backends.vllm_backend import ASSUME_PROFILE_ENV
from harness.cli import (
    anonymize,
    capture,
    consumer,
    fuzz,
    gate,
    matrix,
    peer,
    replay,
    report,
    vectors,
)
from harness.cli.support import Parser, run_verb, version_line
from harness.core.exit_codes import fail
from harness.releases import bisect

# replay, diff, record | fuzz | report, stats | gate, conform | anonymize | peer |
# capture | bisect | matrix | vectors
VERBS = (replay, fuzz, report, gate, consumer, anonymize, peer, capture, bisect, matrix,
         vectors)


def build_parser() -> Parser:
    parser = Parser(prog="kvconform",
                    description="Conformance harness for vLLM's v1 KV cache manager.")
    _global_arguments(parser)
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)
    for module in VERBS:
        module.register(sub)
    _describe_verbs(sub)
    return parser


def _global_arguments(parser: Parser) -> None:
    """The flags before the verb, which every verb reads through main()."""
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--vllm", metavar="VERSION",
                        default=os.environ.get("KVCONFORM_VLLM") or None,
                        help="run the verb against that vLLM release's overlay (built if "
                        "missing; also KVCONFORM_VLLM=VERSION), e.g. 0.25.1 or 0.25")
    parser.add_argument("--assume-profile", metavar="VERSION",
                        default=os.environ.get(ASSUME_PROFILE_ENV) or None,
                        help="hold the vLLM release to another release's profile (the "
                        "upgrade question: did anything change?); results say 'unverified "
                        "profile' (also KVCONFORM_ASSUME_PROFILE=VERSION), e.g. 0.32")


def _describe_verbs(sub) -> None:
    """Every verb's --help says what it does, not only the one-line list: a
    verb registered without a description gets its help as one."""
    for action in sub._choices_actions:
        verb = sub.choices[action.dest]
        if not verb.description and action.help:
            verb.description = action.help[0].upper() + action.help[1:] + "."


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.assume_profile:
        from impl.profiles import UnsupportedVersion, get_profile

        try:
            get_profile(args.assume_profile)
        except UnsupportedVersion as e:
            return fail(f"--assume-profile: {e}")
        # Read by installed_vllm_profile(), here and in the gate's workers.
        os.environ[ASSUME_PROFILE_ENV] = args.assume_profile
    if args.vllm:
        from harness.releases.vllm_overlay import activate_for_cli

        code = activate_for_cli(args.vllm)
        if code:
            return code
    return run_verb(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
