"""The invariant checker must catch each kind of corruption it claims to."""

import pytest

from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from impl.profiles import get_profile
from impl.request import Request

P = get_profile("0.32")


def manager_with_two_requests():
    cfg = KVCacheConfig(10, (KVCacheGroupSpec(("l",), FullAttentionSpec(4)),))
    m = KVCacheManager(cfg, 1000, 4, P)
    hasher = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(P, "sha256", "0"), True)
    reqs = []
    for rid in ("a", "b"):
        r = Request(rid, list(range(9)), 9)
        hasher.update(r)
        blocks, hit, _ = m.get_computed_blocks(r)
        m.allocate_slots(r, 9 - hit, hit, blocks)
        r.num_computed_tokens = 9
        reqs.append(r)
    return m, reqs


def test_a_consistent_manager_passes():
    m, _ = manager_with_two_requests()
    check_invariants(m)
    InvariantChecker().check(m)


def test_ref_count_mismatch():
    m, _ = manager_with_two_requests()
    m.block_pool.blocks[1].ref_cnt += 1
    with pytest.raises(InvariantViolation, match="ref_cnt 3 but 2 request"):
        check_invariants(m)


def test_held_block_left_in_free_queue():
    m, _ = manager_with_two_requests()
    block = m.block_pool.blocks[3]  # a's private third block
    m.block_pool.free_block_queue.append(block)
    with pytest.raises(InvariantViolation, match="in the free queue"):
        check_invariants(m)


def test_hash_map_pointing_at_a_block_without_that_hash():
    m, _ = manager_with_two_requests()
    m.block_pool.blocks[2].block_hash = None
    with pytest.raises(InvariantViolation, match="points at block 2"):
        check_invariants(m)


def test_broken_free_queue_link():
    m, _ = manager_with_two_requests()
    q = m.block_pool.free_block_queue
    q.fake_free_list_head.next_free_block.prev_free_block = None
    with pytest.raises(InvariantViolation, match="back-link"):
        check_invariants(m)


def test_negative_ref_count():
    m, _ = manager_with_two_requests()
    m.block_pool.blocks[9].ref_cnt = -1
    with pytest.raises(InvariantViolation):
        check_invariants(m)


def test_sharing_without_a_prefix_hit():
    m, _ = manager_with_two_requests()
    checker = InvariantChecker()
    checker.check(m)
    # Hand a's uncached partial block to b behind the manager's back.
    block = m.coordinator.single_type_managers[0].req_to_blocks["a"][2]
    assert block.block_hash is None
    block.ref_cnt += 1
    m.coordinator.single_type_managers[0].req_to_blocks["b"].append(block)
    with pytest.raises(InvariantViolation, match="shared without a prefix hit"):
        checker.check(m)


def test_hash_evicted_after_a_legitimate_hit_is_fine():
    m, _ = manager_with_two_requests()
    checker = InvariantChecker()
    checker.check(m)
    m.evict_blocks([1, 2])  # shared by a and b through b's hit
    checker.check(m)


# -- the checker, incrementally: faults injected into impl's operations ---------


def watched():
    """A manager with two requests sharing a prefix, and a checker that has
    taken its first (full) look: later checks are incremental."""
    m, reqs = manager_with_two_requests()
    checker = InvariantChecker()
    checker.check(m)
    return m, reqs, checker


def admit(m, rid, tokens):
    hasher = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(P, "sha256", "0"), True)
    r = Request(rid, list(tokens), len(tokens))
    hasher.update(r)
    blocks, hit, _ = m.get_computed_blocks(r)
    m.allocate_slots(r, len(tokens) - hit, hit, blocks)
    r.num_computed_tokens = len(tokens)
    return r


def test_incremental_checks_pass_on_legitimate_calls():
    m, (a, b), checker = watched()
    m.free(a)
    checker.check(m)
    admit(m, "c", range(9))  # hits the freed cached blocks
    checker.check(m)
    m.evict_blocks([1])
    checker.check(m)
    m.free(b)
    checker.check(m)
    assert m.reset_prefix_cache() is False  # c holds blocks
    m.free(Request("c", [], 0))
    checker.check(m)
    assert m.reset_prefix_cache() is True
    checker.check(m)
    admit(m, "d", range(20))
    checker.check(m)


# Faults in impl's operations, each with the call that makes it show and what
# the incremental check must then say. A fault is (class, method, a factory
# taking the real method and the manager, returning the faulty one).


def _touch_keeps_free(real, m):
    def touch(self, blocks):
        for block in blocks:
            block.ref_cnt += 1
    return touch


def _free_drops_two(real, m):
    def free_blocks(self, blocks):
        blocks = list(blocks)
        for block in blocks:
            block.ref_cnt -= 1
        real(self, blocks)
    return free_blocks


def _allocate_without_reference(real, m):
    def get_new_blocks(self, n):
        got = real(self, n)
        for block in got:
            block.ref_cnt -= 1
        return got
    return get_new_blocks


def _evict_leaves_entry(real, m):
    def detach(self, block):
        gone = [block.block_hash] if block.block_hash is not None else []
        block.block_hash = block.block_hash_num_tokens = None
        return gone
    return detach


def _key_outside_the_map(real, m):
    return lambda self, key, block: None


def _release_without_back_links(real, m):
    def splice(self, after, blocks, before):
        for block in blocks:
            after.next_free_block = block
            block.prev_free_block = None  # the fault
            after = block
            self.num_free_blocks += 1
        after.next_free_block = before
        before.prev_free_block = after
    return splice


def _allocate_a_held_block(real, m):
    victim = m.coordinator.single_type_managers[0].req_to_blocks["a"][2]  # unkeyed

    def allocate_new_blocks(self, request_id, num_tokens, main=0):
        got = real(self, request_id, num_tokens, main)
        if request_id == "c":
            victim.ref_cnt += 1
            self.req_to_blocks[request_id].append(victim)
        return got
    return allocate_new_blocks


def _free_both(m, reqs):
    for r in reqs:
        m.free(r)


INCREMENTAL_FAULTS = {
    # a hit on a freed cached block leaves it queued
    "touch": ("impl.block_pool:BlockPool.touch", _touch_keeps_free,
              lambda m, reqs: (_free_both(m, reqs), admit(m, "c", range(9))),
              "in the free queue"),
    "free": ("impl.block_pool:BlockPool.free_blocks", _free_drops_two,
             lambda m, reqs: m.free(reqs[0]), "ref_cnt"),
    "allocate": ("impl.block_pool:BlockPool.get_new_blocks", _allocate_without_reference,
                 lambda m, reqs: admit(m, "c", [7] * 5), "ref_cnt=0 but not in the free queue"),
    "evict": ("impl.block_pool:BlockPool._detach_all", _evict_leaves_entry,
              lambda m, reqs: m.evict_blocks([2]), "points at block 2"),
    "key": ("impl.block_hash_map:BlockHashToBlockMap.insert", _key_outside_the_map,
            lambda m, reqs: admit(m, "c", [5] * 9), "not in the map"),
    # a's private block is unkeyed (0.32 puts it at the front); the shared
    # ones stay held.
    "link": ("impl.free_queue:FreeKVCacheBlockQueue._splice", _release_without_back_links,
             lambda m, reqs: m.free(reqs[0]), "link"),
    "share": ("impl.managers.base:SingleTypeKVCacheManager.allocate_new_blocks",
              _allocate_a_held_block, lambda m, reqs: admit(m, "c", [3] * 5),
              "shared without a prefix hit"),
}


@pytest.mark.parametrize("fault", sorted(INCREMENTAL_FAULTS))
def test_incremental_check_catches_a_fault_in_an_operation(monkeypatch, fault):
    import importlib

    target, make, call, message = INCREMENTAL_FAULTS[fault]
    module, _, attr = target.partition(":")
    owner, method = attr.split(".")
    cls = getattr(importlib.import_module(module), owner)
    m, reqs, checker = watched()
    monkeypatch.setattr(cls, method, make(getattr(cls, method), m))
    call(m, reqs)
    with pytest.raises(InvariantViolation, match=message):
        checker.check(m)


def test_check_cost_follows_the_blocks_touched_not_the_pool(monkeypatch):
    """The same calls on a pool 100x larger examine exactly as many blocks."""
    examined = []
    real = InvariantChecker._check_block

    def counting(self, block, before):
        examined.append(block.block_id)
        real(self, block, before)

    monkeypatch.setattr(InvariantChecker, "_check_block", counting)
    counts = []
    for num_blocks in (64, 6400):
        cfg = KVCacheConfig(num_blocks, (KVCacheGroupSpec(("l",), FullAttentionSpec(4)),))
        m = KVCacheManager(cfg, 1000, 4, P)
        checker = InvariantChecker()
        checker.check(m)
        examined.clear()
        reqs = [admit(m, f"r{i}", [i % 3] * 13) for i in range(6)]
        checker.check(m)
        for r in reqs:
            m.free(r)
            checker.check(m)
        counts.append(len(examined))
    assert counts[0] == counts[1] > 0


# -- no false alarm where vLLM agrees (issue 15, 7a) -------------------------------

FULL_AND_MAMBA = dict(groups=(("full_attention", 4), ("mamba", 4)))


def _events_hit_inside_a_running_block():
    """b's hit (10 tokens, hashed every 2) ends inside a's live last block in
    both groups; b's copies stay unkeyed after its first allocation."""
    from harness.core.events import AddRequest, Allocate, Free, Lookup, Step, TakeBlockCopies

    prompt = list(range(11))
    step = [Step(), TakeBlockCopies()]
    return 2, [AddRequest("a", prompt), Lookup("a"), Allocate("a", 8), *step,
               Allocate("a", 2), *step,
               AddRequest("b", prompt + [50, 51]), Lookup("b"), Allocate("b", 1), *step,
               Allocate("a", 1), *step, Free("a"), Free("b")]


def _events_own_block_after_preemption():
    """Found by the fuzzer: a preempted request hits its own partial state
    (hashed every token) and gets copies of it."""
    from harness.core.events import (
        AddRequest,
        Allocate,
        Lookup,
        Preempt,
        RecordStats,
        Step,
        TakeBlockCopies,
    )

    return 1, [AddRequest("r0", [0] * 10), Lookup("r0"), Allocate("r0", 8),
               RecordStats("r0", 0), Allocate("r0", 1), Preempt("r0"), TakeBlockCopies(),
               Step(), Lookup("r0"), Allocate("r0", 1), Step(), TakeBlockCopies()]


def _run_both(unit, events, corrupt=None):
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.vllm_backend import VllmBackend
    from harness.core.cache_config import CacheConfig, GroupConfig

    config = CacheConfig(num_blocks=16, groups=(GroupConfig(4), GroupConfig(4, "mamba")),
                         prefix_match_unit=unit)
    ref, mine = VllmBackend(config, P), ImplBackend(config, P, check=True)
    answers = []
    for i, event in enumerate(events):
        want = ref.run(event)
        if corrupt is not None and i == len(events) - 1:
            corrupt(mine.manager)
        got = mine.run(event)
        assert got == want, f"event {i} {event}"
        answers.append(got)
    return answers


@pytest.mark.vllm
@pytest.mark.parametrize("scenario", [_events_hit_inside_a_running_block,
                                      _events_own_block_after_preemption])
def test_copy_on_write_states_are_no_violation(scenario):
    unit, events = scenario()
    answers = _run_both(unit, events)
    hits = [a["hit_tokens"] for e, a in zip(events, answers) if e.kind == "lookup"]
    copies = [c for e, a in zip(events, answers) if e.kind == "take_block_copies"
              for c in a["copies"]]
    assert any(h % 4 for h in hits) and copies  # a hit inside a block, and its copies


@pytest.mark.vllm
def test_a_copy_handed_to_another_request_is_still_caught():
    """Negative control in the same state: b's unkeyed copy (held by b and
    its pending pair) also put in a third table behind the manager's back."""
    from harness.core.events import Step

    unit, events = _events_hit_inside_a_running_block()
    cut = [i for i, e in enumerate(events) if e.kind == "allocate"][2] + 1  # after b's

    def corrupt(manager):
        full = manager.coordinator.single_type_managers[0]
        copy = full._copies[0][1]
        assert copy.block_hash is None and copy in full.req_to_blocks["b"]
        copy.ref_cnt += 1
        full.req_to_blocks["a"].append(copy)

    with pytest.raises(InvariantViolation, match="shared without a prefix hit"):
        _run_both(unit, events[:cut] + [Step()], corrupt)
