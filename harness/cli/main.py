"""`kvconform`: the command line (specs/ARCHITECTURE.md).

Exit codes for every verb are harness/core/exit_codes.py's: 0 conformant, 1 a
divergence, 2 bad input or usage, 3 the environment is wrong (vLLM missing, or
a version with no profile). Over several traces `worst()` decides; every trace
is still run and reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harness.backends.vllm_backend import ASSUME_PROFILE_ENV
from harness.backends.vllm_check import check_vllm
from harness.cli.support import (
    Parser,
    print_error,
    print_outcome,
    run_verb,
    trace_paths,
    version_line,
)
from harness.core.exit_codes import ExitCode, fail, worst


def _run_traces(args: argparse.Namespace, backends: list[str]) -> int:
    from harness.report.text import outcome_json
    from harness.sources.replay import check_trace

    paths, codes = trace_paths(args.traces)
    if not paths:
        return worst(codes)
    explicit = set(args.traces)
    results = []
    progress = not args.json
    attention = "vllm" in backends and not getattr(args, "no_attention", True)
    skipped: list[str] = []
    for path in paths:
        o = check_trace(path, backends, progress=progress, explicit=path in explicit,
                        check_invariants=args.check_invariants)
        codes.append(o.exit_code)
        if o.skipped:
            skipped.append(o.profile or "?")
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
    if skipped and len(skipped) == len(paths):
        # Nothing was checked: that is no pass.
        versions = ", ".join(sorted(set(skipped)))
        codes.append(fail(f"no trace was checked: every one was recorded for vLLM {versions}, "
                          "not the installed vLLM (kvconform replay runs them on impl; "
                          f"kvconform --vllm VERSION diff runs them on that release)",
                          ExitCode.ENVIRONMENT))
    return worst(codes)


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
    from harness.sources.replay import check_trace

    if (code := check_vllm()) is not None:
        return code
    o = check_trace(args.input, ["vllm"], progress=True, writer_path=args.out)
    if o.error is not None:
        return print_error(o.error)
    # A divergence: the input carried answers or expectations vLLM contradicts.
    return print_outcome(o)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from harness.backends.vllm_backend import installed_vllm_profile
    from harness.fuzz.campaign import fuzz, progress_reporter, too_few_cases_warning
    from harness.fuzz.faults import FAULTS, KIND_FAULTS
    from harness.fuzz.generate import FuzzConfig

    if args.seconds <= 0 or args.max_ops < 1 or (args.max_cases is not None
                                                  and args.max_cases < 1) or (
            args.workers is not None and args.workers < 1):
        return fail("--seconds, --max-ops, --max-cases and --workers must be positive")
    known = [*FAULTS, *KIND_FAULTS]
    if args.inject_fault is not None and args.inject_fault not in known:
        return fail(f"unknown fault '{args.inject_fault}' (known: {', '.join(known)})")
    if len(args.config or ()) > 1 and args.ray is None:
        return fail("several --config need --ray (one campaign draws from one config)")
    configs = {}
    for path in args.config or ():
        try:
            import yaml

            with open(path) as f:
                configs[os.path.splitext(os.path.basename(path))[0]] = FuzzConfig.from_dict(
                    yaml.safe_load(f) or {})
        except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
            return fail(f"{path}: {e}".split("\n")[0])
        except RecursionError:
            return fail(f"{path}: nested too deeply to read")
    if args.ray is not None:
        from harness.fuzz.ray_cluster import require_ray

        require_ray(args.ray or None)
    if (code := check_vllm()) is not None:
        return code
    profile = installed_vllm_profile()
    from harness.fuzz.configs import templates_for

    for name, fuzz_config in configs.items():
        lacking = [k for k in fuzz_config.kinds if k not in templates_for(profile)]
        if lacking:
            return fail(f"{name}: kinds: vLLM {profile.name} has no {', '.join(lacking)} "
                        "groups")
    if args.ray is not None:
        return _fuzz_on_ray(args, profile, configs)
    result = fuzz(profile, args.seconds, args.seed, args.out, args.max_ops,
                  next(iter(configs.values()), FuzzConfig()), args.inject_fault,
                  progress_reporter(), args.max_cases)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"fuzz seed {args.seed}: {result.cases} cases, {result.ops} differential ops "
          f"in {result.seconds:.1f}s ({result.ops_per_s:,.0f} ops/s), "
          f"{len(result.states)} distinct states; start-up (vLLM's import, the first "
          f"backends) {result.startup_seconds:.1f}s, not counted")
    f = result.finding
    if f is None and result.too_few_cases:
        return fail(too_few_cases_warning(result), ExitCode.ENVIRONMENT)
    if f is None:
        print("no divergence")
        return ExitCode.OK
    print(_finding_text(f.failure, f.case, f.num_calls, f.path, f.num_calls_before))
    return f.failure.exit_code


def _finding_text(d, case: int, num_calls: int, path: str, before: int | None = None) -> str:
    from harness.core.compare import FailureKind
    from harness.core.exit_codes import ExitCode
    from harness.report.text import format_failure

    what = "DIVERGENCE" if d.exit_code == ExitCode.DIVERGED else "A CALL vLLM REJECTS"
    shrunk = f"shrunk from {before} to {num_calls}" if before else f"shrunk to {num_calls}"
    flag = "--check-invariants " if d.kind is FailureKind.INVARIANT else ""
    return (f"{what} in case {case}, {shrunk} calls, written to {path}\n"
            f"{format_failure(d)}\n"
            f"replay it: kvconform replay {flag}{path}   (or: kvconform diff {flag}{path})")


def _fuzz_on_ray(args: argparse.Namespace, profile, configs: dict) -> int:
    """`kvconform fuzz --ray`: the campaign over a Ray cluster's workers."""
    from harness.fuzz.campaign import MIN_CASES
    from harness.fuzz.distributed import fuzz_on_ray, kind_configs
    from harness.fuzz.ray_cluster import close_pool, open_pool

    configs = configs or kind_configs(profile)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def found(f, new: bool) -> None:
        if new:
            print(f"finding {f.signature} ({f.config_name} case {f.case}, {f.num_calls} "
                  f"calls): {f.path}", flush=True)

    last = [0.0]

    def progress(r) -> None:
        now = time.perf_counter()
        if now - last[0] >= 5.0:
            last[0] = now
            say(f"fuzz --ray: {r.cases} cases, {r.ops} ops, {r.ops_per_s:,.0f} ops/s, "
                f"{len(r.findings)} distinct findings")

    pool = None
    try:
        pool = open_pool(args.ray or None, args.workers, profile.name, say)
        r = fuzz_on_ray(pool, profile.name, args.seconds, args.seed, args.out, configs,
                        args.max_ops, args.max_cases, args.inject_fault, found, progress)
    finally:
        close_pool(pool)
    dupes = sum(f.duplicates for f in r.findings)
    print(f"fuzz --ray seed {args.seed}: {r.workers} workers, {len(configs)} configs, "
          f"{r.cases} cases, {r.ops} differential ops in {r.seconds:.1f}s "
          f"({r.ops_per_s:,.0f} ops/s), {len(r.states)} distinct states; start-up "
          f"{r.startup_seconds:.1f}s, not counted")
    for name, (cases, ops) in sorted(r.per_config.items()):
        print(f"  {name}: {cases} cases, {ops} ops")
    for lost in r.lost_units:
        print(f"kvconform: a unit did not come back: {lost}", file=sys.stderr)
    if not r.findings:
        if r.too_few_cases:
            fail(f"only {r.cases} cases in {r.seconds:.1f}s, no divergence: too few to mean "
                 f"anything (a campaign needs at least {MIN_CASES}): give it more --seconds",
                 ExitCode.ENVIRONMENT)
        elif not r.lost_units:
            print("no divergence")
        return r.exit_code
    print(f"{len(r.findings)} distinct findings ({dupes} duplicates by shrunk signature), "
          f"written to {args.out}:")
    for f in r.findings:
        print(_finding_text(f.failure, f.case, f.num_calls, f.path))
    return r.exit_code


def _cmd_report(args: argparse.Namespace) -> int:
    from harness.report.pages import page_names, write_index, write_report
    from harness.report.text import verdict_of
    from harness.sources.replay import check_trace

    paths, codes = trace_paths(args.traces)
    if not paths:
        return worst(codes)
    if args.diff and (code := check_vllm()) is not None:
        return code
    backends = ["vllm", "impl"] if args.diff else ["impl"]
    names = page_names(paths)
    entries = []
    for path in paths:
        o = check_trace(path, backends, progress=True, observe_pool=True)
        if o.error is not None:
            print(str(o.error), file=sys.stderr)
        written = write_report(o, args.out, names[path])
        entries.append((o, written))
        print(f"{path}: {verdict_of(o)}: "
              f"{', '.join(written[k] for k in ('html', 'md', 'png') if k in written)}")
        codes.append(o.exit_code)
    print(f"index: {write_index(entries, args.out)}")
    return worst(codes)


def _cmd_stats(args: argparse.Namespace) -> int:
    from harness.report.text import format_traffic, outcome_json
    from harness.sources.replay import check_trace

    paths, codes = trace_paths(args.traces)
    if not paths:
        return worst(codes)
    results = []
    for path in paths:
        o = check_trace(path, ["impl"], progress=not args.json, observe=True)
        codes.append(o.exit_code)
        if o.error is not None:
            print_error(o.error)
        if args.json:
            result = outcome_json(o)
            if o.traffic is not None:
                result["traffic"] = o.traffic.summary()
                result["requests"] = [
                    {"req": r.req, "prompt": r.prompt, "hit_tokens": r.hit_tokens,
                     "peak_blocks": r.peak_blocks, "first_step": r.first_step,
                     "last_step": r.last_step, "preemptions": r.preemptions}
                    for r in o.traffic.requests.values()]
                result["steps"] = [
                    {"step": st.step, "lookups": st.lookups, "queried_tokens": st.queries,
                     "hit_tokens": st.hits, "preemptions": st.preemptions,
                     "evicted_blocks": st.evicted if o.traffic.counts_evictions else None,
                     "usage": round(st.usage, 4)} for st in o.traffic.steps]
            results.append(result)
        elif o.error is None:
            print("\n".join(format_traffic(o, args.requests)))
    if args.json:
        print(json.dumps(results, indent=1))
    return worst(codes)


def _cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate.run import default_paths, run_gate

    if args.fuzz_seconds < 0:
        return fail("--fuzz-seconds must be >= 0")
    if args.ray is not None:
        from harness.gate.on_ray import run_gate_on_ray

        return run_gate_on_ray(args.ray or None, args.workers, args.paths or default_paths(),
                               args.fuzz_seconds, args.fuzz_seed, args.fuzz_out, args.junit,
                               args.summary)
    return run_gate(args.paths or default_paths(), args.fuzz_seconds, args.fuzz_seed,
                    args.fuzz_out, args.junit, args.summary, args.jobs,
                    workloads=not args.no_workloads, attention=not args.no_attention,
                    json_out=args.json)


def _cmd_conform(args: argparse.Namespace) -> int:
    """The gate without fuzz, serially: the same cases, table and exit code."""
    from harness.gate.run import default_paths, run_gate

    return run_gate(default_paths(), 0, 0, "fuzz-findings", None, None, "1")


def _cmd_anonymize(args: argparse.Namespace) -> int:
    from harness.capture.anonymize import AnonymizeError, anonymize, resolve_key
    from harness.sources.replay import check_trace
    from harness.trace import TraceError

    if not args.out.endswith(".jsonl"):
        return fail(f"{args.out}: anonymised traces are written as .jsonl")
    if args.rehash and (code := check_vllm()) is not None:
        return code
    if args.key is not None:
        print("kvconform: --key puts the secret in `ps` and your shell history; set "
              "KVCONFORM_ANON_KEY instead", file=sys.stderr)
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


def _ray_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help=f"{what} (ADDRESS: the head's host:port; none: RAY_ADDRESS, or a "
                   "private cluster on this machine). Needs the ray extra")
    p.add_argument("--workers", type=int, metavar="N",
                   help="with --ray: use N workers (default: one per CPU of the cluster)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvconform",
                    description="Conformance harness for vLLM's v1 KV cache manager.")
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
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)

    p = sub.add_parser("replay", help="run traces through a backend and check their answers",
                       description="Run each trace through one backend (impl by default, "
                       "without vLLM) and check every answer against the answers the trace "
                       "recorded and its hand-derived expectations. One line per trace: "
                       "conformant, truncated (a capture that lacks its end), DIVERGED (the "
                       "report follows), bad input or not checked. Exit 0, 1 (a divergence), "
                       "2 (bad input), 3 (environment); the worst of all traces.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--backend", choices=["impl", "vllm"], default="impl")
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

    p = sub.add_parser("fuzz", help="differential fuzzing, impl vs the installed vLLM",
                       description="Generate random valid scheduler call sequences, run them "
                       "on impl and the installed vLLM in lockstep, and shrink the first "
                       "divergence to a minimal trace written under --out "
                       "(specs/FUZZING.md).")
    p.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="fuzz-findings", metavar="DIR",
                   help="where shrunk failing traces are written (default fuzz-findings)")
    p.add_argument("--max-ops", type=int, default=40, help="actions per case at most")
    p.add_argument("--max-cases", type=int, metavar="N",
                   help="stop after N cases, even if time is left (a budget that does not "
                   "depend on the machine's speed)")
    p.add_argument("--config", metavar="FILE", action="append",
                   help="YAML: what cases are drawn from (block sizes, pool sizes, hash "
                   "algorithms, ...; see specs/FUZZING.md); with --ray, repeat it to spread "
                   "several (default there: every harness/fuzz/kind_configs/ file)")
    _ray_arguments(p, "spread the campaign over a Ray cluster's workers; findings are "
                   "de-duplicated by shrunk signature")
    p.add_argument("--inject-fault", metavar="NAME", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_fuzz)

    p = sub.add_parser("report", help="an HTML and markdown report of trace runs, with a "
                       "picture of the block pool over time (the divergence marked)",
                       description="Run each trace (on impl, or with --diff against the "
                       "installed vLLM) and write a page per trace (HTML and markdown: the "
                       "verdict, the block pool over scheduler steps with the first "
                       "divergence marked, hit-rate and pool-usage panels, a table per "
                       "request) and index.html over all of them. A trace that cannot be "
                       "run gets a page that says why.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--out", default="kvconform-report", metavar="DIR",
                   help="where the pages go (default kvconform-report)")
    p.add_argument("--diff", action="store_true",
                   help="run impl and the installed vLLM side by side (default: impl replay)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("stats", help="the traffic of a trace: hit rate over steps, pool "
                       "usage, preemptions, evictions, a table per request (no vLLM needed)",
                       description="Replay each trace on impl (no vLLM needed) and show its "
                       "traffic: the prefix-cache hit rate overall and over scheduler steps, "
                       "pool usage, preemptions, evicted blocks (traces with KV events), and "
                       "per request its prompt length, hit tokens, peak blocks and the steps "
                       "it lived. A trace that diverges on impl shows what it got to (exit 1).")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or folders")
    p.add_argument("--json", action="store_true", help="everything, per step and per request, "
                   "as JSON on stdout")
    p.add_argument("--requests", type=int, default=20, metavar="N",
                   help="requests listed in the table (default 20; 0: none; --json: all)")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("gate", help="the CI conformance gate: every trace, the seeded "
                       "workloads and a short fuzz; JUnit XML and a markdown summary",
                       description="The CI conformance gate: every trace under PATH (default "
                       "traces/) diffed against the installed vLLM, the seeded workloads in "
                       "lockstep and a fuzz campaign, spread over the cores; one table, "
                       "JUnit XML, a markdown summary and one exit code.")
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
    _ray_arguments(p, "run the cases on a Ray cluster's workers instead; the fuzz campaign "
                   "spreads every kind config")
    p.add_argument("--json", metavar="FILE", help="write every case's result here (JSON)")
    p.add_argument("--no-workloads", action="store_true",
                   help="leave out the seeded lockstep workloads")
    p.add_argument("--no-attention", action="store_true",
                   help="leave out the attention differential of traces with a model header")
    p.set_defaults(func=_cmd_gate)

    p = sub.add_parser("conform", help="the gate without fuzz, serially: the bundled "
                       "traces and seeded workloads, impl vs the installed vLLM, as a table",
                       description="The gate without fuzz, serially: every bundled trace and "
                       "seeded workload, impl against the installed vLLM, as one table and "
                       "one exit code.")
    p.set_defaults(func=_cmd_conform)

    p = sub.add_parser(
        "anonymize", help="keyed, prefix-preserving remap of a trace's token ids",
        description="Rewrite token ids with a keyed bijection that keeps prefix sharing, "
        "block boundaries and hits (and replaces request ids, salts, LoRA and multimodal "
        "names). Token-dependent answers (block hashes, KV events) are dropped, or "
        "recorded anew from the installed vLLM with --rehash. The key comes from the "
        "environment: KVCONFORM_ANON_KEY=... kvconform anonymize IN --out OUT.jsonl")
    p.add_argument("input", metavar="IN")
    p.add_argument("--out", required=True, metavar="OUT", help="the anonymised trace (.jsonl)")
    # Discouraged (the secret shows in `ps` and shell history): KVCONFORM_ANON_KEY.
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, help="token ids stay below this (default: one past "
                   "the trace's largest)")
    p.add_argument("--rehash", action="store_true",
                   help="record hashes and KV events anew with the installed vLLM")
    p.set_defaults(func=_cmd_anonymize)

    from harness.cli.peer import add_peer_parser

    add_peer_parser(sub)

    # capture (scheduler, tiny engine, server plugin, KV events).
    from harness.cli.capture import register as register_capture

    register_capture(sub)
    from harness.releases.bisect import register as register_bisect

    register_bisect(sub)
    from harness.cli.matrix import register as register_matrix

    register_matrix(sub)
    # Every verb's --help says what it does, not only the one-line list.
    for action in sub._choices_actions:
        verb = sub.choices[action.dest]
        if not verb.description and action.help:
            verb.description = action.help[0].upper() + action.help[1:] + "."
    return parser


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
