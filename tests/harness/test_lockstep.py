"""The one event step: every outcome of running an event on the backends
becomes the agreed answer or one Failure; workloads and plain event lists run
through it."""

import pytest

from harness.backends.base import BackendError
from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_batch, run_event, run_lockstep
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.compare import Failure, FailureKind
from harness.core.events import AddRequest, Allocate, Lookup, Step
from harness.report.text import format_failure
from harness.sources.workload import SchedulerWorkload, WorkloadSpec
from impl.invariants import InvariantViolation
from impl.profiles import get_profile

P = get_profile("0.32")
CONFIG = CacheConfig(num_blocks=16, groups=(GroupConfig(4),))
WORKLOAD = CacheConfig(num_blocks=48, groups=(GroupConfig(16),))
SPEC = WorkloadSpec(seed=3, block_size=16, num_requests=20)


class Fake:
    """A backend that answers (or raises) what it is told to."""

    def __init__(self, name, outcome):
        self.name, self.outcome = name, outcome

    def run(self, event):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


EVENT = Lookup("r")


def test_agreement_returns_the_reference_answer_itself():
    answer = {"hit_tokens": 0, "block_ids": [[]]}
    assert run_event(EVENT, Fake("vllm", answer), (Fake("impl", dict(answer)),)) is answer


@pytest.mark.parametrize("impl, kind, field, impl_shows", [
    ({"hit_tokens": 4, "block_ids": [[1]]}, FailureKind.DIVERGED, "hit_tokens", None),
    (IndexError("list index out of range"), FailureKind.DIVERGED, "",
     "IndexError: list index out of range"),
    (InvariantViolation("ref_cnt 3 but 2 requests"), FailureKind.INVARIANT, "",
     "invariant violated: ref_cnt 3 but 2 requests"),
])
def test_every_disagreement_of_another_backend_is_a_failure(impl, kind, field, impl_shows):
    answer = {"hit_tokens": 0, "block_ids": [[]]}
    f = run_event(EVENT, Fake("vllm", answer), (Fake("impl", impl),))
    assert isinstance(f, Failure) and f.kind is kind and f.field == field
    assert f.answers["vllm"] == answer
    assert f.answers["impl"] == (impl if impl_shows is None else impl_shows)
    assert f.exit_code == 1


def test_a_call_the_reference_raises_on_is_rejected_bad_input():
    other = Fake("impl", {"ok": True})  # impl leaves vLLM's asserts to trace/rules.py
    f = run_event(EVENT, Fake("vllm", AssertionError("lora_path cannot be empty")), (other,))
    assert f.kind is FailureKind.REJECTED and f.exit_code == 2
    assert f.message == "vLLM rejects this: AssertionError: lora_path cannot be empty"
    assert f.field == "lookup" and f.backend == "vllm"
    f = run_event(EVENT, Fake("impl", BackendError("no request 'r'")), ())
    assert (f.kind, f.field, f.message) == (FailureKind.REJECTED, "req", "no request 'r'")
    f = run_event(EVENT, Fake("impl", InvariantViolation("x")), ())
    assert f.kind is FailureKind.INVARIANT and f.exit_code == 1


def test_a_vllm_raise_impl_answers_is_upstream_exit_1():
    other = Fake("impl", {"ok": True})
    f = run_event(EVENT, Fake("vllm", IndexError("list index out of range")), (other,))
    assert f.kind is FailureKind.UPSTREAM and f.exit_code == 1
    assert f.message == "vLLM is wrong: raises IndexError: list index out of range"
    assert f.answers["impl"] == {"ok": True}
    f = run_event(EVENT, Fake("vllm", IndexError("out of range")), (Fake("impl", KeyError("r")),))
    assert f.kind is FailureKind.REJECTED and f.exit_code == 2


def test_a_crash_of_vllm_impl_mirrors_or_vllm_alone_raises_is_upstream():
    # impl raising the same type mirrors a known crash of vLLM (traces/upstream/);
    # it is vLLM's bug all the same, never bad input.
    f = run_event(EVENT, Fake("vllm", IndexError("out of range")),
                  (Fake("impl", IndexError("block 1 of 1")),))
    assert f.kind is FailureKind.UPSTREAM and f.exit_code == 1
    assert f.message == "vLLM is wrong: crashes: IndexError: out of range"
    assert f.answers["impl"] == "IndexError: block 1 of 1"
    f = run_event(EVENT, Fake("vllm", KeyError("r")), ())
    assert f.kind is FailureKind.UPSTREAM and "crashes: KeyError" in f.message
    # impl alone is no oracle of vLLM: its exception stays a rejection.
    f = run_event(EVENT, Fake("impl", KeyError("r")), ())
    assert f.kind is FailureKind.REJECTED


def test_ctrl_c_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        run_event(EVENT, Fake("vllm", KeyboardInterrupt()), ())


def test_lockstep_stops_at_the_first_failure_with_its_index():
    events = [AddRequest("a", [1, 2, 3, 4, 5]), Step(), Allocate("a", 5), Allocate("zz", 1)]
    a, b = ImplBackend(CONFIG, P), ImplBackend(CONFIG, P)
    result = run_lockstep(events, [a, b])
    assert result.num_events == 4 and result.failure.index == 3
    assert result.failure.kind is FailureKind.REJECTED
    assert format_failure(result.failure) == "req: no request 'zz' (event #3, allocate)"


def test_a_workload_in_lockstep_is_fed_the_agreed_answers():
    seen = []
    result = run_lockstep(SchedulerWorkload(SPEC, P, WORKLOAD.num_blocks).events(),
                          [ImplBackend(WORKLOAD, P), ImplBackend(WORKLOAD, P, check=True)],
                          on_event=seen.append)
    assert result.failure is None and result.num_events == len(seen) > 500
    assert seen == list(range(1, len(seen) + 1))


def test_a_broken_backend_in_a_workload_is_caught(monkeypatch):
    """Negative control: impl answering one block id off diverges."""
    faulty = ImplBackend(WORKLOAD, P)
    real = faulty._on_allocate

    def off_by_one(ev):
        answer = real(ev)
        if "block_ids" in answer and answer["block_ids"][0]:
            answer = {"block_ids": [[answer["block_ids"][0][0] + 1, *answer["block_ids"][0][1:]]]}
        return answer

    faulty._handlers[Allocate] = off_by_one
    result = run_lockstep(SchedulerWorkload(SPEC, P, WORKLOAD.num_blocks).events(),
                          [ImplBackend(WORKLOAD, P), faulty])
    f = result.failure
    assert f is not None and f.kind is FailureKind.DIVERGED and f.event.kind == "allocate"
    assert f.field == "block_ids[0][0]"


def test_a_batch_gives_the_answers_of_event_by_event_and_none_at_any_failure():
    """run_batch may only say 'all passed': any raise or difference is None
    (the caller then finds the failure with run_event)."""
    events = [AddRequest("a", [1, 2, 3, 4, 5]), Step(), Lookup("a"), Allocate("a", 5)]
    a, b = ImplBackend(CONFIG, P), ImplBackend(CONFIG, P)
    single = ImplBackend(CONFIG, P)
    one_by_one = [run_event(e, single, ()) for e in events]
    assert run_batch(events, a, (b,)) == one_by_one
    answer = {"hit_tokens": 0, "block_ids": [[]]}
    assert run_batch([EVENT] * 3, Fake("vllm", answer), (Fake("impl", dict(answer)),)) == [
        answer] * 3
    # Negative controls: a difference, a raise in either backend.
    assert run_batch([EVENT], Fake("vllm", answer), (Fake("impl", {"hit_tokens": 4}),)) is None
    assert run_batch([EVENT], Fake("vllm", answer), (Fake("impl", IndexError()),)) is None
    assert run_batch([EVENT], Fake("vllm", InvariantViolation("x")), ()) is None
    with pytest.raises(KeyboardInterrupt):
        run_batch([EVENT], Fake("vllm", KeyboardInterrupt()), ())
