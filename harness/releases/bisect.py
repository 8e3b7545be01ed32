"""`kvconform bisect`: which vLLM release first answers a trace differently.

The trace (a scenario, a captured trace, a fuzz finding) is run through the
vLLM adapter on every followed release from --from to --to, one subprocess per
release with that release's overlay first on PYTHONPATH
(harness/releases/release_answers.py); each release's answers are compared with the
--from release's, event by event. The first release that differs is named with
the event, the first differing field, both answers, and the KV cache source
files that changed between it and the release before it (read from the two
overlays). Releases are walked in order, not halved: a change that a later
release reverts is still found.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.compare import first_difference
from harness.core.vllm_releases import RELEASES, between, newest
from harness.releases.release_answers import MARKER
from harness.releases.vllm_overlay import ensure

# The KV cache code whose changes explain a behaviour change (relative to the
# overlay root): what a KV cache manager caller reaches, and its sizing.
KV_SOURCES = (
    "vllm/v1/core/*.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/distributed/kv_events.py",
    "vllm/v1/request.py",
    "vllm/utils/hashing.py",
)
# A release's run of one trace, generously bounded (a loaded 2-core machine).
RELEASE_TIMEOUT_S = 1800


class BisectError(RuntimeError):
    """A release could not be run (exit_code: 2 bad trace, 3 environment)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(slots=True)
class ReleaseRun:
    version: str
    profile: str | None
    results: list[dict]  # per event: {"line", "op", "answer"} or {..., "error", "message"}
    seconds: float

    @property
    def stopped(self) -> dict | None:
        """The event this release could not execute, if any."""
        return self.results[-1] if self.results and "error" in self.results[-1] else None


@dataclass(slots=True)
class Difference:
    index: int  # 0-based event position
    line: int
    op: str
    field: str
    before: dict  # the --from release's result for that event
    after: dict


@dataclass(slots=True)
class ChangedFile:
    path: str
    added: int
    removed: int


@dataclass(slots=True)
class BisectResult:
    trace: str
    runs: list[ReleaseRun] = field(default_factory=list)
    # The first release whose answers differ from runs[0]'s, and the release
    # before it (whose answers do not).
    changed_in: str | None = None
    last_same: str | None = None
    difference: Difference | None = None
    changed_files: list[ChangedFile] = field(default_factory=list)


def _outcome(result: dict) -> dict:
    """What is compared of one event's result: the answer, or the kind of
    refusal (messages name the release, so they are shown, not compared)."""
    return {"answer": result["answer"]} if "answer" in result else {"error": result["error"]}


def compare(base: ReleaseRun, other: ReleaseRun) -> Difference | None:
    """The first event at which `other` answers differently from `base`. A run
    ends early only at an event it cannot execute, which is compared as an
    outcome like any answer, so equal runs have equal lengths."""
    for i, (a, b) in enumerate(zip(base.results, other.results)):
        oa, ob = _outcome(a), _outcome(b)
        if oa != ob:
            if "error" in oa or "error" in ob:
                name = "(executes vs refuses)"
            else:
                name = first_difference(oa["answer"], ob["answer"]) or "(whole answer)"
            # A release refusing the trace's cache config stops at its header.
            at = b if b["op"] == "header" else a
            return Difference(i, at["line"], at["op"], name, a, b)
    return None


def run_release(traces: list[str], version: str, progress: bool = True) -> dict[str, ReleaseRun]:
    """Each trace's answers on one release (its overlay built first if
    missing), all in one subprocess."""
    overlay = ensure(version, progress)
    env = dict(os.environ, PYTHONPATH=str(overlay.path), KVCONFORM_VLLM="")
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness.releases.release_answers", *traces],
            capture_output=True, text=True, env=env, timeout=RELEASE_TIMEOUT_S * len(traces),
        )
    except subprocess.TimeoutExpired:
        raise BisectError(f"vLLM {version}: no answers in time", 3) from None
    runs: dict[str, ReleaseRun] = {}
    current = None
    for line in done.stdout.splitlines():
        if not line.startswith(MARKER):
            continue
        item = json.loads(line[len(MARKER):])
        if "trace" in item:
            current = runs[item["trace"]] = ReleaseRun(item["vllm"], item["profile"], [], 0.0)
        elif current is not None:
            current.results.append(item)
    if done.returncode != 0 or len(runs) != len(traces):
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BisectError(tail.removeprefix("kvconform: "),
                          done.returncode if done.returncode in (2, 3) else 3)
    seconds = time.perf_counter() - t0
    for run in runs.values():
        run.seconds = seconds / len(runs)
    return runs


def _kv_files(root: Path) -> dict[str, Path]:
    out = {}
    for pattern in KV_SOURCES:
        for p in root.glob(pattern):
            out[str(p.relative_to(root))] = p
    return out


def changed_kv_files(old: str, new: str) -> list[ChangedFile]:
    """The KV cache source files that differ between two releases' overlays,
    with the lines added and removed."""
    return changed_files(ensure(old, False).path, ensure(new, False).path)


def changed_files(old_root: Path, new_root: Path) -> list[ChangedFile]:
    """The KV cache source files (KV_SOURCES) that differ between two trees."""
    a, b = _kv_files(Path(old_root)), _kv_files(Path(new_root))
    changed = []
    for name in sorted(set(a) | set(b)):
        old_lines = a[name].read_text().splitlines() if name in a else []
        new_lines = b[name].read_text().splitlines() if name in b else []
        if old_lines == new_lines:
            continue
        added = removed = 0
        for line in difflib.unified_diff(old_lines, new_lines, lineterm="", n=0):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        changed.append(ChangedFile(name, added, removed))
    return changed


def bisect(trace: str, first: str, last: str, progress: bool = True) -> BisectResult:
    """Run `trace` on the releases from `first` to `last` until one answers
    differently from `first`."""
    releases = between(first, last)
    result = BisectResult(trace)
    previous = None
    for n, version in enumerate(releases, 1):
        if progress:
            print(f"kvconform: bisect [{n}/{len(releases)}] vLLM {version} ...",
                  file=sys.stderr, end="", flush=True)
        try:
            run = run_release([trace], version, progress)[trace]
            stop = run.stopped
            if stop is not None and stop["error"] == "TraceError":
                raise BisectError(stop["message"], stop.get("exit_code", 2))
        except BaseException:
            if progress:
                print(file=sys.stderr, flush=True)  # end the progress line
            raise
        result.runs.append(run)
        diff = compare(result.runs[0], run) if n > 1 else None
        if progress:
            what = f"{len(run.results)} events" + (
                f", stops at line {stop['line']} ({stop['error']})" if stop else "")
            verdict = "" if n == 1 else (" DIFFERS" if diff else " same answers")
            print(f" {what} ({run.seconds:.1f} s){verdict}", file=sys.stderr, flush=True)
        if diff is not None:
            result.changed_in, result.last_same, result.difference = version, previous, diff
            result.changed_files = changed_kv_files(previous, version)
            return result
        previous = version
    return result


def _short(value, limit: int = 240) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(result: dict) -> str:
    if "answer" in result:
        return _short(result["answer"])
    return f"cannot execute it: {result['error']}: {result['message']}"


def format_result(r: BisectResult) -> str:
    first = r.runs[0].version
    if r.changed_in is None:
        tested = ", ".join(run.version for run in r.runs)
        return (f"{r.trace}: every release answers as vLLM {first} does "
                f"({len(r.runs)} releases: {tested}); no release changes these answers")
    d = r.difference
    before = (f"right after {first}" if r.last_same == first else
              f"vLLM {r.last_same}, the release before it, answers as {first} does")
    lines = [
        f"{r.trace}: first changed in vLLM {r.changed_in} ({before})",
        f"  {r.trace}:{d.line}: " + ("the cache config (header)" if d.op == "header" else
                                     f"event #{d.index} ({d.op}), field {d.field}"),
        f"  {first:>9}: {_shown(d.before)}",
        f"  {r.changed_in:>9}: {_shown(d.after)}",
        f"  KV cache sources changed {r.last_same} -> {r.changed_in}:",
    ]
    lines += [f"    {f.path} (+{f.added} -{f.removed})" for f in r.changed_files] or [
        "    (none: the change comes from code outside the KV cache sources)"]
    return "\n".join(lines)


def result_json(r: BisectResult) -> dict:
    return {
        "trace": r.trace,
        "releases": [{"vllm": run.version, "profile": run.profile, "events": len(run.results),
                      "stopped": run.stopped, "seconds": round(run.seconds, 2)}
                     for run in r.runs],
        "changed_in": r.changed_in,
        "last_same": r.last_same,
        "difference": None if r.difference is None else {
            "index": r.difference.index, "line": r.difference.line, "op": r.difference.op,
            "field": r.difference.field, "before": r.difference.before,
            "after": r.difference.after},
        "changed_files": [{"path": f.path, "added": f.added, "removed": f.removed}
                          for f in r.changed_files],
    }


def register(sub) -> None:
    """The `bisect` verb."""
    p = sub.add_parser("bisect", help="the first vLLM release whose answers to a trace "
                       "differ from an older release's (each release through its overlay)")
    p.add_argument("trace", metavar="TRACE", help="a trace file (or a fuzz finding)")
    # The defaults are the followed releases' ends (impl/releases.py), so a new
    # release is bisected to without editing this verb.
    p.add_argument("--from", dest="first", default=RELEASES[0], metavar="VERSION",
                   help="the release whose answers are the reference "
                   f"(default the oldest followed, {RELEASES[0]})")
    p.add_argument("--to", dest="last", default=newest(), metavar="VERSION",
                   help=f"the newest release to try (default the newest followed, {newest()})")
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    p.set_defaults(func=_cmd_bisect)


def _cmd_bisect(args) -> int:
    from harness.core.exit_codes import ExitCode
    from harness.core.vllm_releases import UnknownRelease
    from harness.releases.vllm_overlay import OverlayError, refuse

    if not os.path.isfile(args.trace):
        print(f"kvconform: {args.trace}: no such trace file", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        result = bisect(args.trace, args.first, args.last, progress=not args.json)
    except (UnknownRelease, OverlayError) as e:
        return refuse(e)
    except BisectError as e:
        print(str(e) if str(e).startswith(args.trace) else f"kvconform: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(result_json(result), indent=1) if args.json else format_result(result))
    # Two releases answering differently is a divergence (so a CI step
    # `bisect T --from 0.32 --to 0.33` fails when 0.33 changed the answers).
    return ExitCode.OK if result.changed_in is None else ExitCode.DIVERGED
