"""0.32's scheduler-facing extras on impl alone (specs/KV_CACHE_MANAGER.md
section 16), hand-derived: full KV reports, deferred frees and truncation, KV
cache zeroing, the KVCacheBlocks and facade helpers, the public hashing
helpers, replicated attention specs. vLLM's own tests of each run through
`make peer`; the trace-level ones live in the scenario traces."""

from __future__ import annotations

import pytest

from impl.block_hash import (
    RequestBlockHasher,
    generate_block_hash_extra_keys,
    get_hash_fn,
    hash_block_tokens,
    none_hash,
)
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_sizing import MergeError, merge_specs, resolve_dcp_block_size
from impl.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from impl.kv_events import BlockStored
from impl.profiles import get_profile
from impl.request import MMFeature, Request

P = get_profile("0.32")
SHA = get_hash_fn("sha256")
NONE = none_hash(P, "sha256", "0")


def manager(*specs, num_blocks=30, hash_block_size=4, zeroing=False, profile=P, **kwargs):
    groups = tuple(KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs))
    config = KVCacheConfig(num_blocks, groups, needs_kv_cache_zeroing=zeroing)
    return KVCacheManager(config, 4096, hash_block_size, profile, **kwargs)


def request(rid, tokens, **fields):
    r = Request(rid, list(tokens), len(tokens), **fields)
    RequestBlockHasher(4, SHA, NONE, True).update(r)
    return r


def admit(m, r):
    blocks, hit, _ = m.get_computed_blocks(r)
    new = m.allocate_slots(r, r.num_tokens - hit, hit, blocks)
    r.num_computed_tokens = r.num_tokens
    return new


# -- cascade attention's common prefix (profile common_prefix_blocks) -----------------


def test_common_prefix_blocks_are_counted_only_where_cascade_attention_is():
    # "a" holds 13 tokens (4 blocks of 4 in each group), "b" hits a's first
    # two blocks. 0.31 counts them in the full-attention group only; 0.32
    # answers zeros.
    specs = (FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8))
    answers = {}
    for name in ("0.31", "0.32"):
        m = manager(*specs, profile=get_profile(name))
        admit(m, request("a", range(13)))
        admit(m, request("b", [*range(8), 100, 101, 102]))
        answers[name] = m.get_num_common_prefix_blocks("a")
        full = m.coordinator.single_type_managers[0]
        assert full.get_num_common_prefix_blocks("b") == 2
    assert answers == {"0.31": [2, 0], "0.32": [0, 0]}


def test_a_request_not_sharing_the_prefix_ends_the_count():
    # Negative control: a third request holding none of a's blocks means no
    # block is held by every request.
    m = manager(FullAttentionSpec(4), profile=get_profile("0.31"))
    admit(m, request("a", range(13)))
    assert m.get_num_common_prefix_blocks("a") == [4]  # alone: all its blocks
    admit(m, request("b", [*range(8), 100, 101, 102]))
    assert m.get_num_common_prefix_blocks("a") == [2]
    admit(m, request("c", range(200, 205)))
    assert m.get_num_common_prefix_blocks("a") == [0]
    off = manager(FullAttentionSpec(4), profile=get_profile("0.31"), enable_caching=False)
    admit(off, request("a", range(13)))
    assert off.get_num_common_prefix_blocks("a") == [0]  # no prefix caching: zeros


# -- full KV reports ---------------------------------------------------------------------


def test_a_full_report_request_announces_its_hit_again():
    m = manager(FullAttentionSpec(4), enable_kv_cache_events=True)
    admit(m, request("a", range(13)))
    m.take_events()
    quiet = request("b", range(13))
    m.get_computed_blocks(quiet)
    assert m.take_events() == []  # incremental: a hit publishes nothing
    loud = request("c", range(13), kv_cache_report_mode="full", session_id="s")
    blocks, hit, _ = m.get_computed_blocks(loud)
    assert hit == 12
    (event,) = m.take_events()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash is None and event.token_ids == list(range(12))
    assert len(event.block_hashes) == 3 and event.group_idx == 0 and event.session_id == "s"
    assert m.block_pool.get_num_free_blocks() == 29 - 4  # nothing changed hands


def test_the_pool_announces_nothing_without_events_or_blocks():
    m = manager(FullAttentionSpec(4))
    m.block_pool.emit_cached_block_events(request("a", range(8)), 2, 4, 0)
    assert m.take_events() == []
    m = manager(FullAttentionSpec(4), enable_kv_cache_events=True)
    m.block_pool.emit_cached_block_events(request("a", range(8)), 0, 4, 0)
    assert m.take_events() == []


# -- deferred frees and truncation ---------------------------------------------------------


def test_popped_blocks_stay_held_until_the_caller_frees_them():
    m = manager(FullAttentionSpec(4))
    a = request("a", range(10))
    admit(m, a)
    free_before = m.block_pool.get_num_free_blocks()
    popped = m.pop_blocks_for_free(a)
    assert [b.block_id for b in popped] == [1, 2, 3]  # table order
    assert m.get_block_ids("a") == ([],)
    assert m.block_pool.get_num_free_blocks() == free_before  # not released yet
    m.block_pool.free_blocks(reversed(popped))
    check_invariants(m)
    assert m.pop_blocks_for_free(request("never", [1])) == []


def test_truncation_cuts_a_lookup_without_touching_it():
    m = manager(FullAttentionSpec(4))
    admit(m, request("a", range(13)))
    blocks, hit, _ = m.get_computed_blocks(request("b", range(13)))
    refs = [b.ref_cnt for b in blocks.blocks[0]]
    cut = m.truncate_computed_blocks(blocks, 8)
    assert cut.get_block_ids() == ([1, 2],) and len(blocks.blocks[0]) == 3
    assert [b.ref_cnt for b in blocks.blocks[0]] == refs
    with pytest.raises(AssertionError, match="inside"):
        m.truncate_computed_blocks(blocks, 6)
    with pytest.raises(AssertionError, match="past"):
        m.truncate_computed_blocks(blocks, 16)
    assert m.truncate_computed_blocks(blocks, 0) is m.empty_kv_cache_blocks


# -- KV cache zeroing -------------------------------------------------------------------------


def test_new_attention_blocks_are_recorded_for_zeroing_when_asked():
    m = manager(FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=4), zeroing=True)
    a = request("a", range(6))
    admit(m, a)
    assert m.take_new_block_ids() == [1, 2, 3, 4]  # group 0's two, then group 1's
    assert m.take_new_block_ids() == []
    m.record_blocks_for_zeroing("a", 4)
    assert m.take_new_block_ids() == [2, 4]
    with pytest.raises(AssertionError, match="wipe"):
        m.record_blocks_for_zeroing("a", 2)
    plain = manager(FullAttentionSpec(4))
    admit(plain, request("a", range(6)))
    assert plain.take_new_block_ids() == []
    assert not plain.coordinator.single_type_managers[0].records_new_block_ids


def test_blocks_a_load_writes_are_not_zeroed():
    m = manager(FullAttentionSpec(4), FullAttentionSpec(8), zeroing=True)
    r = request("a", range(20))
    m.allocate_slots(r, 4, num_external_computed_tokens=8, skip_zeroing_group_ids=(1,))
    # Group 0: 2 external blocks + 1 new block; group 1: its external block is
    # skipped, its new one recorded.
    assert m.take_new_block_ids() == [1, 2, 4, 5]


def test_state_blocks_are_not_zeroed():
    m = manager(MambaSpec(4, shapes=((1,),), dtype_sizes=(4,)), zeroing=True,
                enable_caching=False)
    admit(m, request("a", range(6)))
    assert m.take_new_block_ids() == []


def test_the_checker_catches_a_bogus_zeroing_id():
    m = manager(FullAttentionSpec(4), zeroing=True)
    checker = InvariantChecker()
    checker.check(m)
    admit(m, request("a", range(6)))
    checker.check(m)
    m.coordinator.single_type_managers[0].new_block_ids.append(0)  # the null block
    with pytest.raises(InvariantViolation, match="zeroing"):
        checker.check(m)


# -- KVCacheBlocks and the facade -----------------------------------------------------------------


def test_kv_cache_blocks_helpers():
    m = manager(FullAttentionSpec(4), FullAttentionSpec(8), hash_block_size=4)
    new = admit(m, request("a", range(9)))
    assert new.get_block_ids(group_ids=[1]) == ([4, 5],)
    assert new.new_empty().get_block_ids(allow_none=True) is None
    assert new.get_unhashed_block_ids_all_groups() == [[3], [5]]  # the partial tails
    assert (new + new).get_block_ids()[1] == [4, 5, 4, 5]
    one = admit(manager(FullAttentionSpec(4)), request("b", range(9)))
    assert one.get_unhashed_block_ids() == [3]
    with pytest.raises(AssertionError):
        new.get_unhashed_block_ids()
    assert m.get_num_common_prefix_blocks("a") == [0, 0]
    assert m.create_kv_cache_blocks(([], [])) is m.empty_kv_cache_blocks
    assert m.get_block_ids_for_computed_tokens("a", 4) == ([1], [4])


def test_a_connector_lookup_reports_full_attention_and_a_lagging_group():
    spec = MambaSpec(8, shapes=((1,),), dtype_sizes=(4,), mamba_cache_mode="align")
    m = manager(FullAttentionSpec(8), spec, hash_block_size=8)
    admit(m, request("a", range(24)))
    m.new_step_starts()
    blocks, hit, boundary, diverged = m.get_computed_blocks_for_connector(
        request("b", range(24)))
    # Full attention hits 16 of the 23 tokens a resend may hit; one 24-token
    # chunk left Mamba only the state at 24, which is too far: Mamba lags
    # (the connector brings that state), so the hit is full attention's and
    # flagged. (vLLM 0.32.0 answers the same: 16, True, ([1, 2], []).)
    assert (hit, boundary, diverged) == (16, 0, True)
    assert blocks.get_block_ids() == ([1, 2], [])
    # A model without Mamba: the plain lookup, never diverged.
    plain = manager(FullAttentionSpec(4))
    admit(plain, request("a", range(9)))
    assert plain.get_computed_blocks_for_connector(request("b", range(9)))[1:] == (8, 0, False)


# -- hashing helpers --------------------------------------------------------------------------


def test_hash_block_tokens_chains_from_none_hash():
    first = hash_block_tokens(SHA, None, [1, 2, 3, 4], none_hash=NONE)
    r = request("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert first == r.block_hashes[0]
    assert hash_block_tokens(SHA, first, (5, 6, 7, 8)) == r.block_hashes[1]
    with pytest.raises(ValueError, match="NONE_HASH"):
        hash_block_tokens(SHA, None, [1, 2, 3, 4])


def test_the_next_multimodal_index_moves_past_items_ending_in_the_block():
    items = (MMFeature("x", 0, 5), MMFeature("y", 10, 5))
    r = Request("a", [0] * 20, 20, mm_features=items)
    assert generate_block_hash_extra_keys(r, 0, 5, 0) == ((("mm", "x", 0),), 1)
    assert generate_block_hash_extra_keys(r, 3, 8, 0)[1] == 1
    assert generate_block_hash_extra_keys(r, 6, 10, 0) == (None, 1)
    assert generate_block_hash_extra_keys(r, 0, 15, 0)[1] == 2
    assert generate_block_hash_extra_keys(r, 16, 20, 1) == (None, 1)  # all behind: as given
    assert generate_block_hash_extra_keys(r, 10, 12, -1)[1] == 1  # from the last item
    assert generate_block_hash_extra_keys(Request("b", [0] * 4, 4), 0, 4, 0) == (None, 0)


# -- replicated attention --------------------------------------------------------------------


def test_a_replicated_group_keeps_its_block_size_under_dcp():
    draft = FullAttentionSpec(4, dcp_sharded=False)
    m = manager(FullAttentionSpec(4), draft, hash_block_size=4, dcp_world_size=2,
                scheduler_block_size=8)
    target, replicated = m.coordinator.single_type_managers
    assert (target.block_size, replicated.block_size) == (8, 4)
    assert m.coordinator.group_block_sizes == (8, 4)
    assert resolve_dcp_block_size(draft, 2) == 4
    new = admit(m, request("a", range(17)))
    assert [len(g) for g in new.blocks] == [3, 5]


def test_sharded_and_replicated_layers_do_not_merge():
    spec = MLAAttentionSpec(4)
    assert merge_specs([spec, spec]) == spec
    with pytest.raises(AssertionError):
        merge_specs([spec, MLAAttentionSpec(4, dcp_sharded=False)])
    with pytest.raises(MergeError):  # still a MergeError for the grouping code
        merge_specs([FullAttentionSpec(4), FullAttentionSpec(4, dcp_sharded=False)])


def test_a_hybrid_under_context_parallelism_takes_only_replicated_windows():
    window = SlidingWindowSpec(4, sliding_window=8)
    with pytest.raises(AssertionError, match="decode context parallelism"):
        manager(FullAttentionSpec(4), window, dcp_world_size=2, scheduler_block_size=8)
    replicated = SlidingWindowSpec(4, sliding_window=8, dcp_sharded=False)
    manager(FullAttentionSpec(4), replicated, dcp_world_size=2, scheduler_block_size=8)


def test_a_lone_replicated_window_under_pcp_is_refused_at_lookup():
    # One group is looked up with the process's PCP size (as vLLM does), and
    # a sliding window cannot be split across prefill ranks.
    m = manager(SlidingWindowSpec(4, sliding_window=8, dcp_sharded=False), pcp_world_size=2)
    with pytest.raises(AssertionError, match="context-parallel"):
        m.get_computed_blocks(request("a", range(9)))
