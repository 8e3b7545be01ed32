"""The batched diff with vLLM in a forked process beside impl: the same answers
and reports as both in one process, and a divergence in a batch still found
(negative control: a bug planted in vLLM's answers)."""

import pytest

import harness.sources.replay as replay
from harness.backends.vllm_backend import VllmBackend
from harness.sources import side_by_side
from harness.sources.replay import check_trace
from harness.sources.side_by_side import BatchProcess

pytestmark = pytest.mark.vllm

TRACE = "traces/golden/v0.32/tight-memory-preemption.jsonl"


def _summary(o):
    d = o.divergence
    return (o.exit_code, o.num_events, d and (d.line, d.field, d.answers))


@pytest.fixture
def spied(monkeypatch):
    """Which path ran: forked processes started, and event-by-event reruns."""
    seen = {"forked": 0, "reruns": 0}
    started, rerun = BatchProcess.__init__, replay._run

    def start(self, *a, **k):
        seen["forked"] += 1
        started(self, *a, **k)

    def run(*a, **k):
        seen["reruns"] += 1
        return rerun(*a, **k)

    monkeypatch.setattr(BatchProcess, "__init__", start)
    monkeypatch.setattr(replay, "_run", run)
    monkeypatch.setattr(side_by_side, "available", lambda: True)
    return seen


def test_side_by_side_answers_as_in_one_process(spied, monkeypatch):
    beside = _summary(check_trace(TRACE, ["vllm", "impl"]))
    assert spied == {"forked": 1, "reruns": 0}
    monkeypatch.setattr(side_by_side, "available", lambda: False)
    assert _summary(check_trace(TRACE, ["vllm", "impl"])) == beside == (0, beside[1], None)
    assert spied["forked"] == 1


def test_a_divergence_in_the_forked_backend_is_found_and_reported_exactly(spied,
                                                                          monkeypatch):
    """The bug runs in the forked process (inherited) and in the rerun: the
    batch disagrees, the rerun places it at its event."""
    real = VllmBackend.run
    def buggy(self, event):
        # Counted per backend: each fresh backend meets the bug at the same event.
        answer = real(self, event)
        c = self.__dict__.setdefault("_planted_bug", {"n": 0, "planted": False})
        c["n"] += 1
        ids = answer.get("block_ids") if isinstance(answer, dict) else None
        if c["n"] >= 300 and not c["planted"] and ids and len(ids[0]) > 1:
            c["planted"] = True  # the order of a real allocation, swapped
            answer = {**answer, "block_ids": [ids[0][::-1], *ids[1:]]}
        return answer

    monkeypatch.setattr(VllmBackend, "run", buggy)
    beside = check_trace(TRACE, ["vllm", "impl"])
    assert beside.exit_code == 1 and spied == {"forked": 1, "reruns": 1}
    monkeypatch.setattr(side_by_side, "available", lambda: False)
    alone = check_trace(TRACE, ["vllm", "impl"])
    assert _summary(alone) == _summary(beside)


def _bad_line_after(tmp_path, events: int) -> str:
    """TRACE's header and first `events` events, then a line no reader accepts."""
    with open(TRACE) as f:
        lines = [next(f) for _ in range(events + 1)]
    path = tmp_path / "bad-line.jsonl"
    path.write_text("".join(lines) + '{"op": "no_such_op"}\n')
    return str(path)


def test_bad_input_reads_as_in_one_process_without_a_rerun(spied, monkeypatch, tmp_path):
    """The forked side reads past the bad line (it checks nothing); the
    parent's last batch, cut short there, need only begin the process's."""
    path = _bad_line_after(tmp_path, 100)
    beside = check_trace(path, ["vllm", "impl"])
    assert spied == {"forked": 1, "reruns": 0}
    monkeypatch.setattr(side_by_side, "available", lambda: False)
    alone = check_trace(path, ["vllm", "impl"])
    assert beside.exit_code == alone.exit_code == 2
    assert str(beside.error) == str(alone.error) and beside.error.line == 102


def _batches(*items):
    def batches():
        yield from items
    return lambda: batches()


def test_answers_agree_as_equality_has_it_not_as_their_bytes():
    p = BatchProcess(_batches([{"usage": 1.0, "n": 1}], [{"usage": 0.5}]))
    try:
        assert p.agrees([{"n": True, "usage": 1}])  # == says equal; the bytes differ
        assert not p.agrees([{"usage": 0.25}])
    finally:
        p.close()


def _failing():
    def batches():
        yield [1, 2]
        raise RuntimeError("the backend died")
    return batches()


def test_a_process_that_fails_reads_as_a_failed_batch():
    p = BatchProcess(_failing)
    try:
        assert p.agrees([1, 2])
        assert not p.agrees([3])
        assert not p.agrees([3])  # and stays so
    finally:
        p.close()


def test_a_process_that_cannot_build_its_backend_is_not_ready():
    def broken():
        raise ValueError("no such config")
    p = BatchProcess(broken)
    try:
        assert not p.wait_ready() and not p.agrees([1])
    finally:
        p.close()
