"""`kvconform`: the command line (specs/ARCHITECTURE.md).

Exit codes for every verb are harness/exit_codes.py's: 0 conformant, 1 a
divergence, 2 bad input or usage, 3 the environment is wrong (vLLM missing, or
a version with no profile). Over several traces `worst()` decides; every trace
is still run and reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from harness.cli_support import (
    Parser,
    check_vllm,
    fail,
    print_error,
    print_outcome,
    run_verb,
)
from harness.exit_codes import ExitCode, worst


def _run_traces(args: argparse.Namespace, backends: list[str]) -> int:
    from harness.replay import check_trace
    from harness.report import outcome_json
    from harness.trace import find_traces

    paths = find_traces(args.traces)
    if not paths:
        return fail(f"no traces under {' '.join(args.traces)}")
    explicit = set(args.traces)
    results, codes = [], []
    progress = not args.json
    attention = "vllm" in backends and not getattr(args, "no_attention", True)
    for path in paths:
        o = check_trace(path, backends, progress=progress, explicit=path in explicit,
                        check_invariants=args.check_invariants)
        codes.append(o.exit_code)
        result = None
        if args.json:
            if o.error is not None:
                print_error(o.error)
            result = outcome_json(o)
        else:
            print_outcome(o)
        if attention and o.exit_code == 0 and o.skipped is None:
            a = _check_attention(path, args)
            if a is not None:
                codes.append(a.exit_code)
                if a.error is not None:
                    print(a.error, file=sys.stderr)
                if args.json:
                    result["attention"] = a.as_dict()
                else:
                    print("\n".join(a.summary_lines()))
        if args.json:
            results.append(result)
    if args.json:
        print(json.dumps(results, indent=1))
    return worst(codes)


def _check_attention(path: str, args: argparse.Namespace):
    """The attention-output differential, for traces with a model header."""
    from harness.attention.differential import AttentionOptions, check_attention, wants_attention

    if not wants_attention(path):
        return None
    return check_attention(path, AttentionOptions(dtype=args.attention_dtype,
                                                  max_batches=args.attention_max_batches))


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
    return _run_traces(args, ["vllm", "impl"])


def _cmd_record(args: argparse.Namespace) -> int:
    from harness.replay import check_trace

    if (code := check_vllm()) is not None:
        return code
    o = check_trace(args.input, ["vllm"], progress=True, writer_path=args.out)
    if o.error is not None:
        return print_error(o.error)
    # A divergence: the input carried answers or expectations vLLM contradicts.
    return print_outcome(o)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from harness.backends.vllm_backend import installed_vllm_profile
    from harness.diff import FailureKind
    from harness.fuzz.campaign import fuzz, progress_reporter
    from harness.fuzz.faults import FAULTS, KIND_FAULTS
    from harness.fuzz.generate import FuzzConfig
    from harness.report import format_failure

    if args.seconds <= 0 or args.max_ops < 1 or (args.max_cases is not None
                                                  and args.max_cases < 1):
        return fail("--seconds, --max-ops and --max-cases must be positive")
    known = [*FAULTS, *KIND_FAULTS]
    if args.inject_fault is not None and args.inject_fault not in known:
        return fail(f"unknown fault '{args.inject_fault}' (known: {', '.join(known)})")
    fuzz_config = FuzzConfig()
    if args.config is not None:
        try:
            import yaml

            with open(args.config) as f:
                fuzz_config = FuzzConfig.from_dict(yaml.safe_load(f) or {})
        except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
            return fail(f"{args.config}: {e}")
    if (code := check_vllm()) is not None:
        return code
    profile = installed_vllm_profile()
    from harness.fuzz.configs import templates_for

    lacking = [k for k in fuzz_config.kinds if k not in templates_for(profile)]
    if lacking:
        return fail(f"{args.config}: kinds: vLLM {profile.name} has no {', '.join(lacking)} "
                    "groups")
    result = fuzz(profile, args.seconds, args.seed, args.out, args.max_ops, fuzz_config,
                  args.inject_fault, progress_reporter(), args.max_cases)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"fuzz seed {args.seed}: {result.cases} cases, {result.ops} differential ops "
          f"in {result.seconds:.1f}s ({result.ops_per_s:,.0f} ops/s), "
          f"{len(result.states)} distinct states")
    f = result.finding
    if f is None:
        print("no divergence")
        return ExitCode.OK
    d = f.failure
    what = "DIVERGENCE" if d.exit_code == ExitCode.DIVERGED else "A CALL vLLM REJECTS"
    print(f"{what} in case {f.case}, shrunk from {f.num_calls_before} to {f.num_calls} "
          f"calls, written to {f.path}")
    print(format_failure(d))
    flag = "--check-invariants " if d.kind is FailureKind.INVARIANT else ""
    print(f"replay it: kvconform replay {flag}{f.path}   (or: kvconform diff {flag}{f.path})")
    return d.exit_code


def _cmd_report(args: argparse.Namespace) -> int:
    from harness.replay import check_trace
    from harness.report_page import write_report
    from harness.trace import find_traces

    paths = find_traces(args.traces)
    if not paths:
        return fail(f"no traces under {' '.join(args.traces)}")
    if args.diff and (code := check_vllm()) is not None:
        return code
    backends = ["vllm", "impl"] if args.diff else ["impl"]
    codes = []
    for path in paths:
        o = check_trace(path, backends, observe_pool=True)
        if o.error is not None:
            print(str(o.error), file=sys.stderr)
        written = write_report(o, args.out)
        print(f"{path}: {', '.join(written[k] for k in ('html', 'md', 'png') if k in written)}")
        codes.append(o.exit_code)
    return worst(codes)


def _cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import default_paths, run_gate

    if args.fuzz_seconds < 0:
        return fail("--fuzz-seconds must be >= 0")
    return run_gate(args.paths or default_paths(), args.fuzz_seconds, args.fuzz_seed,
                    args.fuzz_out, args.junit, args.summary, args.jobs)


def _cmd_conform(args: argparse.Namespace) -> int:
    """The gate without fuzz, serially: the same cases, table and exit code."""
    from harness.gate import default_paths, run_gate

    return run_gate(default_paths(), 0, 0, "fuzz-findings", None, None, "1")


def _cmd_anonymize(args: argparse.Namespace) -> int:
    from harness.anonymize import AnonymizeError, anonymize, resolve_key
    from harness.replay import check_trace
    from harness.trace import TraceError

    if not args.out.endswith(".jsonl"):
        return fail(f"{args.out}: anonymised traces are written as .jsonl")
    if args.rehash and (code := check_vllm()) is not None:
        return code
    try:
        key = resolve_key(args.key)
        target = args.out if not args.rehash else f"{args.out}.unhashed.jsonl"
        n = anonymize(args.input, target, key, args.vocab)
    except AnonymizeError as e:
        return fail(str(e))
    except TraceError as e:
        return print_error(e)
    if args.rehash:
        o = check_trace(target, ["vllm"], writer_path=args.out, explicit=True)
        os.remove(target)
        if o.error is not None or o.divergence is not None:
            return print_outcome(o)
    print(f"{args.out}: {n} events anonymised"
          + (" (hashes and KV events recorded anew by the installed vLLM)" if args.rehash
             else " (token-dependent answers dropped: see specs/CAPTURE.md)"))
    return ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvconform",
                    description="Conformance harness for vLLM's v1 KV cache manager.")
    parser.add_argument("--vllm", metavar="VERSION",
                        default=os.environ.get("KVCONFORM_VLLM") or None,
                        help="run the verb against that vLLM release's overlay (built if "
                        "missing; also KVCONFORM_VLLM=VERSION), e.g. 0.25.1 or 0.25")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)

    p = sub.add_parser("replay", help="run traces through a backend and check their answers")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--backend", choices=["impl", "vllm"], default="impl")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--check-invariants", action="store_true",
                   help="run impl's invariant checker after every event (slower)")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("diff", help="run traces through impl and the installed vLLM "
                       "side by side, comparing every answer (and the recorded ones)")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--check-invariants", action="store_true",
                   help="run impl's invariant checker after every event (slower)")
    p.add_argument("--no-attention", action="store_true",
                   help="skip the attention-output differential of traces with a model "
                   "header (specs/ATTENTION.md)")
    p.add_argument("--attention-dtype", choices=["float32", "float16", "bfloat16"],
                   help="dtype of the attention differential (default: the trace's model)")
    p.add_argument("--attention-max-batches", type=int, default=16, metavar="N",
                   help="check at most N batches (steps) of attention per trace "
                   "(default 16: Triton runs interpreted on a CPU)")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser("record", help="fill a trace with the installed vLLM's answers")
    p.add_argument("input", metavar="IN")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="where to write it (.jsonl or .yaml; may be IN itself)")
    p.set_defaults(func=_cmd_record)

    p = sub.add_parser("fuzz", help="differential fuzzing, impl vs the installed vLLM")
    p.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="fuzz-findings", metavar="DIR",
                   help="where shrunk failing traces are written (default fuzz-findings)")
    p.add_argument("--max-ops", type=int, default=40, help="actions per case at most")
    p.add_argument("--max-cases", type=int, metavar="N",
                   help="stop after N cases, even if time is left (a budget that does not "
                   "depend on the machine's speed)")
    p.add_argument("--config", metavar="FILE", help="YAML: what cases are drawn from "
                   "(block sizes, pool sizes, hash algorithms, ...; see specs/FUZZING.md)")
    p.add_argument("--inject-fault", metavar="NAME", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_fuzz)

    p = sub.add_parser("report", help="an HTML and markdown report of trace runs, with a "
                       "picture of the block pool over time (the divergence marked)")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--out", default="kvconform-report", metavar="DIR",
                   help="where the pages go (default kvconform-report)")
    p.add_argument("--diff", action="store_true",
                   help="run impl and the installed vLLM side by side (default: impl replay)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("gate", help="the CI conformance gate: every trace, the seeded "
                       "workloads and a short fuzz; JUnit XML and a markdown summary")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="trace files or folders (default: the bundled traces/)")
    p.add_argument("--fuzz-seconds", type=float, default=60.0,
                   help="fuzz campaign length (default 60; 0 skips it)")
    p.add_argument("--fuzz-seed", type=int, default=0)
    p.add_argument("--fuzz-out", default="fuzz-findings", metavar="DIR")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--summary", metavar="FILE", help="write a markdown summary here")
    p.add_argument("--jobs", default="auto",
                   help="parallel workers (pytest-xdist; default auto = all cores; 1 = serial)")
    p.set_defaults(func=_cmd_gate)

    p = sub.add_parser("conform", help="the gate without fuzz, serially: the bundled "
                       "traces and seeded workloads, impl vs the installed vLLM, as a table")
    p.set_defaults(func=_cmd_conform)

    p = sub.add_parser(
        "anonymize", help="keyed, prefix-preserving remap of a trace's token ids",
        description="Rewrite token ids with a keyed bijection that keeps prefix sharing, "
        "block boundaries and hits (and replaces request ids, salts, LoRA and multimodal "
        "names). Token-dependent answers (block hashes, KV events) are dropped, or "
        "recorded anew from the installed vLLM with --rehash.")
    p.add_argument("input", metavar="IN")
    p.add_argument("--out", required=True, metavar="OUT", help="the anonymised trace (.jsonl)")
    p.add_argument("--key", help="the secret (default: the KVCONFORM_ANON_KEY variable)")
    p.add_argument("--vocab", type=int, help="token ids stay below this (default: one past "
                   "the trace's largest)")
    p.add_argument("--rehash", action="store_true",
                   help="record hashes and KV events anew with the installed vLLM")
    p.set_defaults(func=_cmd_anonymize)

    from harness.peer.cli import add_peer_parser

    add_peer_parser(sub)

    # capture (scheduler, tiny engine, server plugin, KV events).
    from harness.capture.cli import register as register_capture

    register_capture(sub)
    from harness.bisect import register as register_bisect

    register_bisect(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.vllm:
        from harness.vllm_overlay import activate_for_cli

        code = activate_for_cli(args.vllm)
        if code:
            return code
    return run_verb(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
