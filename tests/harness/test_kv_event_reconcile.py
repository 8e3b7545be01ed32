"""KV events reconciled with the pool (harness/backends/kv_event_reconcile.py,
specs/ORACLES.md §2): silent on the real vLLM and on impl, the known bug of
every release (a BlockRemoved per copy) counted where the profile records
it and failing where it does not, and each rule catching a bug injected into
vLLM's pool (the watched instance's methods patched in the test; the
installed package is never edited), naming the event and the block. On
impl's side a broken rule is INVARIANT."""

from __future__ import annotations

import dataclasses

import pytest

# Differential against the real vLLM: without it these tests fail, never skip.
import vllm as _vllm  # noqa: E402, F401

from harness.backends.impl_backend import ImplBackend
from harness.backends.lockstep import run_lockstep
from harness.backends.vllm_backend import VllmBackend, installed_vllm_profile
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.compare import FailureKind
from harness.core.events import (
    AddRequest,
    Allocate,
    Checkpoint,
    Free,
    Lookup,
    ResetPrefixCache,
)
from harness.core.exit_codes import ExitCode

pytestmark = pytest.mark.vllm

CONFIG = CacheConfig(num_blocks=8, groups=(GroupConfig(4),))
TWO_BLOCKS = list(range(1, 9))
FIVE_BLOCKS = list(range(50, 70))
OTHER = list(range(80, 88))
# The event numbers (a failure's index) of the calls below.
B_ALLOCATE, C_ALLOCATE, D_ALLOCATE, RESET = 5, 10, 14, 16


def _events():
    """The same two-block prompt twice (b hits a's first block 1 and caches
    its own copy, block 3, of a's second block 2), both freed; c's
    allocation evicts block 2 while block 3 stays cached, d's evicts blocks
    3 and 1. Then a reset."""
    return [
        AddRequest("a", TWO_BLOCKS), Lookup("a"), Allocate("a", 8),
        AddRequest("b", TWO_BLOCKS), Lookup("b"), Allocate("b", 4),
        Free("a"), Free("b"),
        AddRequest("c", FIVE_BLOCKS), Lookup("c"), Allocate("c", 20), Free("c"),
        AddRequest("d", OTHER), Lookup("d"), Allocate("d", 8), Free("d"),
        ResetPrefixCache(), Checkpoint(("events",)),
    ]


def _run(patch=None, strict=False, impl_patch=None):
    profile = installed_vllm_profile()
    vllm = VllmBackend(CONFIG, profile, check=True, strict=strict)
    impl = ImplBackend(CONFIG, profile, check=True)
    if patch is not None:
        patch(vllm.manager.block_pool)
    if impl_patch is not None:
        impl_patch(impl.manager.block_pool)
    return run_lockstep(_events(), [vllm, impl]), vllm, impl


def _caught(patch, words: str, index: int, block: int | tuple | None = None, strict=False):
    result, vllm, _ = _run(patch, strict)
    failure = result.failure
    assert failure is not None, "the injected bug went unnoticed"
    assert failure.kind is FailureKind.UPSTREAM
    assert failure.exit_code == ExitCode.DIVERGED
    assert failure.index == index, failure.message
    assert f"event #{index}" in failure.message
    assert words in failure.message, failure.message
    if block is not None:  # the block (one of them) the message must name
        assert any(f"block {b} " in failure.message or f"block(s) {b} " in failure.message
                   or f"block {b})" in failure.message
                   for b in (block if isinstance(block, tuple) else (block,))), failure.message
    return failure


def _after(name: str, then):
    """Patch pool method `name` so that `then(pool, *args)` runs after it."""
    def patch(pool):
        method = getattr(pool, name)

        def patched(*args, **kwargs):
            out = method(*args, **kwargs)
            then(pool, *args)
            return out

        setattr(pool, name, patched)
    return patch


def test_real_vllm_and_impl_break_no_rule_and_count_the_known_bug():
    result, vllm, impl = _run()
    assert result.failure is None, result.failure.message
    assert result.num_events == len(_events())
    # a's copy of the second block was removed while b's stayed cached.
    assert vllm.reconciler.known_bug_hits == 1
    assert impl.reconciler.known_bug_hits == 1


def test_the_known_bug_fails_where_the_profile_does_not_record_it():
    # strict: what a release with kv_events_removed_per_copy false is held to.
    f = _caught(None, "still cache it (removed-while-cached)", C_ALLOCATE, block=3,
                strict=True)
    assert "vLLM is wrong" in f.message


def test_impl_breaking_a_rule_is_an_invariant_failure():
    profile = dataclasses.replace(installed_vllm_profile(), kv_events_removed_per_copy=False)
    vllm = VllmBackend(CONFIG, installed_vllm_profile(), check=True)
    impl = ImplBackend(CONFIG, profile, check=True)
    failure = run_lockstep(_events(), [vllm, impl]).failure
    assert failure is not None and failure.kind is FailureKind.INVARIANT
    assert failure.index == C_ALLOCATE
    assert "removed-while-cached" in failure.answers["impl"]


def test_announced_rule_catches_a_lost_block_stored():
    def drop_last_stored(pool, *args):
        if pool.kv_event_queue and type(pool.kv_event_queue[-1]).__name__ == "BlockStored":
            pool.kv_event_queue.pop()
    _caught(_after("cache_full_blocks", drop_last_stored), "but no BlockStored announced it",
            2, block=(1, 2))


def test_removed_rule_catches_a_lost_block_removed():
    def patch(pool):
        pool._emit_block_removed_events = lambda hashes: None
    # c's allocation evicts block 2 silently, which block 3's copy hides;
    # d's evicts block 3, the last copy, and block 1.
    _caught(patch, "no longer caches hash", D_ALLOCATE, block=(1, 3))


def test_never_cached_rule_catches_an_event_for_no_block():
    def announce_a_stranger(pool, *args):
        stored = pool.kv_event_queue[-1]
        pool.kv_event_queue.append(_with(stored, block_hashes=[12345],
                                         parent_block_hash=None))
    _caught(_after("cache_full_blocks", announce_a_stranger), "which no block ever cached", 2)


def test_removed_once_rule_catches_a_removal_sent_twice():
    def patch(pool):
        emit = pool._emit_block_removed_events

        def twice(hashes):
            emit(hashes)
            emit(hashes)
        pool._emit_block_removed_events = twice
    _caught(patch, "2 time(s), but 1 cop(ies) of it left the cache", C_ALLOCATE)


def test_removed_once_rule_catches_a_removal_of_a_hash_never_announced():
    def remove_a_stranger(pool, *args):
        pool.kv_event_queue.append(_removed(pool, 777))
    _caught(_after("free_blocks", remove_a_stranger), "BlockRemoved for hash 777", 6)


def test_announced_once_rule_catches_a_block_stored_sent_twice():
    def repeat_stored(pool, *args):
        if pool.kv_event_queue and type(pool.kv_event_queue[-1]).__name__ == "BlockStored":
            pool.kv_event_queue.append(pool.kv_event_queue[-1])
    _caught(_after("cache_full_blocks", repeat_stored),
            "again, and no other copy of it was cached", 2, block=1)


def test_chained_rule_catches_a_wrong_parent():
    def wrong_parent(pool, *args):
        stored = pool.kv_event_queue[-1]
        if stored.parent_block_hash is not None:
            pool.kv_event_queue[-1] = _with(stored, parent_block_hash=4242)
    # b's BlockStored chains its second block to a's first.
    _caught(_after("cache_full_blocks", wrong_parent), "chains to parent 4242", B_ALLOCATE)


def test_medium_rule_catches_another_medium():
    def on_cpu(pool, *args):
        pool.kv_event_queue[-1] = _with(pool.kv_event_queue[-1], medium="CPU")
    _caught(_after("cache_full_blocks", on_cpu), "names medium CPU", 2)


def test_cleared_rule_catches_a_reset_without_all_blocks_cleared():
    def silent_reset(pool, *args):
        pool.kv_event_queue.pop()
    _caught(_after("reset_prefix_cache", silent_reset),
            "emptied without an AllBlocksCleared event", RESET)


def test_cleared_rule_catches_all_blocks_cleared_while_blocks_stay_cached():
    def clear_too_soon(pool, *args):
        from vllm.distributed.kv_events import AllBlocksCleared

        pool.kv_event_queue.append(AllBlocksCleared())
    _caught(_after("free_blocks", clear_too_soon), "AllBlocksCleared, but the cached-block map",
            6)


REPRODUCERS = ("traces/upstream/block-removed-while-copy-cached.jsonl",
               "traces/upstream/full-report-announces-skipped-block.jsonl")


@pytest.mark.parametrize("path", REPRODUCERS)
def test_the_gate_reports_each_known_reconciliation_bug_and_passes(path):
    from harness.gate.cases import KNOWN_UPSTREAM, run_trace

    case = run_trace(path)
    assert case.label == KNOWN_UPSTREAM, case.report
    assert case.exit_code == ExitCode.OK
    assert "vLLM is wrong" in case.report


def test_a_finding_vllm_no_longer_makes_is_fixed_in_the_release(tmp_path):
    import json
    import shutil

    from harness.gate.cases import run_trace

    shutil.copy(REPRODUCERS[0], tmp_path / "bug.jsonl")
    (tmp_path / "bug.bug.json").write_text(json.dumps(
        {"releases_affected": ["0.1.0"], "expected": {"call": 11, "finding": "chained"},
         "link": "https://example.invalid"}))
    case = run_trace(str(tmp_path / "bug.jsonl"))
    assert case.label.startswith("fixed in "), case.label
    assert case.exit_code == ExitCode.OK


def _with(event, **changes):
    import msgspec

    return msgspec.structs.replace(event, **changes)


def _removed(pool, h):
    from vllm.distributed.kv_events import BlockRemoved

    return BlockRemoved(block_hashes=[h], medium=pool.medium, group_idx=0)
