"""pytest plugin (entry point `pytest11`): traces are test items.

`pytest traces/` collects every `*.jsonl` / `*.yaml` trace file (files whose
first line or `header:` says `kvconform-trace/1`; other YAML is left alone) and
runs each as the conformance run does: a trace of the installed vLLM's version
is diffed (impl and vLLM side by side, recorded answers and expectations
checked), a trace of another version is replayed on impl with its profile. A
failure's text is the divergence report.

Every trace is also a worker case (`NAME[worker]`): vLLM's worker block
tables and slot mappings driven by its answers, against impl's
(harness/sources/worker.py); so is every seeded workload.

A trace with a `model` header is also an attention case (`NAME[attention]`):
the attention-output differential (harness/attention/differential.py), a
divergence a failure, bad input or an environment without vLLM's attention
ops an error (never a skip); and a sizing case (`NAME[sizing]`): its model's
KV cache sized by impl and vLLM (harness/backends/sizing.py). A sizing corpus
(`kvconform-sizing/1`, traces/sizing/) is a file of sizing cases, one per
shape (`FILE[SHAPE]`); each seeded workload's config is sized too
(`WORKLOAD[sizing]`).

Options (used by `kvconform gate`):
  --kvconform-workloads         also run the seeded lockstep workloads
  --kvconform-fuzz-seconds N    also fuzz for N seconds in all: a slice of it
                                for every kind config (harness/fuzz/kind_configs/)
                                and each of several seeds
  --kvconform-fuzz-seed S / --kvconform-fuzz-out DIR
  --kvconform-no-attention      leave the attention cases out
Each item runs one case of harness/gate/cases.py and records its Case as user
properties (kvconform_name, _kind, _mode, _events, _seconds, _exit, _message)
that the gate turns back into Cases for its table, JUnit and summary; they
travel from pytest-xdist workers too, so `-n auto` gives the same results as a
serial run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TRACE_SUFFIXES = (".jsonl", ".yaml", ".yml")
_MAGIC = "kvconform-trace/1"


def pytest_addoption(parser):
    group = parser.getgroup("kvconform", "kvconform conformance")
    group.addoption("--kvconform-workloads", action="store_true",
                    help="also run the seeded lockstep workloads (impl vs vLLM)")
    group.addoption("--kvconform-fuzz-seconds", type=float, default=0.0,
                    help="also run a differential fuzz campaign of this many seconds")
    group.addoption("--kvconform-fuzz-seed", type=int, default=0)
    group.addoption("--kvconform-fuzz-out", default="fuzz-findings",
                    help="where fuzz findings are written")
    group.addoption("--kvconform-core-coverage", default=None, metavar="DIR",
                    help="measure the branches of vLLM's KV core each fuzz slice "
                         "reaches, a coverage data file per slice in DIR")
    group.addoption("--kvconform-no-attention", action="store_true",
                    help="leave out the attention differential of traces with a model header")
    group.addoption("--kvconform-backend", default="impl",
                    help="what runs beside vLLM: impl or exec:CMD (specs/FOREIGN_BACKEND.md)")


def _is_trace(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    if path.suffix == ".jsonl":
        return _MAGIC in head.split("\n", 1)[0]
    return "header:" in head and _MAGIC in head


def _is_sizing_corpus(path: Path) -> bool:
    from harness.sources.sizing_corpus import is_sizing_corpus

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return is_sizing_corpus(f.read(4096))
    except OSError:
        return False


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix in TRACE_SUFFIXES and _is_trace(file_path):
        return TraceFile.from_parent(parent, path=file_path)
    # A sizing corpus sizes impl against vLLM: nothing a foreign backend answers.
    if (file_path.suffix in (".yaml", ".yml") and _is_sizing_corpus(file_path)
            and parent.config.option.kvconform_backend == "impl"):
        return SizingFile.from_parent(parent, path=file_path)
    return None


class KVConformFailure(Exception):
    """A case that did not conform; its message is the report."""


class KVConformError(Exception):
    """A case that could not be checked (bad input, the environment); raised
    while the item is set up, so that JUnit reports an error, not a failure."""


class _CaseItem(pytest.Item):
    """A pytest item running one case of harness/gate/cases.py."""

    # Cases that are errors when they cannot be checked (JUnit <error>).
    errors_in_setup = False
    _kind = "trace"
    _mode = "-"  # the mode a case that raised is reported under

    def _run(self):
        raise NotImplementedError

    def _record(self, case) -> None:
        self.user_properties.extend([  # plain data: xdist sends them to the controller
            ("kvconform_name", case.name),
            ("kvconform_kind", case.kind),
            ("kvconform_mode", case.mode),
            ("kvconform_events", case.events),
            ("kvconform_seconds", round(case.seconds, 3)),
            ("kvconform_exit", int(case.exit_code)),
            ("kvconform_truncated", case.truncated),
            ("kvconform_label", case.label),
            ("kvconform_message", case.message),
            ("kvconform_not_run_here", case.not_run_here),
        ])

    def _checked_run(self):
        """The case; an exception escaping it is a result too, never a
        traceback: raised inside vLLM (or the modules driving it) it is the
        environment's (exit 3), otherwise the case could not run (exit 2)."""
        try:
            return self._run()
        except Exception as e:  # noqa: BLE001 - see above
            from harness.gate.cases import crashed_case

            return crashed_case(self._label(), self._kind, e, self._mode)

    def _label(self) -> str:
        """The case's name in tables (a trace's path, as its Case names it)."""
        path = getattr(self, "path", None)
        if path is None or self._kind != "trace":
            return self.name
        from harness.gate.cases import case_name

        return case_name(str(path))

    def setup(self):
        self._case = None
        if not self.errors_in_setup:
            return
        case = self._case = self._checked_run()
        if case.exit_code not in (0, 1) and not case.not_run_here:
            self._record(case)
            raise KVConformError(case.report)

    def runtest(self):
        case = self._case if self._case is not None else self._checked_run()
        self._record(case)
        if case.not_run_here:  # reported by the gate, decides nothing
            return
        if case.exit_code != 0:
            raise KVConformFailure(case.report)

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance((KVConformFailure, KVConformError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def _repr_failure_py(self, excinfo, style=None):
        # (How pytest reports an error raised while an item is set up.)
        if excinfo.errisinstance(KVConformError):
            return str(excinfo.value)
        return super()._repr_failure_py(excinfo, style)


def _worker_runs() -> bool:
    """The worker differential runs against the installed vLLM, not a release
    overlay (which has no platform for the worker's tables)."""
    from harness.backends.vllm_worker import overlay_in_use

    return not overlay_in_use()


class TraceFile(pytest.File):
    def collect(self):
        from harness.attention.differential import wants_attention
        from harness.gate.cases import is_known_upstream

        yield TraceItem.from_parent(self, name=self.path.name)
        # Attention, sizing and the worker tables check impl against vLLM: a
        # foreign backend (exec:CMD) answers the trace's events only, and a
        # known upstream bug's reproducer is run on vLLM alone.
        if (self.config.option.kvconform_backend != "impl"
                or is_known_upstream(str(self.path))):
            return
        has_model = wants_attention(str(self.path))
        if has_model and not self.config.option.kvconform_no_attention:
            yield AttentionItem.from_parent(self, name=f"{self.path.name}[attention]")
        if has_model:
            yield TraceSizingItem.from_parent(self, name=f"{self.path.name}[sizing]")
        if _worker_runs():
            yield WorkerItem.from_parent(self, name=f"{self.path.name}[worker]")


class TraceItem(_CaseItem):
    def _run(self):
        from harness.gate.cases import run_trace

        return run_trace(str(self.path), self.config.option.kvconform_backend)

    def reportinfo(self):
        return self.path, None, f"trace {self.path}"


class AttentionItem(_CaseItem):
    errors_in_setup = True
    _mode = "attention"

    def _run(self):
        from harness.gate.cases import run_attention

        return run_attention(str(self.path))

    def reportinfo(self):
        return self.path, None, f"attention {self.path}"


class SizingFile(pytest.File):
    """A sizing corpus: one item per model shape. A file that cannot be read
    is one item, an error naming file:line and the field."""

    def collect(self):
        from harness.core.trace_error import TraceError
        from harness.sources.sizing_corpus import read_sizing_corpus

        try:
            shapes = read_sizing_corpus(str(self.path))
        except TraceError as e:
            item = SizingItem.from_parent(self, name=f"{self.path.name}[(file)]")
            item.problem = e
            yield item
            return
        for shape in shapes:
            item = SizingItem.from_parent(self, name=f"{self.path.name}[{shape.name}]")
            item.shape = shape
            yield item


class SizingItem(_CaseItem):
    """One model shape of a sizing corpus, sized by impl and vLLM."""

    errors_in_setup = True
    _kind = "sizing"
    shape = None
    problem = None

    def _label(self) -> str:
        from harness.gate.cases import case_name

        return f"{case_name(str(self.path))}[{self.name.rsplit('[', 1)[-1][:-1]}]"

    def _run(self):
        from harness.gate.cases import Case, run_sizing

        if self.problem is not None:
            return Case(self._label(), "sizing", "-", 0, 0.0, self.problem.exit_code,
                        str(self.problem))
        return run_sizing(self._label(), self.shape)

    def reportinfo(self):
        return self.path, None, f"sizing {self.name}"


class TraceSizingItem(_CaseItem):
    """A trace's model (its `model` header and groups), sized by impl and vLLM."""

    errors_in_setup = True
    _kind = "sizing"

    def _label(self) -> str:
        from harness.gate.cases import case_name

        return f"{case_name(str(self.path))}[sizing]"

    def _run(self):
        from harness.gate.cases import run_sizing, trace_sizing_shape

        return run_sizing(self._label(), trace_sizing_shape(str(self.path)))

    def reportinfo(self):
        return self.path, None, f"sizing {self.path}"


class WorkloadSizingItem(_CaseItem):
    """A seeded workload's cache config, sized by impl and vLLM."""

    errors_in_setup = True
    _kind = "sizing"

    def _run(self):
        from harness.gate.cases import WORKLOADS, run_sizing, workload_sizing_shape

        case = next(c for c in WORKLOADS if f"{c.name}[sizing]" == self.name)
        return run_sizing(self.name, workload_sizing_shape(case))

    def reportinfo(self):
        return "workload", None, f"sizing {self.name}"


class WorkerItem(_CaseItem):
    """The worker block tables and slot mappings of a trace, vLLM's against
    impl's (harness/sources/worker.py)."""

    _kind = "worker"

    def _run(self):
        from harness.gate.cases import run_worker_trace

        return run_worker_trace(str(self.path))

    def reportinfo(self):
        return self.path, None, f"worker {self.path}"


class WorkerWorkloadItem(_CaseItem):
    _kind = "worker"

    def _run(self):
        from harness.backends.vllm_backend import installed_vllm_profile
        from harness.gate.cases import WORKLOADS, run_worker_workload

        case = next(c for c in WORKLOADS if f"{c.name}[worker]" == self.name)
        return run_worker_workload(case, installed_vllm_profile())

    def reportinfo(self):
        return "workload", None, f"worker {self.name}"


class WorkloadItem(_CaseItem):
    _kind = "workload"
    def _run(self):
        from harness.backends.vllm_backend import installed_vllm_profile
        from harness.gate.cases import WORKLOADS, run_workload

        case = next(c for c in WORKLOADS if c.name == self.name)
        return run_workload(case, installed_vllm_profile(), self.config.option.kvconform_fuzz_out,
                            self.config.option.kvconform_backend)

    def reportinfo(self):
        return "workload", None, f"workload {self.name}"


class FuzzItem(_CaseItem):
    """One slice of the gate's fuzz budget: one kind config, one seed."""

    _kind = "fuzz"
    kind: str = ""
    seed: int = 0
    seconds: float = 0.0

    def _run(self):
        from harness.fuzz.core_coverage import measured

        with measured(self.config.option.kvconform_core_coverage, self.name):
            return self._slice()

    def _slice(self):
        from harness.backends.vllm_backend import installed_vllm_profile
        from harness.core.exit_codes import ExitCode
        from harness.fuzz.campaign import MIN_CASES
        from harness.fuzz.offload_driver import OffloadFuzzConfig
        from harness.fuzz.sizing import SizingFuzzConfig
        from harness.fuzz.slices import load_kind_config
        from harness.gate.cases import (
            NOT_COVERED,
            Case,
            run_fuzz,
            run_offload_fuzz,
            run_sizing_fuzz,
        )

        fuzz_config = load_kind_config(self.kind)
        backend = self.config.option.kvconform_backend
        if backend != "impl" and isinstance(fuzz_config, (OffloadFuzzConfig, SizingFuzzConfig)):
            # The offload tier and model shapes' sizing are impl's, not the backend's.
            what = ("the CPU offload tier" if isinstance(fuzz_config, OffloadFuzzConfig)
                    else "model shapes' sizing")
            return Case(self.name, "fuzz", "-", 0, 0.0, ExitCode.OK,
                        message=f"{NOT_COVERED}{backend}: {what}",
                        label=f"{NOT_COVERED}{backend}")
        if isinstance(fuzz_config, OffloadFuzzConfig):
            return run_offload_fuzz(self.name, installed_vllm_profile(), self.seconds,
                                    self.seed, fuzz_config)
        if isinstance(fuzz_config, SizingFuzzConfig):
            return run_sizing_fuzz(self.name, self.seconds, self.seed,
                                   self.config.option.kvconform_fuzz_out, fuzz_config,
                                   min_cases=MIN_CASES)
        return run_fuzz(self.name, installed_vllm_profile(), self.seconds, self.seed,
                        self.config.option.kvconform_fuzz_out, load_kind_config(self.kind),
                        min_cases=MIN_CASES, backend=backend)

    def reportinfo(self):
        return "fuzz", None, self.name


class SteeredFuzzItem(FuzzItem):
    """A slot of the budget's steered half: its kind config and seed are
    chosen when it runs, from what the exploring slices reached."""

    plan = None
    slot: int = 0

    def _run(self):
        from dataclasses import replace

        from harness.fuzz.core_coverage import measured
        from harness.fuzz.steering import slice_name, steered_slot

        data_dir = self.config.option.kvconform_core_coverage
        s = steered_slot(self.plan, self.slot, data_dir)
        self.kind, self.seed, self.seconds = s.kind, s.seed, s.seconds
        with measured(data_dir, self.name):
            case = self._slice()
        return replace(case, name=slice_name(s.kind, s.seed), mode=f"{case.mode} ({s.why})")


def pytest_collection_modifyitems(session, config, items):
    """Add the workload and fuzz items the options ask for (after the traces;
    deterministic, so every xdist worker collects the same list)."""
    opts = config.option
    if getattr(opts, "kvconform_workloads", False):
        from harness.gate.cases import WORKLOADS

        items.extend(WorkloadItem.from_parent(session, name=c.name) for c in WORKLOADS)
        if getattr(opts, "kvconform_backend", "impl") == "impl":
            items.extend(WorkloadSizingItem.from_parent(session, name=f"{c.name}[sizing]")
                         for c in WORKLOADS)
            if _worker_runs():
                items.extend(WorkerWorkloadItem.from_parent(session, name=f"{c.name}[worker]")
                             for c in WORKLOADS)
    # The fuzz campaign drives impl or the foreign backend, beside vLLM.
    if getattr(opts, "kvconform_fuzz_seconds", 0) > 0:
        from harness.backends.vllm_backend import installed_vllm_profile
        from harness.fuzz.slices import fuzz_slices
        from harness.fuzz.steering import plan, slice_name

        profile = installed_vllm_profile()
        steer = getattr(opts, "kvconform_core_coverage", None) is not None
        fuzz_items = []
        if steer:
            p = plan(opts.kvconform_fuzz_seconds, opts.kvconform_fuzz_seed, profile)
            slices = list(p.explore)
        else:
            slices = fuzz_slices(opts.kvconform_fuzz_seconds, opts.kvconform_fuzz_seed, profile)
        for kind, seed, seconds in slices:
            item = FuzzItem.from_parent(session, name=slice_name(kind, seed))
            item.kind, item.seed, item.seconds = kind, seed, seconds
            fuzz_items.append(item)
        # First, so that under xdist the campaigns start while traces run.
        items[:0] = fuzz_items
        if steer:
            # Last: by then every exploring slice has ended (steering.py).
            for slot in range(p.slots):
                item = SteeredFuzzItem.from_parent(session, name=f"fuzz[steered,slot={slot}]")
                item.plan, item.slot = p, slot
                items.append(item)
