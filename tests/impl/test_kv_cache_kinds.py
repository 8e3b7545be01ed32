"""The circular-buffer, R-SWA and sparse MLA kinds through impl's manager
(specs/KV_CACHE_MANAGER.md §9.8-9.10), and their invariants (§13 rule 7),
each rule with the bug it must catch. Expected block ids are derived by hand
from a fresh pool (the free queue hands out 1, 2, 3, ... in order)."""

from __future__ import annotations

import pytest

from impl.block_hash import get_request_block_hasher
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
)
from impl.profiles import get_profile
from impl.request import Request

P32 = get_profile("0.32")


def manager(*specs, num_blocks=24, hash_block_size=2, **kw) -> KVCacheManager:
    groups = tuple(KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs))
    return KVCacheManager(KVCacheConfig(num_blocks, groups), 1 << 12, hash_block_size, P32,
                          enable_kv_cache_events=True, **kw)


def request(rid: str, tokens, hash_block_size=2) -> Request:
    r = Request(rid, list(tokens), len(tokens))
    r.block_hashes = get_request_block_hasher(hash_block_size, "sha256", P32, "0")(r)
    return r


def decode(m: KVCacheManager, r: Request, token: int, checker=None):
    """One decode step: the sampled token joins the request, a slot for it."""
    r.all_token_ids.append(token)
    get_request_block_hasher(2, "sha256", P32, "0").update(r)
    got = m.allocate_slots(r, 1)
    r.num_computed_tokens += 1
    if checker is not None:
        checker.check(m)
    return got


# -- circular buffer ------------------------------------------------------------------------


def test_a_ring_is_one_block_for_the_requests_life():
    m = manager(FullAttentionSpec(2), CircularBufferSpec(4))
    checker = InvariantChecker()
    r = request("r", range(6))
    assert m.get_computed_blocks(r)[1] == 0
    # Full attention cdiv(6, 2) = 3 blocks first, then the ring.
    assert m.allocate_slots(r, 6).get_block_ids() == ([1, 2, 3], [4])
    r.num_computed_tokens = 6
    checker.check(m)
    for t in range(10):
        got = decode(m, r, t, checker)
        assert got is m.empty_kv_cache_blocks or got.get_block_ids()[1] == []
    assert m.get_block_ids("r")[1] == [4]
    ring = m.coordinator.single_type_managers[1]
    assert ring.take_new_block_ids() == [] and not ring.records_new_block_ids
    # Never keyed: no BlockStored names group 1.
    assert all(e.group_idx == 0 for e in m.take_events() if hasattr(e, "group_idx"))
    assert m.block_pool.blocks[4].block_hash is None
    m.free(r)
    checker.check(m)
    assert m.block_pool.get_num_free_blocks() == 23


def test_a_ring_counts_one_block_only_before_the_first_allocation():
    m = manager(FullAttentionSpec(2), CircularBufferSpec(4), num_blocks=5)
    r = request("r", range(6))
    # 3 + 1 blocks needed, 4 free: fits exactly; a 7th token would not.
    assert m.allocate_slots(r, 6) is not None
    r.num_computed_tokens = 6
    assert decode(m, r, 0) is None  # a 4th full-attention block: none left
    ring = m.coordinator.single_type_managers[1]
    assert ring.get_num_blocks_to_allocate("r", 1000, [], 999) == 0
    assert ring.get_num_blocks_to_allocate("new", 1, [], 0) == 1


def test_a_ring_takes_no_part_in_hits_or_the_hash_block():
    m = manager(FullAttentionSpec(2), CircularBufferSpec(8), hash_block_size=2,
                scheduler_block_size=8)
    a = request("a", range(16))
    m.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    b = request("b", [*range(16), 99])
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 16 and blocks.get_block_ids() == ([1, 2, 3, 4, 5, 6, 7, 8], [])


# -- R-SWA --------------------------------------------------------------------------------


def test_rswa_gives_back_the_gap_between_prompt_and_window():
    """Blocks of 2, window 3, a 5-token prompt (blocks 0-2). At n computed
    tokens the gap is table entries [3, max(5, n - 3) // 2)."""
    m = manager(RSWASpec(2, rswa_window=3))
    checker = InvariantChecker()
    r = request("r", range(5))
    assert m.allocate_slots(r, 5).get_block_ids() == ([1, 2, 3],)
    r.num_computed_tokens = 5
    for t in range(5, 11):
        decode(m, r, t, checker)
    # n = 10 before the last step: window start 7, block 3: no gap yet.
    assert 0 not in m.get_block_ids("r")[0]
    decode(m, r, 11, checker)  # n = 11: window start 8, entry 3 (block 4) given back
    assert m.get_block_ids("r")[0] == [1, 2, 3, 0, 5, 6]
    for t in range(12, 16):
        decode(m, r, t, checker)
    assert m.get_block_ids("r")[0][:6] == [1, 2, 3, 0, 0, 0]
    check_invariants(m)


def test_rswa_without_the_prompt_length_gives_back_nothing():
    m = manager(RSWASpec(2, rswa_window=3))
    r = request("r", range(20))
    m.allocate_slots(r, 20)
    rswa = m.coordinator.single_type_managers[0]
    rswa.remove_skipped_blocks("r", 20)
    assert 0 not in m.get_block_ids("r")[0]
    rswa.remove_skipped_blocks("r", 20, num_prompt_tokens=4)
    # Gap [2, 17 // 2 = 8): six blocks, freed newest first.
    assert m.get_block_ids("r")[0] == [1, 2] + [0] * 6 + [9, 10]
    assert [b.block_id for b in m.block_pool.free_block_queue][-6:] == [8, 7, 6, 5, 4, 3]


def test_rswa_is_not_the_full_attention_fast_path():
    """The single full-attention group's shortcut for running requests never
    frees anything: R-SWA must not take it."""
    m = manager(RSWASpec(2, rswa_window=1))
    assert m._plain is None
    plain = manager(FullAttentionSpec(2))
    assert plain._plain is not None


def test_rswa_events_call_it_full_attention():
    m = manager(FullAttentionSpec(2), RSWASpec(2, rswa_window=4))
    r = request("r", range(4))
    m.allocate_slots(r, 4)
    kinds = {(e.group_idx, e.kv_cache_spec_kind) for e in m.take_events()
             if hasattr(e, "kv_cache_spec_kind")}
    assert kinds == {(0, "full_attention"), (1, "full_attention")}


# -- sparse MLA ------------------------------------------------------------------------------


def test_sparse_mla_groups_are_managed_by_their_kind():
    m = manager(MLAAttentionSpec(2), MLAAttentionSpec(2, cache_role="indexer"),
                SlidingWindowMLASpec(2, sliding_window=3))
    managers = [type(x).__name__ for x in m.coordinator.single_type_managers]
    assert managers == ["FullAttentionManager", "FullAttentionManager", "SlidingWindowManager"]
    # Two MLA groups of different roles are different specs: looked up apart.
    assert len(m.coordinator.attention_groups) == 3
    r = request("r", range(7))
    assert m.allocate_slots(r, 7).get_block_ids() == ([1, 2, 3, 4], [5, 6, 7, 8],
                                                      [9, 10, 11, 12])
    labels = {(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
              for e in m.take_events() if hasattr(e, "kv_cache_spec_kind")}
    assert labels == {(0, "mla_attention", None), (1, "mla_attention", None),
                      (2, "sliding_window_mla", 3)}


# -- invariants: each rule catches its bug ---------------------------------------------------


def _ring_with_two_blocks(m):
    ring = m.coordinator.single_type_managers[1]
    ring.req_to_blocks["r"] += m.block_pool.get_new_blocks(1)


def _ring_holding_the_null_block(m):
    ring = m.coordinator.single_type_managers[1]
    block = ring.req_to_blocks["r"][0]
    ring.req_to_blocks["r"][0] = m.block_pool.null_block
    m.block_pool.free_blocks([block])


def _ring_cached(m):
    ring = m.coordinator.single_type_managers[1]
    block = ring.req_to_blocks["r"][0]
    key = b"k" * 32 + (1).to_bytes(4, "big")
    block.block_hash = key
    m.block_pool.cached_block_hash_to_block.insert(key, block)
    m.block_pool.get_new_blocks(0)  # a pool call: the checker looks at what it touched
    m.block_pool.touch([block])
    m.block_pool.free_blocks([block])


def _rswa_prompt_given_back(m):
    rswa = m.coordinator.single_type_managers[0]
    rswa._remove_blocks_in_range("r", 0, 1)


def _rswa_two_gaps(m):
    rswa = m.coordinator.single_type_managers[0]
    rswa._remove_blocks_in_range("r", 3, 4)
    rswa._remove_blocks_in_range("r", 6, 7)


@pytest.mark.parametrize("bug,spec,message", [
    (_ring_with_two_blocks, CircularBufferSpec(4), "a ring is one"),
    (_ring_holding_the_null_block, CircularBufferSpec(4), "null block"),
    (_ring_cached, CircularBufferSpec(4), "is cached"),
    (_rswa_prompt_given_back, RSWASpec(2, rswa_window=3), "prompt's first block"),
    (_rswa_two_gaps, RSWASpec(2, rswa_window=3), "more than one gap"),
])
@pytest.mark.parametrize("incremental", [False, True])
def test_table_rules_catch_their_bug(bug, spec, message, incremental):
    specs = (spec,) if isinstance(spec, RSWASpec) else (FullAttentionSpec(2), spec)
    m = manager(*specs)
    checker = InvariantChecker()
    r = request("r", range(16))
    m.allocate_slots(r, 16)
    checker.check(m)
    check_invariants(m)  # sound before the bug
    bug(m)
    with pytest.raises(InvariantViolation, match=message):
        if incremental:
            checker.check(m)
        else:
            check_invariants(m)
