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
    p.add_argument("tests", nargs="*", metavar="TEST",
                   help="test paths or node ids inside the sdist (default: the KV-cache files)")
    p.set_defaults(func=_cmd_peer)


def _cmd_peer(args: argparse.Namespace) -> int:
    from harness.peer import run

    return run.main(args.out, args.workers, args.rerun_vllm, args.tests or None)
