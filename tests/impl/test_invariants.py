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
        blocks, hit = m.get_computed_blocks(r)
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
