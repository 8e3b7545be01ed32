"""The `kvconform peer` verb: vLLM's own KV-cache unit tests, on vLLM and then
on impl through adapters (harness/peer/)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "peer",
        help="run the installed vLLM's own KV-cache unit tests on vLLM, then on impl "
             "through adapters; results in .peer/ (summary.json, summary.md, gaps.md)")
    p.add_argument("--out", type=Path, default=Path(".peer"),
                   help="cache and results folder (default .peer)")
    p.add_argument("-n", "--workers", default="auto",
                   help="pytest-xdist workers (default auto; 0: no xdist)")
    p.add_argument("--rerun-vllm", action="store_true",
                   help="run the tests on vLLM again even if results are cached")
    p.add_argument("--matrix", action="store_true",
                   help="every profiled release, one after another, each through its overlay "
                        "(`kvconform --vllm V peer`): one row per release in OUT/matrix.md "
                        "and .json, each release's results in OUT/V/")
    p.add_argument("--releases", nargs="+", metavar="VERSION",
                   help="with --matrix: only these releases (default: every profiled one)")
    p.add_argument("tests", nargs="*", metavar="TEST",
                   help="test paths or node ids inside the sdist (default: the KV-cache files)")
    p.set_defaults(func=_cmd_peer)


def _cmd_peer(args: argparse.Namespace) -> int:
    from harness.peer import run

    if args.matrix:
        return _cmd_matrix(args)
    if args.releases:
        return _fail("--releases goes with --matrix")
    release = None
    if args.vllm:
        from harness.core.vllm_releases import resolve

        release = resolve(args.vllm)  # main() has activated its overlay
    return run.main(args.out, args.workers, args.rerun_vllm, args.tests or None,
                    release=release)


def _fail(message: str) -> int:
    from harness.core.exit_codes import fail

    return fail(message)


def _cmd_matrix(args: argparse.Namespace) -> int:
    from harness.core.vllm_releases import UnknownRelease, resolve
    from harness.peer import matrix
    from harness.releases.vllm_overlay import refuse
    from impl.profiles import profiled_releases

    if args.vllm:
        return _fail("peer --matrix runs every release through its own overlay: drop --vllm")
    try:
        releases = [resolve(r) for r in (args.releases or profiled_releases())]
    except UnknownRelease as e:
        return refuse(e, "--releases: ")
    return matrix.main(releases, args.out, args.workers, args.rerun_vllm, args.tests or None)
