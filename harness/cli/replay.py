"""The verbs that run traces through backends: `replay` (one backend), `diff`
(impl and the installed vLLM in lockstep, and the attention differential) and
`record` (vLLM's answers written into a copy); harness/sources/replay.py runs
them."""

from __future__ import annotations

import argparse
import json
import sys

from harness.backends.vllm_check import check_vllm
from harness.cli.support import backend_name, print_error, print_outcome, trace_paths
from harness.core.exit_codes import ExitCode, fail, worst


def register(sub) -> None:
    p = sub.add_parser("replay", help="run traces through a backend and check their answers",
                       description="Run each trace through one backend (impl by default, "
                       "without vLLM) and check every answer against the answers the trace "
                       "recorded and its hand-derived expectations. One line per trace: "
                       "conformant, truncated (a capture that lacks its end), DIVERGED (the "
                       "report follows), bad input or not checked. Exit 0, 1 (a divergence), "
                       "2 (bad input), 3 (environment); the worst of all traces.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--backend", type=backend_name, default="impl", metavar="BACKEND",
                   help="impl (default), vllm, or exec:CMD: a backend in another process "
                   "and any language (specs/FOREIGN_BACKEND.md)")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--check-invariants", action="store_true",
                   help="run impl's invariant checker after every event (slower)")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("diff", help="run traces through impl and the installed vLLM "
                       "side by side, comparing every answer (and the recorded ones)",
                       description="Run each trace through the installed vLLM's KV cache "
                       "manager and impl in lockstep: their answers must be equal, equal to "
                       "the answers the trace recorded and satisfy its expectations. Traces "
                       "with a model header also get the attention-output differential. A "
                       "trace recorded for another vLLM version is skipped (replay runs it "
                       "on impl); a run that checked nothing is exit 3.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--check-invariants", action="store_true",
                   help="run impl's invariant checker after every event (slower)")
    p.add_argument("--backend", type=backend_name, default="impl", metavar="BACKEND",
                   help="what runs beside vLLM: impl (default) or exec:CMD, a backend in "
                   "another process and any language (specs/FOREIGN_BACKEND.md)")
    p.add_argument("--no-attention", action="store_true",
                   help="skip the attention-output differential of traces with a model "
                   "header (specs/ATTENTION.md)")
    p.add_argument("--attention-dtype", choices=["float32", "float16", "bfloat16"],
                   help="dtype of the attention differential (default: the trace's model)")
    p.add_argument("--attention-max-batches", type=int, default=16, metavar="N",
                   help="check at most N batches (steps) of attention per trace "
                   "(default 16: Triton runs interpreted on a CPU)")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser("record", help="fill a trace with the installed vLLM's answers",
                       description="Run an input-only (or older) trace through the installed "
                       "vLLM and write a copy with vLLM's answer to every call (and the "
                       "NONE_HASH it used, when the trace leaves the seed unset).")
    p.add_argument("input", metavar="IN")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="where to write it (.jsonl or .yaml; may be IN itself)")
    p.set_defaults(func=_cmd_record)


def _cmd_replay(args: argparse.Namespace) -> int:
    return _run_traces(args, [args.backend])


def _cmd_diff(args: argparse.Namespace) -> int:
    if not args.no_attention:
        # Decide how Triton runs (interpreted without CUDA) before vLLM imports
        # triton (check_vllm imports vLLM): kernels defined under another mode
        # cannot call each other.
        import impl.kernels.triton_mode  # noqa: F401
    if (code := check_vllm()) is not None:
        return code
    if args.backend == "vllm":
        return fail("diff runs vLLM beside another backend: --backend impl or exec:CMD")
    return _run_traces(args, ["vllm", args.backend])


def _cmd_record(args: argparse.Namespace) -> int:
    from harness.sources.replay import check_trace

    if (code := check_vllm()) is not None:
        return code
    o = check_trace(args.input, ["vllm"], progress=True, writer_path=args.out)
    if o.error is not None:
        return print_error(o.error)
    # A divergence: the input carried answers or expectations vLLM contradicts.
    return print_outcome(o)


def _run_traces(args: argparse.Namespace, backends: list[str]) -> int:
    """replay and diff: every trace checked and shown (a JSON list with
    --json), then the worst code."""
    from harness.sources.replay import check_trace

    paths, codes = trace_paths(args.traces)
    if not paths:
        return worst(codes)
    explicit = set(args.traces)
    attention = backends == ["vllm", "impl"] and not getattr(args, "no_attention", True)
    results = []
    skipped: list[str] = []
    not_covered = 0
    for path in paths:
        o = check_trace(path, backends, progress=not args.json, explicit=path in explicit,
                        check_invariants=args.check_invariants)
        codes.append(o.exit_code)
        if o.skipped:
            skipped.append(o.profile or "?")
        not_covered += o.not_covered is not None
        result = _show_outcome(o, args.json)
        if attention and o.exit_code == 0 and o.skipped is None:
            codes += _show_attention(path, args, result)
        if args.json:
            results.append(result)
    if args.json:
        print(json.dumps(results, indent=1))
    if skipped and len(skipped) == len(paths):
        codes.append(_nothing_checked(skipped))
    foreign = next((b for b in backends if b.startswith("exec:")), None)
    if foreign is not None and not args.json:
        checked = len(paths) - len(skipped)
        print(f"{foreign} covered {checked - not_covered} of {checked} traces")
    if foreign is not None and not_covered and not_covered == len(paths) - len(skipped):
        codes.append(fail(f"no trace was checked: {foreign} covers none of them",
                          ExitCode.ENVIRONMENT))
    return worst(codes)


def _show_outcome(o, as_json: bool) -> dict | None:
    """A trace's verdict printed, or (--json) its errors printed and its JSON
    returned for the list."""
    from harness.report.text import outcome_json

    if not as_json:
        print_outcome(o)
        return None
    if o.error is not None:
        print_error(o.error)
    return outcome_json(o)


def _show_attention(path: str, args: argparse.Namespace, result: dict | None) -> list[int]:
    """The attention differential of a conformant trace, printed or added to
    its JSON; its exit code (none for a trace without a model header)."""
    a = _check_attention(path, args)
    if a is None:
        return []
    if a.error is not None:
        print(a.error, file=sys.stderr)
    if args.json:
        result["attention"] = a.as_dict()
    else:
        print("\n".join(a.summary_lines()))
    return [a.exit_code]


def _nothing_checked(skipped: list[str]) -> ExitCode:
    # Every trace was for another vLLM: that is no pass.
    versions = ", ".join(sorted(set(skipped)))
    return fail(f"no trace was checked: every one was recorded for vLLM {versions}, "
                "not the installed vLLM (kvconform replay runs them on impl; "
                f"kvconform --vllm VERSION diff runs them on that release)",
                ExitCode.ENVIRONMENT)


def _check_attention(path: str, args: argparse.Namespace):
    """The attention-output differential, for traces with a model header."""
    from harness.attention.differential import AttentionOptions, check_attention, wants_attention
    from harness.core.progress import Progress

    if not wants_attention(path):
        return None
    bar = Progress(args.attention_max_batches or 0, f"{path}: attention", unit="batch",
                   enabled=not args.json, delay=1.0)
    try:
        return check_attention(path, AttentionOptions(
            dtype=args.attention_dtype, max_batches=args.attention_max_batches,
            on_batch=bar.update))
    finally:
        bar.close()
