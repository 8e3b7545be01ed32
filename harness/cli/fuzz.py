"""The `fuzz` verb: a differential campaign, impl (or a foreign backend,
exec:CMD) vs the installed vLLM, on this machine or (--ray, impl only) over a
Ray cluster's workers (harness/fuzz/)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness.backends.vllm_check import check_vllm
from harness.cli.support import backend_name, ray_arguments
from harness.core.exit_codes import CommandError, ExitCode, fail


def register(sub) -> None:
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
    p.add_argument("--backend", type=backend_name, default="impl", metavar="BACKEND",
                   help="what runs beside vLLM: impl (default) or exec:CMD, a backend in "
                   "another process and any language (specs/FOREIGN_BACKEND.md): cases "
                   "outside its capabilities are counted as not covered")
    ray_arguments(p, "spread the campaign over a Ray cluster's workers; findings are "
                  "de-duplicated by shrunk signature")
    p.add_argument("--inject-fault", metavar="NAME", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_fuzz)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from harness.backends.vllm_backend import installed_vllm_profile

    _refuse_bad_arguments(args)
    configs = _read_configs(args.config or ())
    if args.ray is not None:
        from harness.fuzz.ray_cluster import require_ray

        require_ray(args.ray or None)
    if (code := check_vllm()) is not None:
        return code
    profile = installed_vllm_profile()
    _refuse_kinds_lacking(profile, configs)
    if args.ray is not None:
        from harness.fuzz.offload_driver import OffloadFuzzConfig
        from harness.fuzz.sizing import SizingFuzzConfig

        if any(isinstance(c, SizingFuzzConfig | OffloadFuzzConfig) for c in configs.values()):
            raise CommandError("a sizing (model shapes) or offload config runs on this "
                               "machine, not with --ray")
        return _fuzz_on_ray(args, profile, configs)
    return _fuzz_here(args, profile, configs)


def _refuse_bad_arguments(args: argparse.Namespace) -> None:
    from harness.fuzz.faults import FAULTS, KIND_FAULTS

    if args.seconds <= 0 or args.max_ops < 1 or (args.max_cases is not None
                                                  and args.max_cases < 1) or (
            args.workers is not None and args.workers < 1):
        raise CommandError("--seconds, --max-ops, --max-cases and --workers must be positive")
    known = [*FAULTS, *KIND_FAULTS]
    if args.inject_fault is not None and args.inject_fault not in known:
        raise CommandError(f"unknown fault '{args.inject_fault}' (known: {', '.join(known)})")
    if len(args.config or ()) > 1 and args.ray is None:
        raise CommandError("several --config need --ray (one campaign draws from one config)")
    if args.backend == "vllm":
        raise CommandError("fuzz runs vLLM beside another backend: --backend impl or exec:CMD")
    if args.backend != "impl" and (args.ray is not None or args.inject_fault is not None):
        raise CommandError("--ray and --inject-fault run impl; a foreign backend runs "
                           "without them")


def _read_configs(paths) -> dict:
    """Each --config file's FuzzConfig (or SizingFuzzConfig), by the file's
    name without suffix."""
    from harness.fuzz.slices import fuzz_config_of

    configs = {}
    for path in paths:
        try:
            import yaml

            with open(path) as f:
                configs[os.path.splitext(os.path.basename(path))[0]] = fuzz_config_of(
                    yaml.safe_load(f) or {})
        except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
            raise CommandError(f"{path}: {e}".split("\n")[0]) from None
        except RecursionError:
            raise CommandError(f"{path}: nested too deeply to read") from None
    return configs


def _refuse_kinds_lacking(profile, configs: dict) -> None:
    """A config that draws a kind the installed release cannot build."""
    from harness.fuzz.configs import templates_for

    for name, fuzz_config in configs.items():
        lacking = [k for k in fuzz_config.kinds if k not in templates_for(profile)]
        if lacking:
            raise CommandError(f"{name}: kinds: vLLM {profile.name} has no "
                               f"{', '.join(lacking)} groups")


def _fuzz_sizing(args: argparse.Namespace, fuzz_config) -> int:
    """A campaign of random model shapes sized on both sides."""
    from harness.fuzz.sizing import fuzz_sizing

    r = fuzz_sizing(args.seconds, args.seed, fuzz_config, args.out,
                    max_cases=args.max_cases)
    print(f"fuzz sizing seed {args.seed}: {r.cases} model shapes ({r.refused} refused "
          f"alike by both, {r.vllm_crashed} vLLM crashed on), {r.fields:,} fields compared "
          f"in {r.seconds:.1f}s")
    if r.crash_example:
        print(f"first vLLM crash: {r.crash_example}")
    if r.finding is None:
        print("no divergence")
        return ExitCode.OK
    print(r.finding.report())
    if r.path:
        print(f"written to {r.path}; rerun it: pytest {r.path}")
    return r.finding.exit_code


def _fuzz_offload(args: argparse.Namespace, profile, fuzz_config) -> int:
    """A campaign of seeded programs on the CPU offload tier, both sides."""
    from harness.fuzz.offload_driver import fuzz

    if not profile.offload_cpu_tier:
        print(f"kvconform: fuzz: vLLM {profile.name}'s CPU offload tier is not modelled "
              "(profile offload_cpu_tier; specs/KV_OFFLOAD.md, Releases)", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    r = fuzz(args.seed, args.seconds, programs=args.max_cases, profile=profile,
             fuzz_config=fuzz_config)
    print(f"fuzz offload seed {args.seed}: {r.programs} programs, {r.ops:,} ops in "
          f"{r.seconds:.1f}s ({r.ops / max(r.seconds, 1e-9):,.0f} ops/s)")
    print("ops: " + ", ".join(f"{k} {v}" for k, v in sorted(r.by_op.items())))
    if not r.divergences:
        print("no divergence")
        return ExitCode.OK
    print(r.divergences[0].line())
    print(f"rerun it: python -m harness.fuzz.offload_driver --seed {args.seed} "
          f"--programs {r.programs}")
    return ExitCode.DIVERGED


def _fuzz_here(args: argparse.Namespace, profile, configs: dict) -> int:
    """The campaign in this process, until its first finding."""
    from harness.fuzz.campaign import fuzz, progress_reporter, too_few_cases_warning
    from harness.fuzz.generate import FuzzConfig
    from harness.fuzz.offload_driver import OffloadFuzzConfig
    from harness.fuzz.sizing import SizingFuzzConfig

    first = next(iter(configs.values()), None)
    if args.backend != "impl" and isinstance(first, SizingFuzzConfig | OffloadFuzzConfig):
        raise CommandError("a sizing (model shapes) or offload config runs impl; a foreign "
                           "backend answers the KV cache manager's events only")
    if isinstance(first, SizingFuzzConfig):
        return _fuzz_sizing(args, next(iter(configs.values())))
    if isinstance(first, OffloadFuzzConfig):
        return _fuzz_offload(args, profile, next(iter(configs.values())))

    from harness.backends.base import BackendStopped

    try:
        result = fuzz(profile, args.seconds, args.seed, args.out, args.max_ops,
                      next(iter(configs.values()), FuzzConfig()), args.inject_fault,
                      progress_reporter(), args.max_cases, backend=args.backend)
    except BackendStopped as e:  # the foreign process died, hung or broke the protocol
        return fail(str(e), e.exit_code)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"fuzz seed {args.seed}: {result.cases} cases, {result.ops} differential ops "
          f"in {result.seconds:.1f}s ({result.ops_per_s:,.0f} ops/s), "
          f"{len(result.states)} distinct states; start-up (vLLM's import, the first "
          f"backends) {result.startup_seconds:.1f}s, not counted")
    if args.backend != "impl":
        print(f"{args.backend}: {result.checked} cases covered"
              + (f", {result.not_covered_text()}" if result.not_covered else "")
              + f"; {result.processes_started} processes started")
    f = result.finding
    if f is None and result.covered_none:
        return fail(f"not covered by {args.backend}: none of {result.cases} cases "
                    "(the config draws nothing its capabilities cover)", ExitCode.ENVIRONMENT)
    if f is None and result.too_few_cases:
        return fail(too_few_cases_warning(result), ExitCode.ENVIRONMENT)
    if f is None:
        print("no divergence")
        return ExitCode.OK
    print(_finding_text(f.failure, f.case, f.num_calls, f.path, f.num_calls_before,
                        f.replay_command if f.backend != "impl" else None))
    return f.failure.exit_code


def _finding_text(d, case: int, num_calls: int, path: str, before: int | None = None,
                  replay=None) -> str:
    """`replay(flags)`: the command that shows it again (a foreign backend's
    finding names its backend)."""
    from harness.core.compare import FailureKind
    from harness.report.text import format_failure

    what = "DIVERGENCE" if d.exit_code == ExitCode.DIVERGED else "A CALL vLLM REJECTS"
    shrunk = f"shrunk from {before} to {num_calls}" if before else f"shrunk to {num_calls}"
    flag = "--check-invariants " if d.kind is FailureKind.INVARIANT else ""
    again = (f"replay it: {replay(flag)}" if replay is not None else
             f"replay it: kvconform replay {flag}{path}   (or: kvconform diff {flag}{path})")
    return (f"{what} in case {case}, {shrunk} calls, written to {path}\n"
            f"{format_failure(d)}\n{again}")


def _fuzz_on_ray(args: argparse.Namespace, profile, configs: dict) -> int:
    """`kvconform fuzz --ray`: the campaign over a Ray cluster's workers."""
    from harness.fuzz.distributed import fuzz_on_ray, kind_configs
    from harness.fuzz.ray_cluster import close_pool, open_pool

    configs = configs or kind_configs(profile)
    found, progress = _ray_reporters()
    pool = None
    try:
        pool = open_pool(args.ray or None, args.workers, profile.name, _say)
        r = fuzz_on_ray(pool, profile.name, args.seconds, args.seed, args.out, configs,
                        args.max_ops, args.max_cases, args.inject_fault, found, progress)
    finally:
        close_pool(pool)
    return _ray_summary(args, r, len(configs))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ray_reporters():
    """What a Ray campaign calls as it runs: on each finding (a line for a new
    one) and on progress (a line every 5 s at most)."""
    def found(f, new: bool) -> None:
        if new:
            print(f"finding {f.signature} ({f.config_name} case {f.case}, {f.num_calls} "
                  f"calls): {f.path}", flush=True)

    last = [0.0]

    def progress(r) -> None:
        now = time.perf_counter()
        if now - last[0] >= 5.0:
            last[0] = now
            _say(f"fuzz --ray: {r.cases} cases, {r.ops} ops, {r.ops_per_s:,.0f} ops/s, "
                 f"{len(r.findings)} distinct findings")

    return found, progress


def _ray_summary(args: argparse.Namespace, r, num_configs: int) -> int:
    """A Ray campaign's totals, per config, its lost units and its findings."""
    from harness.fuzz.campaign import MIN_CASES

    dupes = sum(f.duplicates for f in r.findings)
    print(f"fuzz --ray seed {args.seed}: {r.workers} workers, {num_configs} configs, "
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
