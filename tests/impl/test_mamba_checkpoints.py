"""Mamba "align" with speculative blocks, prefill checkpoint blocks and
boundary-state hand-offs (specs/KV_CACHE_MANAGER.md §9.4.1-9.4.3), on impl
alone; every expectation is derived by hand from the spec. vLLM's own tests of
these run on impl through `make peer`; live differential runs are the fuzz
templates mamba_speculative / mamba_checkpoints (tests/harness/test_kinds_live.py)."""

from __future__ import annotations

import pytest

from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.block_pool import BlockPool
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_sizing import max_memory_usage_bytes
from impl.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from impl.mamba_checkpoint import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from impl.managers.mamba import MambaManager
from impl.profiles import get_profile
from impl.request import Request

P32, P17 = get_profile("0.32"), get_profile("0.17")
P30, P31 = get_profile("0.30"), get_profile("0.31")


def mamba(block_size, **kw):
    return MambaSpec(block_size, shapes=((1,),), dtype_sizes=(4,), mamba_cache_mode="align",
                     **kw)


class Run:
    """A manager over `specs`, requests hashed every `hbs` tokens, and the
    invariant checker after every call."""

    def __init__(self, specs, hbs, num_blocks=64, profile=P32, caching=True, **kw):
        cfg = KVCacheConfig(num_blocks, tuple(
            KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs)),
            prefix_cache_retention_interval=kw.pop("retention", None))
        self.m = KVCacheManager(cfg, 1 << 16, hbs, profile, enable_caching=caching,
                                enable_kv_cache_events=True, **kw)
        self.hasher = RequestBlockHasher(hbs, get_hash_fn("sha256"),
                                         none_hash(profile, "sha256", "0"), True)
        self.checker = InvariantChecker()

    def request(self, rid, n):
        r = Request(rid, list(range(n)), n)
        self.hasher.update(r)
        return r

    def allocate(self, r, n, hit=0, blocks=None):
        new = self.m.allocate_slots(r, n, hit, blocks)
        if new is not None:
            r.num_computed_tokens += hit + n
        self.checker.check(self.m)
        return new

    def table(self, rid, group=-1):
        return [b.block_id for b in self.m.coordinator.single_type_managers[group]
                .req_to_blocks[rid]]

    def cached(self, r, tokens, group):
        return self.m.block_pool.get_cached_block(
            r.block_hashes[tokens // self.hasher.hash_block_size - 1], [group])


# -- checkpoint position and validity (§9.4.2) -------------------------------------------


def test_checkpoint_position_leaves_a_token_or_eagles_unit_to_recompute():
    assert get_mamba_prefill_checkpoint_position(120, 16, False) == 112
    assert get_mamba_prefill_checkpoint_position(128, 16, False) == 112  # 127 -> 112
    assert get_mamba_prefill_checkpoint_position(128, 16, True) == 112  # 128 - 16
    assert get_mamba_prefill_checkpoint_position(130, 16, True) == 112
    assert get_mamba_prefill_checkpoint_position(10, 16, False) == 0
    assert get_mamba_prefill_checkpoint_position(16, 16, True) == 0


@pytest.mark.parametrize("start,end,position,alignment,valid", [
    (0, 100, 96, 16, True),     # column 0 right of the initial column -1
    (0, 100, 88, 16, False),    # 88 is not on the 16-token export grid
    (0, 100, 96, None, False),  # the backend cannot export
    (8, 100, 96, 16, False),    # starts in column 0, writes column 0
    (0, 100, 100, 16, False),   # the position must be inside the query
    (0, 130, 4, 4, False),      # at least a hash block (8) after the start
])
def test_checkpoint_validity(start, end, position, alignment, valid):
    assert is_mamba_prefill_checkpoint_valid(start, end, position, 8, 64, alignment) is valid


def test_a_non_positive_alignment_is_refused():
    with pytest.raises(AssertionError):
        is_mamba_prefill_checkpoint_valid(0, 100, 96, 8, 64, 0)


# -- speculative blocks in "align" mode (§9.4.1) --------------------------------------------


def test_speculative_blocks_follow_the_running_state():
    run = Run([mamba(4, num_speculative_blocks=2)], 4)
    r = run.request("r", 40)
    first = run.allocate(r, 8).get_block_ids()[0]
    # cdiv(8, 4) + 2 = 4 entries: a null, the running state (8 tokens), 2 scratch.
    a, b, c = first[1:]
    assert first == [0, a, b, c] and run.table("r") == [0, a, b, c]
    # 16 tokens: 6 entries, the running state at index 3. Scratch at index 2
    # lies before it and moves to the end; scratch c at index 3 becomes the
    # running block; one new scratch block d.
    new = run.allocate(r, 8).get_block_ids()[0]
    d = new[-1]
    assert run.table("r") == [0, a, 0, c, b, d] and new == [b, d]


def test_a_shared_scratch_block_is_not_moved():
    pool = BlockPool(8, True, 4, profile=P32)
    manager = MambaManager(mamba(4, num_speculative_blocks=1), pool, True, 0, 4)
    own, shared = pool.get_new_blocks(2)
    table = [own]
    manager.relocate_speculative_block(table, 0)
    assert table == [pool.null_block, own] and own.ref_cnt == 1
    pool.touch([shared])
    with pytest.raises(AssertionError, match="exclusively owned and unhashed"):
        manager.relocate_speculative_block([shared], 0)


@pytest.mark.parametrize("profile,released", [(P32, True), (P17, False)])
def test_0_17_releases_a_speculative_block_late(profile, released):
    # "none" mode, 1 scratch block: 8 tokens take cdiv(8 + 4, 4) = 3 blocks.
    spec = MambaSpec(4, shapes=((1,),), dtype_sizes=(4,), num_speculative_blocks=1)
    run = Run([spec], 4, caching=False, profile=profile)
    r = run.request("r", 20)
    run.allocate(r, 9)
    first = run.table("r")[0]
    run.allocate(r, 1)
    # 9 computed: the state of token 8 is all that is read, blocks before
    # (9 - 1) // 4 = 2 could go; 0.17 counts 9 - 1 = 8 computed: only 1.
    assert (run.table("r")[1] == 0) is released and run.table("r")[0] == 0 != first


# -- prefill checkpoint blocks (§9.4.2) -------------------------------------------------------


def hybrid(alignment=16, **kw):
    """Full attention every 16 tokens, Mamba states every 32: hashed every 16,
    hits inside Mamba blocks."""
    return Run([FullAttentionSpec(16), mamba(32, num_prefill_checkpoint_blocks=1,
                                             prefill_checkpoint_alignment=alignment)],
               16, scheduler_block_size=32, **kw)


def test_checkpoint_block_keeps_the_prompt_checkpoint():
    run = hybrid()
    mm = run.m.coordinator.single_type_managers[1]
    r = run.request("p", 120)
    run.allocate(r, 120)
    # Position (120 - 1) // 16 * 16 = 112 lies in [0, 120), 112 apart from 0:
    # reserved in column cdiv(120, 32) - 2 = 2, which the running state follows.
    assert mm.prefill_checkpoints["p"] == (112, 2)
    table = mm.req_to_blocks["p"]
    assert [b.is_null for b in table] == [True, True, False, False]
    checkpoint = table[2]
    # Keyed for its block end (96) by the full-block pass, then re-keyed at 112.
    assert run.cached(r, 112, 1) == [checkpoint] and checkpoint.block_hash_num_tokens == 112
    assert run.cached(r, 96, 1) is None
    assert run.m.take_boundary_state_offloads() == {"p": [(1, checkpoint.block_id, 112)]}
    run.m.free(r)
    replay = run.request("q", 120)
    assert run.m.get_computed_blocks(replay)[1] == 112


@pytest.mark.parametrize("retention,reserved", [(None, True), (0, False)])
def test_a_mid_prompt_checkpoint_is_transient(retention, reserved):
    run = hybrid(retention=retention)
    mm = run.m.coordinator.single_type_managers[1]
    r = run.request("p", 240)
    free = run.m.block_pool.get_num_free_blocks()
    run.allocate(r, 128)
    # The chunk [0, 128) could export 112 (not the prompt's 224, not on a
    # Mamba block end): reserved only when every chunk may checkpoint
    # (retention 0 passes the prefill end 240 > 128), and never kept findable.
    assert ("p" in mm.prefill_checkpoints) is reserved
    assert free - run.m.block_pool.get_num_free_blocks() == 128 // 16 + 1 + reserved
    assert run.cached(r, 112, 1) is None and run.cached(r, 96, 1) is None
    run.m.new_step_starts()
    run.allocate(r, 112)
    # The prefill's last chunk: position 224, kept (the prompt's own).
    assert mm.prefill_checkpoints["p"][0] == 224 and run.cached(r, 224, 1) is not None


def test_checkpoint_blocks_count_in_the_memory_bound():
    spec = mamba(32, num_prefill_checkpoint_blocks=1, num_speculative_blocks=2)
    assert max_memory_usage_bytes(spec, 1024) == 5 * spec.page_size_bytes


def test_0_17_refuses_checkpoint_blocks():
    with pytest.raises(ValueError, match="0.17 has no Mamba prefill checkpoint"):
        Run([mamba(4, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4)], 4,
            profile=P17)


# -- boundary-state hand-offs (§9.4.3) --------------------------------------------------------


def producer():
    """Full attention every 2 tokens, Mamba every 4: a 15-token prompt whose
    tail state (14 tokens) lies inside Mamba block 3."""
    run = Run([FullAttentionSpec(2), mamba(4)], 2, scheduler_block_size=4)
    r = run.request("p", 15)
    run.allocate(r, 14)
    return run, r, run.m.coordinator.single_type_managers[1].req_to_blocks["p"][3]


def test_a_finishing_producer_hands_its_tail_block_once():
    run, r, tail = producer()
    assert run.cached(r, 14, 1) == [tail]
    assert run.m.finalize_partial_tail_offloads(r) == [(1, tail.block_id, 14)]
    assert run.m.finalize_partial_tail_offloads(r) == []


def test_a_producer_past_its_tail_hands_nothing():
    run, r, _ = producer()
    r.num_computed_tokens = 15
    assert run.m.finalize_partial_tail_offloads(r) == []


def test_a_running_producers_tail_is_offered_in_its_copy():
    run, r, tail = producer()
    run.m.take_boundary_state_offloads()
    run.m.new_step_starts()
    run.allocate(r, 1)
    (source, copy), = [(s, c) for s, c in run.m.take_kv_cache_block_copies()[0]]
    assert source == tail.block_id
    assert run.m.take_boundary_state_offloads() == {"p": [(1, copy, 14)]}
    assert run.m.finalize_partial_tail_offloads(r) == []


def test_0_28_hands_only_the_tail_copy_and_pins_it_until_the_request_is_freed():
    run = Run([FullAttentionSpec(2), mamba(4)], 2, scheduler_block_size=4,
              profile=get_profile("0.28"))
    r = run.request("p", 15)
    run.allocate(r, 14)
    assert run.m.take_partial_tail_offloads() == {}  # keyed states are not offered
    run.m.new_step_starts()
    run.allocate(r, 1)
    copies, retained = run.m.take_kv_cache_block_copies()
    run.m.block_pool.free_blocks(retained)
    (_, copy), = copies
    assert run.m.take_partial_tail_offloads() == {"p": [(1, copy, 14)]}
    block = run.m.block_pool.blocks[copy]
    assert block.ref_cnt == 1  # the pin alone: no table holds the copy
    run.checker.check(run.m)
    run.m.free(r)
    assert block.ref_cnt == 0
    run.checker.check(run.m)
    with pytest.raises(AttributeError, match="take_partial_tail_offloads"):
        producer()[0].m.take_partial_tail_offloads()  # 0.29+ drain unpinned


def test_freeing_a_request_withdraws_its_offers():
    run = Run([mamba(16)], 16)
    r = run.request("r", 64)
    run.allocate(r, 16)
    assert run.m.coordinator.single_type_managers[0]._offers
    run.m.free(r)
    assert run.m.take_boundary_state_offloads() == {}


# -- invariants of this bookkeeping (§13 rule 8), with negative controls -------------------------


def test_an_offer_left_for_a_freed_request_is_caught():
    run = Run([mamba(16)], 16)
    r = run.request("r", 64)
    run.allocate(r, 16)
    group = run.m.coordinator.single_type_managers[0]
    offers = list(group._offers)
    run.m.free(r)
    run.checker.check(run.m)
    group._offers = offers  # the fault: not withdrawn
    with pytest.raises(InvariantViolation, match="holds nothing"):
        run.checker.check(run.m)
    with pytest.raises(InvariantViolation, match="holds nothing"):
        check_invariants(run.m)


def test_a_tail_record_naming_another_block_is_caught():
    run, r, tail = producer()
    group = run.m.coordinator.single_type_managers[1]
    group._producer_tails["p"] = (run.m.block_pool.blocks[-1], 14)
    with pytest.raises(InvariantViolation, match="not in its table"):
        run.checker.check(run.m)


def test_the_checker_watches_a_checkpoint_losing_its_keys():
    run, r, tail = producer()
    pool = run.m.block_pool
    assert pool.evict_cached_block(tail)  # through the pool the checker watches
    run.checker.check(run.m)
    block = run.m.coordinator.single_type_managers[0].req_to_blocks["p"][0]
    type(pool).evict_cached_block(pool, block)  # the fault: behind its back
    with pytest.raises(InvariantViolation, match="block keys exist"):
        run.checker.check(run.m)


# -- junction checkpoints under EAGLE (§11): who keeps them ---------------------------------


@pytest.mark.parametrize("lookahead, kept", [(0, True), (1, True), (2, False), (4, False)])
def test_junction_checkpoints_need_eagle_partial_hits_and_no_reprefill(lookahead, kept):
    # Full attention (block 16) beside Mamba (16) hashed every 4 tokens: hits
    # inside blocks. With EAGLE, junction states are kept unless multi-module
    # MTP re-prefills tokens (lookahead - 1 > 0): the keyed length then lags
    # the chunk end, so a chunk stopped at a junction would key nothing there.
    run = Run([FullAttentionSpec(16), mamba(16)], 4, use_eagle=True,
              enable_mamba_shared_prefix_checkpoint=True, num_prefill_lookahead=lookahead)
    assert run.m.mamba_shared_prefix_checkpoint is kept
    managers = run.m.coordinator.single_type_managers
    assert managers[1].shared_prefix_checkpoint is kept
    assert managers[1].drop_eagle_checkpoint_block is True


def test_junction_checkpoints_are_off_without_eagle_or_partial_hits():
    plain = Run([FullAttentionSpec(16), mamba(16)], 4,
                enable_mamba_shared_prefix_checkpoint=True)
    assert plain.m.mamba_shared_prefix_checkpoint is False
    assert plain.m.coordinator.single_type_managers[1].drop_eagle_checkpoint_block is False
    whole_blocks = Run([FullAttentionSpec(16), mamba(16)], 16, use_eagle=True,
                       enable_mamba_shared_prefix_checkpoint=True)
    assert whole_blocks.m.mamba_shared_prefix_checkpoint is False


# -- the prompt-tail entry under EAGLE, by release (§15, mamba_eagle_tail_shift) ----------


@pytest.mark.parametrize("release, flag_full_only, shifted", [
    ("0.29", False, False),  # no EAGLE branch: the tail stays at the prompt's boundary
    ("0.30", False, True),   # the Mamba group drops (every group does): one unit lower
    ("0.30", True, False),   # only the flagged full-attention group drops
    ("0.31", True, True),    # any use_eagle manager moves it, flagged or not
])
def test_the_mamba_prompt_tail_moves_under_eagle_by_release(release, flag_full_only, shifted):
    # Full attention and Mamba, blocks of 16 hashed every 4 (hits inside
    # blocks): a 26-token prompt's tail boundary is 24, one hash unit lower
    # 20, both inside block 1 (before 0.32 only such a boundary is registered).
    profile = get_profile(release)
    cfg = KVCacheConfig(64, (
        KVCacheGroupSpec(("full",), FullAttentionSpec(16), is_eagle_group=flag_full_only),
        KVCacheGroupSpec(("mamba",), mamba(16))))
    m = KVCacheManager(cfg, 1 << 16, 4, profile, enable_caching=True, use_eagle=True)
    hasher = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(profile, "sha256", "0"),
                                True)
    r = Request("a", list(range(26)), 26)
    hasher.update(r)

    def keyed(tokens):
        return m.block_pool.get_cached_block(r.block_hashes[tokens // 4 - 1], [1]) is not None

    assert m.allocate_slots(r, 20) is not None
    r.num_computed_tokens = 20
    assert keyed(20) is shifted
    assert m.allocate_slots(r, 4) is not None
    r.num_computed_tokens = 24
    assert keyed(24) is not shifted


@pytest.mark.parametrize("profile,retention,reserved,findable", [
    (P30, 0, True, False),  # 0.30: every chunk reserves one; retention 0 drops it
    (P31, 0, False, False),  # 0.31: only the prefill end's chunk under retention 0
    (P30, None, True, True),  # hash grid: dense retention keeps a chunk's checkpoint
])
def test_0_30_reserves_a_checkpoint_for_every_chunk(profile, retention, reserved, findable):
    run = hybrid(retention=retention, profile=profile)
    mm = run.m.coordinator.single_type_managers[1]
    r = run.request("p", 240)
    run.allocate(r, 128)
    # The chunk [0, 128) exports (128 - 1) // 16 * 16 = 112 into column 2.
    assert mm.prefill_checkpoints.get("p") == ((112, 2) if reserved else None)
    assert (run.cached(r, 112, 1) is not None) is findable
