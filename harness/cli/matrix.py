"""The `matrix` verb (make matrix)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("matrix", help="the gate against every profiled vLLM release through "
                       "its overlay: one row per release in .matrix/matrix.md and .json")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="trace files or folders (default: the bundled traces/)")
    p.add_argument("--releases", nargs="+", metavar="VERSION",
                   help="only these releases (default: every followed one, impl/releases.py)")
    p.add_argument("--fuzz-seconds", type=float, default=24.0,
                   help="each release's fuzz budget, sliced over the kind configs "
                   "(default 24)")
    p.add_argument("--fuzz-seed", type=int, default=0)
    p.add_argument("--jobs", default="auto", help="each gate's workers (default auto)")
    p.add_argument("--out", default=".matrix", metavar="DIR",
                   help="where the reports go (default .matrix)")
    p.set_defaults(func=_cmd_matrix)


def _cmd_matrix(args) -> int:
    from harness.core.exit_codes import ExitCode, fail, worst
    from harness.core.vllm_releases import UnknownRelease, resolve
    from harness.releases.matrix.run import run_matrix
    from harness.releases.matrix.table import format_text, write_reports
    from harness.releases.vllm_overlay import OverlayError, refuse
    from impl.profiles import profiled_releases

    if args.vllm:
        return fail("matrix runs every release through its own overlay: drop --vllm")
    if args.fuzz_seconds < 0:
        return fail("--fuzz-seconds must be >= 0")
    for p in args.paths:
        if not os.path.exists(p):
            return fail(f"{p}: no such file or folder")
    try:
        releases = [resolve(r) for r in (args.releases or profiled_releases())]
    except UnknownRelease as e:
        return refuse(e, "--releases: ")
    out = Path(args.out)
    t0 = time.perf_counter()
    try:
        rows = run_matrix(releases, out, args.fuzz_seconds, args.fuzz_seed, args.jobs,
                          args.assume_profile, [os.path.abspath(p) for p in args.paths])
    except (UnknownRelease, OverlayError) as e:
        return refuse(e)
    seconds = time.perf_counter() - t0
    write_reports(rows, out, seconds, args.fuzz_seconds)
    print(format_text(rows))
    print(f"{sum(r.result == 'conformant' for r in rows)} of {len(rows)} releases conformant "
          f"in {seconds / 60:.1f} min; {out / 'matrix.md'}, {out / 'matrix.json'}",
          file=sys.stderr)
    return worst(r.exit_code for r in rows) if rows else ExitCode.OK
