"""The verbs of the CI conformance gate (harness/gate/): `gate` (every trace,
the seeded workloads and a short fuzz, spread over the cores or a Ray
cluster) and `conform` (the same without fuzz, serially)."""

from __future__ import annotations

import argparse

from harness.cli.support import backend_name, ray_arguments
from harness.core.exit_codes import fail


def register(sub) -> None:
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
    ray_arguments(p, "run the cases on a Ray cluster's workers instead; the fuzz campaign "
                  "spreads every kind config")
    p.add_argument("--json", metavar="FILE", help="write every case's result here (JSON)")
    p.add_argument("--no-workloads", action="store_true",
                   help="leave out the seeded lockstep workloads")
    p.add_argument("--no-attention", action="store_true",
                   help="leave out the attention differential of traces with a model header")
    p.add_argument("--backend", type=backend_name, default="impl", metavar="BACKEND",
                   help="what runs beside vLLM: impl (default) or exec:CMD, a backend in "
                   "another process and any language (specs/FOREIGN_BACKEND.md): every "
                   "trace, workload and fuzz slice its capabilities cover, no attention, sizing or "
                   "worker cases")
    p.add_argument("--page", metavar="DIR", help="write a result page a project can publish "
                   "(index.md, index.html: what was checked, against which release, what "
                   "failed) here")
    cov = p.add_mutually_exclusive_group()
    cov.add_argument("--core-coverage", metavar="DIR",
                     help="keep the fuzz slices' coverage data of vLLM's KV core in DIR, "
                     "with an HTML report of every branch in DIR/html")
    cov.add_argument("--no-core-coverage", action="store_true",
                     help="do not measure the branches of vLLM's KV core the fuzz slices "
                     "reach (the summary's coverage line; measuring costs the fuzz about "
                     "0.4x its time)")
    p.set_defaults(func=_cmd_gate)

    p = sub.add_parser("conform", help="the gate without fuzz, serially: the bundled "
                       "traces and seeded workloads, impl vs the installed vLLM, as a table",
                       description="The gate without fuzz, serially: every bundled trace and "
                       "seeded workload, impl against the installed vLLM, as one table and "
                       "one exit code.")
    p.set_defaults(func=_cmd_conform)


def _cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate.run import default_paths, run_gate

    if args.fuzz_seconds < 0:
        return fail("--fuzz-seconds must be >= 0")
    if args.backend == "vllm":
        return fail("the gate runs vLLM beside another backend: --backend impl or exec:CMD")
    if args.ray is not None and args.backend != "impl":
        return fail("--ray runs impl only; a foreign backend runs without --ray")
    if args.ray is not None:
        from harness.gate.on_ray import run_gate_on_ray

        return run_gate_on_ray(args.ray or None, args.workers, args.paths or default_paths(),
                               args.fuzz_seconds, args.fuzz_seed, args.fuzz_out, args.junit,
                               args.summary)
    return run_gate(args.paths or default_paths(), args.fuzz_seconds, args.fuzz_seed,
                    args.fuzz_out, args.junit, args.summary, args.jobs,
                    workloads=not args.no_workloads, attention=not args.no_attention,
                    json_out=args.json, backend=args.backend, page=args.page,
                    core_coverage=args.core_coverage or not args.no_core_coverage)


def _cmd_conform(args: argparse.Namespace) -> int:
    """The gate without fuzz, serially: the same cases, table and exit code."""
    from harness.gate.run import default_paths, run_gate

    return run_gate(default_paths(), 0, 0, "fuzz-findings", None, None, "1")
