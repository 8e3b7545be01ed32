"""The `vectors` verb: golden vectors of vLLM's block hashes and KV events,
per release (specs/VECTORS.md); `vectors check`: impl reproduces them;
`vectors diff A B`: what changes for a consumer between two releases."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.cli.support import Parser


def register(sub) -> None:
    p = sub.add_parser(
        "vectors", help="golden vectors from each vLLM release's own code: block hashes "
        "and KV events as published (specs/VECTORS.md)")
    p.add_argument("--vllm", dest="release", metavar="VERSION",
                   help="the release (its overlay; the installed vLLM for its own release)")
    p.add_argument("--all", action="store_true",
                   help="every followed release (impl/releases.py)")
    p.add_argument("--out", metavar="DIR", help="writes DIR/VERSION/hashes.json and events.json")
    p.add_argument("--jobs", "-j", type=int, default=1, help="releases at once (default 1)")
    p.set_defaults(func=_cmd_produce)
    verbs = p.add_subparsers(dest="vectors_verb", parser_class=Parser, metavar="{check,diff}")
    c = verbs.add_parser("check", help="impl (with each release's profile) reproduces every "
                         "vector: hashes, events, wire bytes; exit 1 on a mismatch")
    c.add_argument("paths", nargs="*", metavar="PATH",
                   help="a release's folder, a folder of them, or a release (default: the "
                   "vendored traces/vectors)")
    c.set_defaults(func=_cmd_check)
    d = verbs.add_parser("diff", help="what changes for a consumer between two releases' "
                         "vectors, field by field")
    d.add_argument("a", metavar="A", help="a release (its vendored vectors) or a folder")
    d.add_argument("b", metavar="B", help="a release (its vendored vectors) or a folder")
    d.set_defaults(func=_cmd_diff)


def _cmd_produce(args) -> int:
    from harness.core.exit_codes import ExitCode, fail, worst
    from harness.core.vllm_releases import RELEASES, UnknownRelease, resolve
    from harness.releases.vectors import Produced, format_sizes, produce_all
    from harness.releases.vllm_overlay import OverlayError, refuse

    release = args.release or args.vllm
    if args.all == bool(release):
        return fail("vectors: give --vllm VERSION or --all")
    if not args.out:
        return fail("vectors: --out DIR is needed")
    try:
        releases = list(RELEASES) if args.all else [resolve(release)]
        results = produce_all(releases, Path(args.out), args.jobs)
    except (UnknownRelease, OverlayError) as e:
        return refuse(e, "--vllm: ")
    made = [r for r in results if isinstance(r, Produced)]
    if made:
        print(format_sizes(made))
    for r in results:
        if not isinstance(r, Produced):
            print(f"kvconform: {r}", file=sys.stderr)
    return worst([ExitCode.OK, *(r.exit_code for r in results if not isinstance(r, Produced))])


def _folders(paths: list[str]) -> list[Path]:
    from harness.releases.vectors import VENDORED, release_folder
    from harness.releases.vectors_check import release_folders

    out: list[Path] = []
    for given in paths or [str(VENDORED)]:
        out += release_folders(release_folder(given))
    return out


def _cmd_check(args) -> int:
    from harness.core.exit_codes import ExitCode, fail
    from harness.core.vllm_releases import UnknownRelease
    from harness.releases.vectors_check import check_folder
    from harness.releases.vectors_format import VectorsError

    try:
        folders = _folders(args.paths)
        results = [check_folder(f) for f in folders]
    except (VectorsError, UnknownRelease) as e:
        return fail(str(e))
    bad = 0
    for r in results:
        for m in r.mismatches:
            print(m)
        bad += len(r.mismatches)
        word = "reproduced" if not r.mismatches else f"{len(r.mismatches)} MISMATCHES"
        print(f"vLLM {r.release}: {r.cases} vectors, {word}", file=sys.stderr)
    return ExitCode.DIVERGED if bad else ExitCode.OK


def _cmd_diff(args) -> int:
    from harness.core.exit_codes import ExitCode, fail
    from harness.core.vllm_releases import UnknownRelease
    from harness.releases.vectors import release_folder
    from harness.releases.vectors_diff import diff_folders, format_changes
    from harness.releases.vectors_format import VectorsError

    try:
        a, b = release_folder(args.a), release_folder(args.b)
        ha, hb, changes = diff_folders(a, b)
    except (VectorsError, UnknownRelease) as e:
        return fail(str(e))
    print(format_changes(f"vLLM {ha['vllm']}", f"vLLM {hb['vllm']}", changes))
    if not changes:
        print("(no change a consumer sees)")
    return ExitCode.OK
