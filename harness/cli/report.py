"""The verbs that show what a run did: `report` (HTML and markdown pages with
the block pool's picture, harness/report/pages.py) and `stats` (a trace's
traffic on impl, harness/core/traffic.py)."""

from __future__ import annotations

import argparse
import json
import sys

from harness.backends.vllm_check import check_vllm
from harness.cli.support import print_error, trace_paths
from harness.core.exit_codes import worst


def register(sub) -> None:
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
    from harness.report.text import format_traffic
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
            results.append(_traffic_json(o))
        elif o.error is None:
            print("\n".join(format_traffic(o, args.requests)))
    if args.json:
        print(json.dumps(results, indent=1))
    return worst(codes)


def _traffic_json(o) -> dict:
    """`stats --json` of one trace: its outcome, and its traffic overall, per
    request and per step."""
    from harness.report.text import outcome_json

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
    return result
