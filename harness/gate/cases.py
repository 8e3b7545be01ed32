"""The cases of a conformance run, and the one result type they give (`Case`).

`kvconform gate` (and `kvconform conform`, the gate without fuzz, serially)
runs these as pytest items (harness/gate/pytest_plugin.py); harness/gate/run.py turns
the Cases into its table, JUnit and summary.

- trace: each trace under traces/ recorded for the installed vLLM's version is
  diffed: impl and vLLM run side by side, their answers must be equal, equal
  to the recorded answers, and satisfy the hand-derived expectations. Traces of
  other versions are replayed on impl with their own profile.
- workload: each seeded workload runs impl and vLLM in lockstep: every answer,
  the free queue after every free and preemption, and the KV events must be
  identical.
- sizing: a model shape's KV cache sized by impl and by vLLM, compared field
  by field (harness/backends/sizing.py): every shape of traces/sizing/, every
  trace with a `model` header and every seeded workload's config.
- fuzz: a differential fuzz campaign (harness/fuzz/campaign.py), or a campaign
  of random model shapes sized on both sides (harness/fuzz/sizing.py).
- worker: each trace and workload drives vLLM's and impl's worker block
  tables as the model runner does; tables, slot mappings and kernel block
  tables must be identical at every step (harness/sources/worker.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.exit_codes import ExitCode, worst
from harness.fuzz.generate import FuzzConfig
from harness.sources.workload import WorkloadSpec
from impl.profiles import VersionProfile

ROOT = Path(__file__).resolve().parents[2]
TRACES_DIR = ROOT / "traces"

VERDICTS = {ExitCode.OK: "conformant", ExitCode.DIVERGED: "DIVERGED",
            ExitCode.BAD_INPUT: "BAD INPUT", ExitCode.ENVIRONMENT: "ENVIRONMENT",
            ExitCode.INTERRUPTED: "INTERRUPTED"}
# A fuzz campaign whose time ran out before it checked enough to mean anything
# (harness/fuzz/campaign.py MIN_CASES): the machine's problem, exit 3.
TOO_FEW_CASES = "TOO FEW CASES"
NOT_RUN_HERE = "SKIPPED (this machine)"


def gate_exit_code(cases) -> ExitCode:
    """The worst exit code of the cases this machine could run; the
    environment's when it could run none."""
    counted = [c.exit_code for c in cases if not c.not_run_here]
    return worst(counted) if counted else ExitCode.ENVIRONMENT


# A case outside a foreign backend's capabilities (specs/FOREIGN_BACKEND.md).
NOT_COVERED = "not covered by "

# A finding in vLLM itself (FailureKind.UPSTREAM): exit 1 like a divergence,
# named apart in the table, the summary and JUnit.
UPSTREAM = "UPSTREAM"


def _label(failure) -> str:
    from harness.core.compare import FailureKind

    return UPSTREAM if failure is not None and failure.kind is FailureKind.UPSTREAM else ""


@dataclass(slots=True)
class Case:
    name: str
    kind: str  # trace | workload | sizing | fuzz | worker
    mode: str  # diff, replay <profile>, lockstep, or the fuzz campaign's figures
    events: int
    seconds: float
    exit_code: ExitCode
    report: str = ""  # what failed, "" when conformant
    message: str = ""  # the report's one line (JUnit's message); "" when conformant
    # A trace that lacks its end (header `truncated`): a pass says so.
    truncated: bool = False
    # A verdict more telling than the exit code's (TOO_FEW_CASES, "not
    # covered by exec:CMD").
    label: str = ""
    # What this machine lacks to run the case (an instruction set): the case
    # is reported (ENVIRONMENT, a JUnit <skipped>) but does not decide the
    # run's exit code, so that which processor CI lands on decides nothing.
    not_run_here: str = ""

    @property
    def not_covered(self) -> bool:
        return self.label.startswith(NOT_COVERED)

    @property
    def verdict(self) -> str:
        if self.not_run_here:
            return NOT_RUN_HERE
        if self.label:
            return self.label
        if self.truncated and self.exit_code == ExitCode.OK:
            return "truncated"
        return VERDICTS[self.exit_code]

    def __post_init__(self) -> None:
        if self.report and not self.message:
            self.message = self.report.strip().splitlines()[0]


def raised_in_vllm(e: BaseException) -> bool:
    """Whether an exception comes from vLLM's code or the modules driving it
    (harness/backends/vllm_*): a missing op, a release's API or a failure
    inside the release, not the case's input."""
    vllm_dir = f"{os.sep}vllm{os.sep}"
    adapters = f"{os.sep}harness{os.sep}backends{os.sep}vllm_"
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if vllm_dir in name or adapters in name:
            return True
        tb = tb.tb_next
    return isinstance(e, ImportError)


def crashed_case(name: str, kind: str, e: Exception, mode: str = "-") -> Case:
    """A case whose run raised: one line, exit 3 when it came from vLLM."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = "" if tb is None else (f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:"
                                   f"{tb.tb_lineno})")
    first = str(e).splitlines()[0] if str(e) else ""
    if raised_in_vllm(e):
        code, what = ExitCode.ENVIRONMENT, "vLLM cannot run this case"
    else:
        code, what = ExitCode.BAD_INPUT, "the case could not run"
    line = f"{name}: {what}: {type(e).__name__}: {first}{where}"
    return Case(name, kind, mode, 0, 0.0, code, line, line)


def case_name(path: str) -> str:
    """A trace's name in tables: relative to the project when inside it."""
    full = Path(path).resolve()
    try:
        return str(full.relative_to(ROOT))
    except ValueError:
        return str(full)


# -- the seeded workloads --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadCase:
    name: str
    spec: WorkloadSpec
    config: CacheConfig


def _workload(name: str, seed: int, num_blocks: int, groups: tuple[GroupConfig, ...],
              block_size: int = 16, **cfg) -> WorkloadCase:
    """A workload over `groups`. The workload keeps a request within num_blocks
    blocks of `block_size` tokens; hybrid pools are sized so that a request
    fits in every group at once."""
    return WorkloadCase(name, WorkloadSpec(seed=seed, block_size=block_size),
                        CacheConfig(num_blocks=num_blocks, groups=groups, **cfg))


_FULL = GroupConfig(16)
_WINDOW = GroupConfig(16, "sliding_window", sliding_window=40)

WORKLOADS: list[WorkloadCase] = [
    _workload("workload-tight-pool", 1, 24, (_FULL,)),
    _workload("workload-medium-pool", 2, 64, (_FULL,)),
    _workload("workload-sha256_cbor", 3, 40, (GroupConfig(32),), block_size=32,
              hash_algo="sha256_cbor"),
    _workload("workload-xxhash", 4, 48, (_FULL,), hash_algo="xxhash"),
    _workload("workload-no-caching", 5, 32, (_FULL,), enable_caching=False),
    _workload("workload-sliding-window", 6, 40, (_WINDOW,)),
    _workload("workload-gemma-hybrid", 7, 100, (_FULL, _WINDOW, _WINDOW)),
    _workload("workload-hybrid-block-sizes", 8, 120,
              (_FULL, GroupConfig(32, "sliding_window", sliding_window=24))),
    _workload("workload-llama4-hybrid", 9, 100,
              (_FULL, GroupConfig(16, "chunked_local_attention", attention_chunk_size=64))),
    _workload("workload-mla-dcp", 10, 32, (GroupConfig(16, "mla_attention"),),
              dcp_world_size=2),
    _workload("workload-hybrid-no-caching", 11, 100, (_FULL, _WINDOW), enable_caching=False),
    # Jamba-like: attention next to two Mamba "align" groups. Few, short,
    # often identical prompts, so that requests hit a state another request
    # keyed in the same step (0.33 changed when such a hit must wait a step).
    WorkloadCase("workload-mamba-hybrid",
                 WorkloadSpec(seed=12, block_size=4, vocab=2, num_system_prompts=2,
                              system_prompt_blocks=(1, 3), user_tokens=(1, 3),
                              max_tokens=(1, 24), num_requests=200),
                 CacheConfig(num_blocks=60, groups=(GroupConfig(4), GroupConfig(4, "mamba"),
                                                    GroupConfig(4, "mamba")))),
]


# -- running one case ------------------------------------------------------------------------


KNOWN_UPSTREAM = "known upstream bug"
# traces/upstream/NAME.jsonl reproduces a bug of vLLM itself; NAME.bug.json
# says which releases it affects and what vLLM does there (the exception it
# raises): the gate reports it, neither passing nor failing the run.
BUG_SIDECAR = ".bug.json"


def _bug_sidecar(path: str) -> dict | None:
    import json

    side = os.path.splitext(path)[0] + BUG_SIDECAR
    if not os.path.exists(side):
        return None
    with open(side, encoding="utf-8") as f:
        return json.load(f)


def is_known_upstream(path: str) -> bool:
    """Whether the trace reproduces a known bug of vLLM (it has a sidecar)."""
    return os.path.exists(os.path.splitext(path)[0] + BUG_SIDECAR)


def run_known_upstream(path: str, bug: dict) -> Case:
    """The reproducer on the installed vLLM alone, whichever release it was
    recorded on: "known upstream bug" where vLLM still does what the sidecar
    expects; where it does not, "fixed in X" on a release newer than every
    one the sidecar lists as affected, "not in X" on an older one, "not
    reproduced on X" between them; exit 0 whatever it says. The sidecar
    expects an exception vLLM raises, or a `finding`: the rule a
    reconciliation that tolerates the known bug (a profile field) names when
    strict (specs/ORACLES.md §3)."""
    from harness.backends.vllm_backend import installed_vllm_version

    release = installed_vllm_version().split("+")[0]
    events, seconds, said, skipped = _reproduce(path, bug["expected"])
    if skipped:
        return Case(case_name(path), "trace", "upstream", events, seconds, ExitCode.OK,
                    f"{path}: {skipped}", label="skipped")
    label = KNOWN_UPSTREAM if said else _not_reproduced(release, bug["releases_affected"])
    report = f"{path}: {label} ({bug['link']}){': ' + said if said else ''}"
    return Case(case_name(path), "trace", "upstream", events, seconds, ExitCode.OK,
                report, label=label)


def _not_reproduced(release: str, affected: list[str]) -> str:
    from harness.core.vllm_releases import release_key

    key = release_key(release)
    if all(release_key(a) < key for a in affected):
        return f"fixed in {release}"
    if all(release_key(a) > key for a in affected):
        return f"not in {release}"
    return f"not reproduced on {release}"


def _reproduce(path: str, expected: dict) -> tuple[int, float, str, str]:
    """The trace's calls on the installed vLLM with its own profile (the
    recorded answers are not compared: a later release may answer otherwise
    and still have the bug): the events run, the seconds, the message of the
    expected outcome at its call ("" when vLLM did otherwise), and why it
    could not run here ("" when it ran). An `exception` is looked for with
    the oracles off, a `finding` with every known bug failing."""
    from harness.backends.base import BackendError
    from harness.backends.lockstep import run_lockstep
    from harness.backends.vllm_backend import EnvironmentProblem, VllmBackend
    from harness.core.compare import FailureKind
    from harness.core.trace_error import TraceError
    from harness.trace.reader import open_trace

    start = time.perf_counter()
    finding = "finding" in expected
    try:
        trace = open_trace(path, any_version=True)
        backend = VllmBackend(trace.header.cache, any_release=True, check=finding,
                              strict=finding)
    except (BackendError, EnvironmentProblem, TraceError) as e:
        return 0, time.perf_counter() - start, "", f"not run on this release: {e}"
    result = run_lockstep((r.event for r in trace.records), [backend])
    f, seconds = result.failure, time.perf_counter() - start
    if f is not None and f.index < expected["call"] - 1:
        return (result.num_events, seconds, "",
                f"not run to its call {expected['call']} on this release: "
                f"{f.message or f.kind.value}")
    if f is None or f.index != expected["call"] - 1:
        return result.num_events, seconds, "", ""
    if finding:
        hit = f.kind is FailureKind.UPSTREAM and expected["finding"] in f.message
    else:
        hit = _is_crash(f, expected)
    return result.num_events, seconds, f.message if hit else "", ""


def _is_crash(failure, expected: dict) -> bool:
    """Whether vLLM crashed as a sidecar's `expected` says: its exception
    type, and the function of vLLM it came from where the sidecar names one."""
    from harness.backends.lockstep import crash_site

    message = failure.message or ""
    site = expected.get("in")
    return expected["exception"] in message and (site is None or site in crash_site(message))


def known_upstream_crash(failure) -> str | None:
    """The reproducer (traces/upstream/) of a known crash of vLLM that a
    fuzz finding is another case of (same exception, same function of vLLM),
    or None. A fuzz slice that finds one reports it and passes, as the
    reproducer does; the slice ends there."""
    import json

    from harness.core.compare import FailureKind

    if failure is None or failure.kind is not FailureKind.UPSTREAM:
        return None
    for side in sorted((TRACES_DIR / "upstream").glob(f"*{BUG_SIDECAR}")):
        expected = json.loads(side.read_text(encoding="utf-8"))["expected"]
        if "exception" in expected and "in" in expected and _is_crash(failure, expected):
            return str(side.relative_to(ROOT)).removesuffix(BUG_SIDECAR) + ".jsonl"
    return None


def run_trace(path: str, backend: str = "impl") -> Case:
    """The trace diffed (vLLM and `backend`: impl, or a foreign exec:CMD),
    or replayed on `backend` when recorded for another release."""
    from harness.report.text import format_failure, verdict_of
    from harness.sources.replay import check_trace

    bug = _bug_sidecar(path)
    if bug is not None:
        return run_known_upstream(path, bug)

    o, mode = check_trace(path, ["vllm", backend], explicit=False), "diff"
    if o.skipped:  # recorded for another vLLM version: the backend replays it
        o, mode = check_trace(path, [backend]), f"replay {o.profile}"
    if o.not_covered:
        return Case(case_name(path), "trace", mode, o.num_events, o.seconds, ExitCode.OK,
                    message=o.not_covered, label=verdict_of(o))
    report = ""
    if o.error is not None:
        report = str(o.error)
    elif o.divergence is not None:
        report = format_failure(o.divergence, o.context)
    if o.truncated and not report:
        report = f"{o.path}: conformant as far as it goes; it lacks its end: {o.truncated}"
    return Case(case_name(path), "trace", mode, o.num_events, o.seconds, o.exit_code, report,
                truncated=o.truncated is not None, label=_label(o.divergence))


def _workload_stream(case: WorkloadCase, profile: VersionProfile):
    from harness.sources.mamba_chunks import MambaChunking
    from harness.sources.workload import SchedulerWorkload

    return SchedulerWorkload(case.spec, profile, case.config.num_blocks,
                             mamba=MambaChunking.of(case.config, profile),
                             drain_copies=case.config.fine_grained_hits(profile)).events()


def _other_backend(case: WorkloadCase, profile: VersionProfile, backend: str):
    from harness.backends.impl_backend import ImplBackend

    if backend == "impl":
        return ImplBackend(case.config, profile)
    from harness.backends.exec_backend import PREFIX
    from harness.backends.vllm_backend import installed_vllm_version
    from harness.sources.replay import exec_backend

    return exec_backend(backend[len(PREFIX):], case.config, profile, installed_vllm_version())


def run_workload(case: WorkloadCase, profile: VersionProfile,
                 out_dir: str | None = None, backend: str = "impl") -> Case:
    """The workload in lockstep on vLLM and `backend` (impl, or exec:CMD). A
    divergence is also written as a trace (in out_dir, when given) to replay
    or bisect."""
    from harness.backends.base import BackendStopped
    from harness.backends.lockstep import run_lockstep
    from harness.backends.vllm_backend import VllmBackend
    from harness.report.text import format_failure

    t0 = time.perf_counter()
    other = None
    try:
        other = _other_backend(case, profile, backend)
        result = run_lockstep(_workload_stream(case, profile),
                              [VllmBackend(case.config, profile, check=True), other])
    except BackendStopped as e:
        seconds = time.perf_counter() - t0
        if e.exit_code == ExitCode.OK:  # not covered
            return Case(case.name, "workload", "lockstep", 0, seconds, ExitCode.OK,
                        message=str(e), label=str(e).rsplit(": ", 1)[0])
        return Case(case.name, "workload", "lockstep", 0, seconds, e.exit_code, str(e))
    finally:
        if other is not None:
            other.close()
    f = result.failure
    report = ""
    if f is not None:
        report = format_failure(f)
        if out_dir is not None:
            from harness.backends.vllm_backend import installed_vllm_version

            path = write_workload_finding(case, profile, f, out_dir)
            report += f"\nwritten to {path} (vLLM's answers)"
            installed = installed_vllm_version()
            if profile.covers(installed):
                report += f"; replay it: kvconform replay {path}"
            else:
                # Held to another release's profile: which release changed it?
                report += (f"\nbisect it: kvconform bisect {path} --from "
                           f"{profile.checked_against[-1]} --to {installed.split('+')[0]}")
    return Case(case.name, "workload", "lockstep", result.num_events, time.perf_counter() - t0,
                ExitCode.OK if f is None else f.exit_code, report, label=_label(f))


def write_workload_finding(case: WorkloadCase, profile: VersionProfile, failure,
                           out_dir: str) -> str:
    """The workload's calls up to the one that failed, with vLLM's answers,
    as a trace: replayed through vLLM alone (the answers agreed up to there,
    so the calls are the same)."""
    from harness.backends.vllm_backend import VllmBackend, installed_vllm_version
    from harness.sources.workload import drive
    from harness.trace import TraceWriter
    from harness.trace.codec import TraceHeader

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{case.name}.jsonl")
    backend = VllmBackend(case.config, profile)
    description = (f"kvconform gate: seeded workload {case.name}, {failure.kind.value} at "
                   f"call {failure.index + 1} ({failure.event.kind}, field "
                   f"{failure.field or '-'}) against the {profile.name} profile")
    header = TraceHeader(installed_vllm_version(), "workload", case.config, description)

    def run(event):
        try:
            return backend.run(event)
        except Exception:  # noqa: BLE001 - the failing call: vLLM refused it
            return None

    with TraceWriter(path, header) as w:
        for n, (event, answer) in enumerate(drive(_workload_stream(case, profile), run)):
            w.write(event, answer)
            if n >= failure.index or answer is None:
                break
    return path


def _sizing_not_compared() -> str | None:
    """Why the installed (or overlay) release's sizing is not compared with
    impl's, or None (harness/backends/vllm_api.py `sizing_compared`)."""
    from harness.backends.vllm_backend import installed_vllm_api, installed_vllm_version

    if installed_vllm_api().sizing_compared:
        return None
    return f"not compared on {installed_vllm_version()} (sizing is held from 0.31 on)"


def run_sizing(name: str, shape) -> Case:
    """A model shape (harness/core/sizing_shape.py) sized by vLLM and impl."""
    from harness.backends.sizing import check_sizing

    if (reason := _sizing_not_compared()) is not None:
        return Case(name, "sizing", "-", 0, 0.0, ExitCode.OK, label=reason)
    o = check_sizing(shape)
    # Its "events" are the fields of the KV cache config compared.
    return Case(name, "sizing", o.mode(), o.num_fields, o.seconds, o.exit_code, o.report())


def trace_sizing_shape(path: str):
    """The shape of a trace with a `model` header (its groups, its model)."""
    from harness.sources.sizing_of_config import shape_of_config
    from harness.trace.reader import open_trace

    header = open_trace(path).header
    return shape_of_config(Path(path).name, header.cache, header.model, f"{case_name(path)}:1")


def workload_sizing_shape(case: WorkloadCase):
    from harness.sources.sizing_of_config import shape_of_config

    return shape_of_config(case.name, case.config)


def run_attention(path: str) -> Case:
    """The attention-output differential of a trace with a `model` header."""
    from harness.attention.differential import AttentionOptions, check_attention

    o = check_attention(path, AttentionOptions(max_batches=16))
    code = o.exit_code
    report = message = ""
    if code == ExitCode.DIVERGED:
        report, message = "\n".join(o.summary_lines()), o.failure_message() or ""
    elif code != ExitCode.OK:
        report = message = o.error or o.failure_message() or ""
    return Case(case_name(path), "trace", "attention", o.num_tokens, o.seconds, code, report,
                message, not_run_here=o.machine_lacks or "")


def run_fuzz(name: str, profile: VersionProfile, seconds: float, seed: int,
             out_dir: str, fuzz_config: FuzzConfig | None = None, min_cases: int = 0,
             backend: str = "impl") -> Case:
    """A fuzz slice, vLLM against `backend` (impl, or exec:CMD: a foreign
    process that fails is the case's one line)."""
    from harness.backends.base import BackendStopped
    from harness.fuzz.campaign import fuzz

    t0 = time.perf_counter()
    try:
        r = fuzz(profile, seconds, seed, out_dir, fuzz_config=fuzz_config,
                 min_cases=min_cases, backend=backend)
    except BackendStopped as e:
        return Case(name, "fuzz", "-", 0, time.perf_counter() - t0, e.exit_code, str(e))
    return fuzz_case(name, r, backend)


def run_sizing_fuzz(name: str, seconds: float, seed: int, out_dir: str, fuzz_config,
                    min_cases: int = 0) -> Case:
    """A fuzz slice of random model shapes, each sized by vLLM and impl."""
    from harness.fuzz.sizing import fuzz_sizing

    if (reason := _sizing_not_compared()) is not None:
        return Case(name, "fuzz", "-", 0, 0.0, ExitCode.OK, label=reason)
    r = fuzz_sizing(seconds, seed, fuzz_config, out_dir, min_cases)
    mode = f"{r.cases} shapes, {r.refused} refused alike"
    if r.vllm_crashed:
        mode += f", {r.vllm_crashed} vLLM crashes"
    if r.finding is None:
        return Case(name, "fuzz", mode, r.fields, r.seconds, ExitCode.OK)
    report = (f"{r.finding.report()}\nwritten to {r.path}; rerun it: pytest {r.path}"
              if r.path else r.finding.report())
    return Case(name, "fuzz", mode, r.fields, r.seconds, r.finding.exit_code, report)


def run_offload_fuzz(name: str, profile: VersionProfile, seconds: float | None, seed: int,
                     fuzz_config, programs: int | None = None) -> Case:
    """A fuzz slice of the CPU offload tier: impl's manager against vLLM's,
    for `seconds` (or `programs` programs)."""
    from harness.fuzz.offload_driver import fuzz

    if not profile.offload_cpu_tier:
        return Case(name, "fuzz", "-", 0, 0.0, ExitCode.OK,
                    label=f"not modelled on {profile.name} (profile offload_cpu_tier)")
    r = fuzz(seed, seconds, programs, profile=profile, fuzz_config=fuzz_config)
    mode = f"{r.programs} offload programs, {r.ops / max(r.seconds, 1e-9):,.0f} ops/s"
    if not r.divergences:
        return Case(name, "fuzz", mode, r.ops, r.seconds, ExitCode.OK)
    d = r.divergences[0]
    report = (f"{d.line()}\nrerun it: python -m harness.fuzz.offload_driver --seed {seed} "
              f"--programs {r.programs}")
    return Case(name, "fuzz", mode, r.ops, r.seconds, ExitCode.DIVERGED, report)


def fuzz_case(name: str, r, backend: str = "impl") -> Case:
    """A campaign's result (CampaignResult) as a gate case."""
    from harness.fuzz.campaign import too_few_cases_warning
    from harness.report.text import format_failure

    mode = f"{r.cases} cases, {r.ops_per_s:,.0f} ops/s"
    if r.refused:
        mode += f", {r.refused} configs refused"
    if r.not_covered:
        mode += f", {r.not_covered} not covered"
    f = r.finding
    if f is None and r.mostly_not_covered:
        why = (f"{NOT_COVERED}{backend}: {r.checked} of {r.cases} cases covered, "
               f"{r.not_covered_text()}")
        return Case(name, "fuzz", mode, r.ops, r.seconds, ExitCode.OK, message=why,
                    label=f"{NOT_COVERED}{backend}")
    if f is None and r.too_few_cases:
        return Case(name, "fuzz", mode, r.ops, r.seconds, ExitCode.ENVIRONMENT,
                    f"warning: {too_few_cases_warning(r)}", label=TOO_FEW_CASES)
    if f is None:
        return Case(name, "fuzz", mode, r.ops, r.seconds, ExitCode.OK)
    report = (f"fuzz case {f.case} failed, shrunk to {f.num_calls} calls, written to "
              f"{f.path}\n{format_failure(f.failure)}\nreplay it: {f.replay_command()}")
    if (known := known_upstream_crash(f.failure)) is not None:
        return Case(name, "fuzz", f"{mode}, ended by a known bug", r.ops, r.seconds,
                    ExitCode.OK, f"{report}\nthe known upstream bug of {known}",
                    label=KNOWN_UPSTREAM)
    return Case(name, "fuzz", mode, r.ops, r.seconds, f.failure.exit_code, report,
                label=_label(f.failure))


# -- the worker differential (harness/sources/worker.py) -------------------------------------


def _worker_case(name: str, o) -> Case:
    code = ExitCode.DIVERGED if o.divergence else ExitCode.OK
    mode = f"worker {o.steps} steps"
    if o.cp_slot_steps:
        mode += f", cp slots {o.cp_slot_steps}"
    return Case(name, "worker", mode, o.events, o.seconds, code,
                f"{name}: {o.divergence}" if o.divergence else "")


def run_worker_trace(path: str) -> Case:
    """The worker block tables and slot mappings of a trace, vLLM's against impl's."""
    from harness.backends.impl_backend import ImplBackend
    from harness.sources.worker import check_worker
    from harness.trace.reader import open_trace

    trace = open_trace(path)
    backend = ImplBackend(trace.header.cache, trace.profile)
    pairs = ((r.event, backend.run(r.event), r.line) for r in trace.records)
    return _worker_case(f"{case_name(path)}[worker]",
                        check_worker(case_name(path), trace.header.cache, pairs, backend))


def run_worker_workload(case: WorkloadCase, profile: VersionProfile) -> Case:
    from harness.backends.impl_backend import ImplBackend
    from harness.sources.worker import check_worker
    from harness.sources.workload import drive

    backend = ImplBackend(case.config, profile)
    pairs = ((ev, ans, i + 1) for i, (ev, ans) in
             enumerate(drive(_workload_stream(case, profile), backend.run)))
    return _worker_case(f"{case.name}[worker]",
                        check_worker(case.name, case.config, pairs, backend))
