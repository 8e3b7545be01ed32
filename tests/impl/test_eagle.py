"""EAGLE / MTP draft groups on impl alone (specs/KV_CACHE_MANAGER.md section 15),
with hand-derived expectations; the live differential checks are the scenario
traces (tests/impl/test_kv_cache_manager.py) and tests/harness/test_eagle_live.py."""

from __future__ import annotations

import dataclasses

import pytest

from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.eagle import (
    UnsupportedByProfile,
    draft_group_ids,
    dropping_group_ids,
    eagle_proof_margin,
    uses_trailing_draft_layers,
)
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_planning import KVCachePlanningConfig
from impl.kv_cache_sizing import groups_are_packed
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from impl.profiles import EagleDropGroups, TrailingDraftLayers, get_profile
from impl.request import Request

P32, P17 = get_profile("0.32"), get_profile("0.17")
# The 0.33 rule, on an otherwise 0.32 profile (the profiles branch writes 0.33's).
P33_RULE = dataclasses.replace(P32, eagle_drop_groups=EagleDropGroups.FLAGGED_IF_USE_EAGLE)


def group(spec, draft=False):
    return KVCacheGroupSpec(("layer",), spec, is_eagle_group=draft)


def manager(groups, num_blocks=40, hash_block_size=None, profile=P32, **kwargs):
    hash_block_size = hash_block_size or min(g.kv_cache_spec.block_size for g in groups)
    config = KVCacheConfig(num_blocks, tuple(groups))
    return KVCacheManager(config, 8192, hash_block_size, profile, **kwargs)


def request(m: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    r = Request(rid, list(tokens), len(tokens))
    RequestBlockHasher(m.hash_block_size, get_hash_fn("sha256"),
                       none_hash(m.profile, "sha256", "0"), True).update(r)
    return r


def run(m: KVCacheManager, r: Request) -> int:
    """Look the request up, allocate its whole prompt; the hit in tokens."""
    blocks, hit, _ = m.get_computed_blocks(r)
    assert m.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None
    r.num_computed_tokens = r.num_tokens
    return hit


def prompt(n_blocks: int, block_size: int, tail: int = 0) -> list[int]:
    return [i for i in range(n_blocks) for _ in range(block_size)] + [99] * tail


# -- which groups drop -------------------------------------------------------------


def test_the_flagged_groups_are_the_draft_groups_or_all_of_them_with_use_eagle():
    groups = [group(FullAttentionSpec(4)), group(SlidingWindowSpec(4, sliding_window=4), True)]
    assert draft_group_ids(groups, use_eagle=False) == {1}
    assert draft_group_ids(groups, use_eagle=True) == {1}
    unflagged = [group(FullAttentionSpec(4)), group(FullAttentionSpec(8))]
    assert draft_group_ids(unflagged, use_eagle=True) == {0, 1}
    assert draft_group_ids(unflagged, use_eagle=False) == set()


@pytest.mark.parametrize("profile,use_eagle,drops", [
    (P32, True, {1}), (P32, False, {1}),  # 0.32: a flag drops even without use_eagle
    (P33_RULE, True, {1}), (P33_RULE, False, set()),  # 0.33: only with use_eagle
])
def test_which_draft_groups_drop_follows_the_profile(profile, use_eagle, drops):
    assert dropping_group_ids({1}, use_eagle, profile) == drops


def test_a_profile_without_the_rule_refuses_eagle_for_a_hybrid_model():
    assert dropping_group_ids(set(), False, P17) == set()
    with pytest.raises(UnsupportedByProfile, match="0.17"):
        manager([group(FullAttentionSpec(4)), group(FullAttentionSpec(8))], profile=P17,
                use_eagle=True)


def test_a_profile_without_the_rule_still_drops_for_one_group():
    # Every release's unitary coordinator drops its one group's last block.
    assert dropping_group_ids({0}, True, P17, num_groups=1) == {0}
    m = manager([group(FullAttentionSpec(4))], profile=P17, use_eagle=True)
    run(m, request(m, "a", prompt(3, 4, tail=1)))
    m.free(request(m, "a", []))
    assert m.get_computed_blocks(request(m, "b", prompt(3, 4, tail=2)))[1] == 8


def test_the_proof_margin_is_a_hash_block_only_for_fine_grained_lookups():
    assert eagle_proof_margin(16, 4, fine_grained=True) == 4
    assert eagle_proof_margin(16, 4, fine_grained=False) == 16
    assert eagle_proof_margin(4, 4, fine_grained=True) == 4


# -- lookups ------------------------------------------------------------------------------


def test_one_group_drops_the_last_matched_block():
    m = manager([group(FullAttentionSpec(4))], use_eagle=True)
    run(m, request(m, "a", prompt(3, 4, tail=1)))  # 13 tokens: 3 full blocks cached
    m.free(request(m, "a", []))
    # 14 tokens may hit 13 (3 blocks); EAGLE gives the third one back.
    assert m.get_computed_blocks(request(m, "b", prompt(3, 4, tail=2)))[1] == 8
    # Without EAGLE the same lookup hits all three.
    plain = manager([group(FullAttentionSpec(4))])
    run(plain, request(plain, "a", prompt(3, 4, tail=1)))
    assert plain.get_computed_blocks(request(plain, "b", prompt(3, 4, tail=2)))[1] == 12


def test_a_one_block_hit_is_no_hit_with_eagle():
    m = manager([group(FullAttentionSpec(4))], use_eagle=True)
    run(m, request(m, "a", prompt(2, 4)))
    assert m.get_computed_blocks(request(m, "b", prompt(1, 4, tail=1)))[1] == 0


def test_a_sliding_window_needs_one_block_more_and_drops_it():
    spec = SlidingWindowSpec(4, sliding_window=4)  # needs 1 block before a hit's end
    m = manager([group(spec)], use_eagle=True)
    run(m, request(m, "a", prompt(5, 4, tail=1)))  # 21 tokens, 5 blocks cached
    blocks, hit, _ = m.get_computed_blocks(request(m, "b", prompt(5, 4, tail=1)))
    # Max hit 20 tokens = 5 blocks, all cached: the 2-block run ending at
    # block 4 matches, block 4 is dropped: nulls for blocks 0..2, then block 3.
    assert hit == 16
    assert [b.is_null for b in blocks.blocks[0]] == [True, True, True, False]
    # Block 3 gone from the cache: the next run of 2 is blocks 1-2, minus 2.
    m.block_pool.evict_blocks([blocks.blocks[0][-1].block_id])
    assert m.get_computed_blocks(request(m, "c", prompt(5, 4, tail=1)))[1] == 8


def test_chunked_local_attention_refuses_to_drop():
    m = manager([group(ChunkedLocalAttentionSpec(4, attention_chunk_size=8))], use_eagle=True)
    with pytest.raises(AssertionError, match="chunked local attention"):
        m.get_computed_blocks(request(m, "b", prompt(3, 4, tail=1)))


def gemma_with_drafting_window(**kwargs):
    return manager([group(FullAttentionSpec(8)),
                    group(SlidingWindowSpec(4, sliding_window=4), draft=True)],
                   hash_block_size=4, use_eagle=True, **kwargs)


def test_a_hybrid_draft_group_looks_one_unit_further_and_lands_on_the_agreed_length():
    m = gemma_with_drafting_window()
    run(m, request(m, "a", prompt(5, 4, tail=1)))  # 21 tokens
    blocks, hit, _ = m.get_computed_blocks(request(m, "b", prompt(5, 4, tail=2)))
    # Full attention (no draft) hits 16 of the 21 the request may hit; the
    # window group looks to 16 + 4 = 20, matches blocks 3 and 4 and drops 4.
    assert hit == 16
    full, window = blocks.blocks
    assert len(full) == 2 and len(window) == 4 and not window[3].is_null


def test_without_the_proof_margin_the_hybrid_hit_would_shrink(monkeypatch):
    from impl.coordinator import HybridKVCacheCoordinator

    m = gemma_with_drafting_window()
    run(m, request(m, "a", prompt(5, 4, tail=1)))
    monkeypatch.setattr(HybridKVCacheCoordinator, "_margin", lambda self, batch: 0)
    # Negative control: the drop then lands one block short of the boundary,
    # so the agreed hit falls to the previous boundary.
    assert m.get_computed_blocks(request(m, "b", prompt(5, 4, tail=2)))[1] == 8


def test_a_dropping_group_keys_one_block_past_the_aligned_boundary():
    m = gemma_with_drafting_window()
    coordinator = m.coordinator
    # Scheduler block 8: full attention keys up to 16 of 21 tokens, the
    # drafting window one of its blocks further.
    assert coordinator.get_num_cacheable_tokens(21, 0) == 16
    assert coordinator.get_num_cacheable_tokens(21, 1) == 20
    assert coordinator.get_num_cacheable_tokens(19, 1) == 19
    assert coordinator.get_num_cacheable_tokens(7, 1) == 0  # nothing aligned yet


def test_groups_looked_up_together_drop_together():
    spec = SlidingWindowSpec(4, sliding_window=4)
    m = manager([group(FullAttentionSpec(8)), group(spec), group(spec, draft=True)],
                hash_block_size=4, use_eagle=True)
    managers = m.coordinator.single_type_managers
    assert [x.use_eagle for x in managers] == [False, True, True]
    assert m.coordinator.drop_eagle_group_ids == {2}


def test_the_facade_keeps_use_eagle_as_given():
    m = manager([group(FullAttentionSpec(4)), group(FullAttentionSpec(4), draft=True)])
    assert m.use_eagle is False and m.coordinator.drop_eagle_group_ids == {1}


# -- prefill lookahead ---------------------------------------------------------------------


def test_prefill_lookahead_keeps_the_rewritten_tokens_uncached():
    m = manager([group(FullAttentionSpec(4))], use_eagle=True, num_prefill_lookahead=3)
    a = request(m, "a", prompt(3, 4, tail=1))  # 13 tokens
    run(m, a)
    # 13 - (3 - 1) = 11 final tokens: 2 full blocks keyed, not 3.
    assert m.coordinator.single_type_managers[0].num_cached_block["a"] == 2
    m.cache_blocks(a, 14)
    assert m.coordinator.single_type_managers[0].num_cached_block["a"] == 3


def test_prefill_lookahead_longer_than_a_scheduler_block_is_refused_with_drafts():
    with pytest.raises(ValueError, match="scheduler blocks of at least"):
        manager([group(FullAttentionSpec(4))], use_eagle=True, num_prefill_lookahead=5)
    # Without a draft group, or without caching, nothing is dropped: accepted.
    manager([group(FullAttentionSpec(4))], num_prefill_lookahead=5)
    manager([group(FullAttentionSpec(4))], use_eagle=True, num_prefill_lookahead=5,
            enable_caching=False)


# -- invariants ------------------------------------------------------------------------------


def test_the_checker_knows_eagle_states_and_catches_a_split_batch():
    spec = SlidingWindowSpec(4, sliding_window=4)
    m = manager([group(FullAttentionSpec(8)), group(spec), group(spec, draft=True)],
                hash_block_size=4, use_eagle=True)
    checker = InvariantChecker()
    checker.check(m)
    run(m, request(m, "a", prompt(5, 4, tail=1)))
    checker.check(m)
    # Negative control: one group of a batch stops dropping.
    m.coordinator.single_type_managers[1].use_eagle = False
    with pytest.raises(InvariantViolation, match="disagree"):
        checker.check(m)
    with pytest.raises(InvariantViolation, match="disagree"):
        check_invariants(m)


def test_the_checker_catches_a_non_draft_group_dropping():
    m = manager([group(FullAttentionSpec(4)), group(FullAttentionSpec(8), draft=True)],
                hash_block_size=4)
    check_invariants(m)
    m.coordinator.drop_eagle_group_ids.add(0)
    with pytest.raises(InvariantViolation, match="no draft group"):
        check_invariants(m)


def test_before_0_32_the_proof_margin_stops_at_the_lookups_bound():
    """eagle_margin_to_hashed_tokens: a 16-token request may hit 15 tokens
    and hashes 16. Full attention hits 12; the drafting window looks one
    block further: to 16 (the hashed tokens, 0.32), matches blocks 2-3 and
    drops 3, landing on 12; or only to 15 (0.31), so it matches blocks 1-2,
    drops 2 and the agreed hit falls to 8."""
    groups = [group(FullAttentionSpec(4)), group(SlidingWindowSpec(4, sliding_window=4), True)]
    hits = {}
    for profile in (P32, get_profile("0.31")):
        m = manager(groups, profile=profile, use_eagle=True)
        run(m, request(m, "a", prompt(5, 4, tail=1)))
        hits[profile.name] = m.get_computed_blocks(request(m, "b", prompt(4, 4)))[1]
    assert hits == {"0.32": 12, "0.31": 8}


@pytest.mark.parametrize("release, draft_blocks", [("0.29", 3), ("0.28", 4)])
def test_which_full_attention_batches_are_cut_to_the_agreed_hit(release, draft_blocks):
    # A target's full attention, a drafter's full attention of another shape
    # (a spec batch of its own) and a window of one block, blocks of 4. The
    # window's block 3 is evicted, so after the drafter's drop (16) the
    # window agrees on 12. From 0.29 every full-attention batch is cut to it;
    # before, only the first: the drafter keeps the 4 blocks its one lookup
    # found (hybrid_trims_every_full_attention_batch).
    m = manager([group(FullAttentionSpec(4)), group(FullAttentionSpec(4, head_size=2), draft=True),
                 group(SlidingWindowSpec(4, sliding_window=4))], profile=get_profile(release))
    run(m, request(m, "a", prompt(5, 4, tail=1)))  # 21 tokens: blocks 0-4 keyed
    window = m.coordinator.single_type_managers[2]
    m.free(request(m, "a", prompt(5, 4, tail=1)))
    evicted = window.block_pool.get_cached_block(
        request(m, "x", prompt(5, 4, tail=1)).block_hashes[3], [2])
    assert evicted is not None and window.block_pool.evict_cached_block(evicted[0])
    blocks, hit, _ = m.get_computed_blocks(request(m, "b", prompt(5, 4, tail=2)))
    assert hit == 12
    target, draft, _ = blocks.blocks
    assert (len(target), len(draft)) == (3, draft_blocks)


@pytest.mark.parametrize("rule, method, model_type, found", [
    (TrailingDraftLayers.MTP_OR_DEEPSEEK_V4, "mtp", "other", True),
    (TrailingDraftLayers.MTP_OR_DEEPSEEK_V4, "dspark", "deepseek_v41", True),
    (TrailingDraftLayers.MTP_OR_DEEPSEEK_V4, "eagle", "other", False),
    # 0.30: the model type alone decides.
    (TrailingDraftLayers.DEEPSEEK_V4_PACKED, "mtp", "other", False),
    (TrailingDraftLayers.DEEPSEEK_V4_PACKED, "dspark", "deepseek_v4", True),
])
def test_which_drafters_are_found_by_their_last_layer(rule, method, model_type, found):
    assert uses_trailing_draft_layers(method, model_type, rule) is found


@pytest.mark.parametrize("rule, flagged", [
    (TrailingDraftLayers.MTP_OR_DEEPSEEK_V4, [False, True]),
    # 0.30 finds the last layer's group only on the packed path; these specs
    # take the uniform-page path.
    (TrailingDraftLayers.DEEPSEEK_V4_PACKED, [False, False]),
])
def test_the_trailing_rule_follows_the_grouping_path(rule, flagged):
    specs = {"full": FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64,
                                       dtype_size=2),
             "window": SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64,
                                         dtype_size=2, sliding_window=32)}
    cfg = KVCachePlanningConfig(max_model_len=64, flags_draft_groups=True,
                                draft_layers_trailing=True, trailing_rule=rule)
    assert not groups_are_packed(specs, cfg.kv_cache_layout)
    groups = cfg.groups(dict(specs))
    assert [g.layer_names for g in groups] == [("full",), ("window",)]
    assert [g.is_eagle_group for g in groups] == flagged
