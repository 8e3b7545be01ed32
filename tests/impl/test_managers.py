"""The attention kinds and the coordinators, on impl alone, with hand-derived
expectations (live differential checks are in tests/harness/test_kinds_live.py)."""

from __future__ import annotations

import pytest

from impl.block import null_head_len
from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.block_hash_view import BlockHashListWithBlockSize, resolve_block_hashes
from impl.coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from impl.group_rules import partial_hash_hits_enabled
from impl.invariants import InvariantChecker
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from impl.managers import manager_class_for
from impl.managers.chunked_local import ChunkedLocalAttentionManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.mamba import MambaManager
from impl.managers.sliding_window import SlidingWindowManager
from impl.profiles import CoarseBlockHash, get_profile
from impl.request import Request

P32, P17 = get_profile("0.32"), get_profile("0.17")


class Setup:
    """A manager over `specs` and a hasher, with helpers to run requests the
    way the scheduler does; checks impl's invariants after every call."""

    def __init__(self, specs, num_blocks=32, caching=True, profile=P32, hash_block_size=None,
                 scheduler_block_size=None, **kw):
        cfg = KVCacheConfig(num_blocks, tuple(
            KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs)))
        hbs = hash_block_size or min(s.block_size for s in specs)
        self.m = KVCacheManager(cfg, 1 << 16, hbs, profile, enable_caching=caching,
                                enable_kv_cache_events=True,
                                scheduler_block_size=scheduler_block_size, **kw)
        self.hasher = RequestBlockHasher(hbs, get_hash_fn("sha256"),
                                         none_hash(profile, "sha256", "0"), True)
        self.checker = InvariantChecker()

    def request(self, rid, tokens):
        r = Request(rid, list(tokens), len(tokens))
        self.hasher.update(r)
        return r

    def admit(self, r, num_new=None, **kw):
        """Look up, then allocate num_new (default: the rest) tokens."""
        blocks, hit, _ = self.m.get_computed_blocks(r)
        n = r.num_tokens - hit if num_new is None else num_new
        new = self.m.allocate_slots(r, n, hit, blocks, **kw)
        if new is not None:
            r.num_computed_tokens = hit + n
        self.checker.check(self.m)
        return hit, blocks.get_block_ids(), None if new is None else new.get_block_ids()

    def step(self, r, tokens):
        """Append sampled tokens and schedule them."""
        r.all_token_ids.extend(tokens)
        self.hasher.update(r)
        new = self.m.allocate_slots(r, len(tokens))
        if new is not None:
            r.num_computed_tokens += len(tokens)
        self.checker.check(self.m)
        return None if new is None else new.get_block_ids()

    def table(self, rid):
        return self.m.get_block_ids(rid)


def full(bs=4):
    return FullAttentionSpec(bs)


def window(bs=4, w=4):
    return SlidingWindowSpec(bs, sliding_window=w)


def test_managers_by_spec():
    assert manager_class_for(MLAAttentionSpec(4)) is FullAttentionManager
    assert manager_class_for(SlidingWindowSpec(4, sliding_window=2)) is SlidingWindowManager
    assert manager_class_for(ChunkedLocalAttentionSpec(4, attention_chunk_size=8)) is (
        ChunkedLocalAttentionManager)
    assert manager_class_for(MambaSpec(4)) is MambaManager


def test_coordinator_by_groups():
    assert isinstance(Setup([full()]).m.coordinator, UnitaryKVCacheCoordinator)
    assert isinstance(Setup([full(), window()]).m.coordinator, HybridKVCacheCoordinator)
    assert isinstance(Setup([full(), CrossAttentionSpec(4)], caching=False).m.coordinator,
                      KVCacheCoordinatorNoPrefixCache)


# -- sliding window ---------------------------------------------------------------------


def test_sliding_window_frees_what_the_window_left():
    s = Setup([window(4, 4)])
    a = s.request("a", range(10))
    assert s.admit(a) == (0, ([],), ([1, 2, 3],))
    # 10 computed: the next token's window is 7-10; tokens 0-6 (one whole block) go.
    assert s.step(a, [10]) == ([],)
    assert s.table("a") == ([0, 2, 3],)
    assert s.m.block_pool.free_block_queue.block_ids()[-1] == 1  # cached: to the tail


@pytest.mark.parametrize("profile,returned", [("0.32", [0, 2, 3]), ("0.33", [2, 3])])
def test_a_freed_table_loses_its_null_head_from_0_33(profile, returned):
    # profile.null_block_refcount off (0.33): the table handed back for
    # freeing starts at its first real block.
    s = Setup([window(4, 4)], profile=get_profile(profile))
    a = s.request("a", range(10))
    s.admit(a)
    s.step(a, [10])
    table = s.m.coordinator.single_type_managers[0].pop_blocks_for_free("a")
    assert [b.block_id for b in table] == returned


def test_null_head_len_counts_the_leading_nulls_only():
    pool = Setup([full()]).m.block_pool
    null, real = pool.null_block, pool.get_new_blocks(2)
    assert [null_head_len(t) for t in ([], real, [null] * 3, [null, null, *real, null])] == [
        0, 0, 3, 2]


@pytest.mark.parametrize("w,hit,table", [
    (4, 8, [0, 2]),       # cdiv(3, 4) = 1 block before the end is enough
    (6, 8, [1, 2]),       # cdiv(5, 4) = 2 blocks
    (20, 8, [1, 2]),      # the run reaches the first block: a hit though shorter
])
def test_sliding_window_hit_needs_only_the_window(w, hit, table):
    s = Setup([window(4, w)])
    s.admit(s.request("a", range(12)))
    assert s.admit(s.request("b", list(range(8)) + [50, 51]), 1)[:2] == (hit, (table,))


def test_sliding_window_run_must_end_at_the_alignment():
    """Blocks of 2, hits aligned to 4 tokens: only the window block before each
    4-token boundary is cached, and a hit ends at such a boundary."""
    s = Setup([full(4), window(2, 3)])
    s.admit(s.request("a", range(10)))
    # a caches 8 tokens (aligned); the window group keeps blocks 2 and 4 (0-based 1, 3).
    sw = s.m.coordinator.single_type_managers[1]
    hashed = [b.block_hash is not None for b in sw.req_to_blocks["a"]]
    assert hashed == [False, True, False, True, False]
    hit, ids, _ = s.admit(s.request("b", list(range(8)) + [60, 61, 62]), 1)
    assert hit == 8 and ids[1] == [0, 0, 0, 7]


def test_sliding_window_caches_every_block_in_0_17():
    s = Setup([full(4), window(2, 3)], profile=P17, scheduler_block_size=4)
    s.admit(s.request("a", range(10)))
    sw = s.m.coordinator.single_type_managers[1]
    assert [b.block_hash is not None for b in sw.req_to_blocks["a"]] == [True] * 5


def test_sliding_window_admission_cap():
    """window 8, blocks of 4, 4 tokens in flight: a request never holds more than
    cdiv(7 + 4, 4) + 1 = 4 blocks, so a long prompt fits a small pool."""
    s = Setup([window(4, 8)], num_blocks=6, max_in_flight_tokens=4)
    a = s.request("a", range(100))
    assert s.admit(a, 4, full_sequence_must_fit=True)[2] == ([1],)


# -- chunked local --------------------------------------------------------------------


def test_chunked_local_counts_earlier_chunks_as_computed():
    s = Setup([ChunkedLocalAttentionSpec(2, attention_chunk_size=4)])
    hit, ids, new = s.admit(s.request("a", range(10)), 2)
    # The next token (9) is in chunk 8-11: tokens 0-7 are outside its window.
    assert (hit, ids, new) == (8, ([0, 0, 0, 0],), ([1],))


def test_chunked_local_frees_the_previous_chunk():
    s = Setup([ChunkedLocalAttentionSpec(2, attention_chunk_size=4)])
    a = s.request("a", range(3))
    s.admit(a)
    s.step(a, [3])
    s.step(a, [4])  # 4 computed: the chunk 0-3 is done
    assert s.table("a") == ([0, 0, 3],)


# -- Mamba --------------------------------------------------------------------------------


def test_mamba_align_keeps_the_running_state_only():
    s = Setup([MambaSpec(4, mamba_cache_mode="align")])
    a = s.request("a", range(10))
    assert s.admit(a, 8)[2] == ([0, 1],)  # the state after 8 tokens, behind a null
    new = s.m.allocate_slots(a, 2)
    a.num_computed_tokens = 10
    assert new.get_block_ids() == ([2],)
    s.step(a, [10])
    # The state at 8 tokens (two steps back) is freed.
    assert s.table("a") == ([0, 0, 2],)


def test_mamba_hit_is_the_rightmost_aligned_state():
    s = Setup([MambaSpec(4, mamba_cache_mode="align")])
    s.admit(s.request("a", range(12)), 8)
    s.m.new_step_starts()
    hit, ids, _ = s.admit(s.request("b", range(12)), 4)
    assert (hit, ids) == (8, ([0, 1],))


def test_mamba_state_cached_this_step_is_not_hit_until_the_next():
    s = Setup([MambaSpec(4, mamba_cache_mode="align")], num_blocks=8)
    s.admit(s.request("a", range(12)), 8)
    assert s.admit(s.request("b", range(12)), 4)[2] is None  # refused
    s.m.new_step_starts()
    assert s.admit(s.request("c", range(12)), 4)[2] is not None


def test_mamba_none_mode_frees_all_but_the_last_state():
    s = Setup([MambaSpec(4)], caching=False)
    a = s.request("a", range(10))
    s.admit(a)
    s.step(a, [10])
    assert s.table("a") == ([0, 0, 3],)


# -- cross attention and sinks --------------------------------------------------------


def test_cross_attention_blocks_follow_the_encoder_tokens():
    s = Setup([full(4), CrossAttentionSpec(4)], caching=False)
    a = s.request("a", range(5))
    assert s.admit(a, num_encoder_tokens=10)[2] == ([1, 2], [3, 4, 5])
    assert s.step(a, [5, 6, 7, 8]) == ([6], [])


def test_sink_blocks_are_reserved_only_by_0_17():
    spec = SinkFullAttentionSpec(4, sink_len=8)
    assert Setup([spec], num_blocks=6).m.block_pool.get_num_free_blocks() == 5
    old = Setup([spec], num_blocks=6, profile=P17)
    assert old.m.block_pool.free_block_queue.block_ids() == [3, 4, 5]
    with pytest.raises(AssertionError):
        Setup([SinkFullAttentionSpec(4, sink_len=6)])


# -- hybrid -----------------------------------------------------------------------------


def test_hybrid_hit_is_what_every_group_agrees_on():
    """Full attention hits 12 tokens; the window (4, blocks of 4) needs one cached
    block before the end: evict a's last window block and the hit falls to 8."""
    s = Setup([full(4), window(4, 4)])
    s.admit(s.request("a", range(13)))
    assert s.admit(s.request("b", range(14)), 2)[:2] == (12, ([1, 2, 3], [0, 0, 7]))
    s.m.evict_blocks([7])
    assert s.admit(s.request("c", range(14)), 2)[:2] == (8, ([1, 2], [0, 6]))


def test_equal_groups_are_looked_up_together():
    s = Setup([full(4), window(4, 4), window(4, 4)])
    groups = s.m.coordinator.attention_groups
    assert [g.group_ids for g in groups] == [[0], [1, 2]]


def test_hybrid_caches_up_to_the_scheduler_block_only():
    """Blocks of 4 and 8: caching stops at a multiple of lcm = 8 (0.32)."""
    s = Setup([full(4), window(8, 20)], scheduler_block_size=8)
    s.admit(s.request("a", range(13)))
    f = s.m.coordinator.single_type_managers[0]
    assert f.num_cached_block["a"] == 2  # 8 tokens, not 12
    old = Setup([full(4), window(8, 20)], profile=P17, scheduler_block_size=8)
    old.admit(old.request("a", range(13)))
    assert old.m.coordinator.single_type_managers[0].num_cached_block["a"] == 3


def test_fine_grained_hits_need_a_larger_mamba_align_block():
    m = MambaSpec(8, mamba_cache_mode="align")
    classes = [FullAttentionManager, MambaManager]
    assert partial_hash_hits_enabled([full(8), m], classes, 4, 1)
    assert not partial_hash_hits_enabled([full(8), m], classes, 8, 1)
    assert not partial_hash_hits_enabled(
        [window(8, 4), m], [SlidingWindowManager, MambaManager], 4, 1)
    assert not partial_hash_hits_enabled(
        [full(8), MambaSpec(8)], classes, 4, 1)  # "none" mode


def test_partial_hit_copies_the_shared_block():
    """Full attention and Mamba, blocks of 4, hashed every 2: a resend of a
    7-token prompt hits its partial entry at 6 tokens and copies both blocks."""
    s = Setup([full(4), MambaSpec(4, mamba_cache_mode="align")], hash_block_size=2,
              scheduler_block_size=4)
    a = s.request("a", range(7))
    s.admit(a, 4)
    assert s.m.allocate_slots(a, 2).get_block_ids() == ([3], [4])
    a.num_computed_tokens = 6
    assert s.m.allocate_slots(a, 1).get_block_ids() == ([], [])
    a.num_computed_tokens = 7
    copies, retained = s.m.take_kv_cache_block_copies()
    assert copies == [(4, 5)]
    s.m.block_pool.free_blocks(retained)
    s.m.new_step_starts()
    hit, ids, new = s.admit(s.request("b", list(range(7)) + [70, 71]), 3)
    assert (hit, ids, new) == (6, ([1, 3], [0, 5]), ([6, 7], [8, 9]))
    assert s.table("b") == ([1, 6, 7], [0, 8, 9])
    assert s.m.take_kv_cache_block_copies()[0] == [(3, 6), (5, 8)]


# -- block hash views ---------------------------------------------------------------------


def test_coarse_block_hash_last_or_concat():
    hashes = [b"a", b"b", b"c", b"d", b"e"]
    last = BlockHashListWithBlockSize(hashes, 2, 4, CoarseBlockHash.LAST)
    concat = BlockHashListWithBlockSize(hashes, 2, 4, CoarseBlockHash.CONCAT)
    assert (len(last), last[0], last[1], list(concat)) == (2, b"b", b"d", [b"ab", b"cd"])
    assert resolve_block_hashes(hashes, 2, 2, CoarseBlockHash.LAST) is hashes
    assert resolve_block_hashes(hashes, 2, 4, CoarseBlockHash.LAST, True, 2) is hashes


def test_resolve_block_hashes_takes_a_view_only_at_its_own_block_size():
    hashes = [bytes([i]) for i in range(8)]
    view = BlockHashListWithBlockSize(hashes, 2, 4, CoarseBlockHash.LAST)
    assert resolve_block_hashes(view, 2, 4, CoarseBlockHash.LAST) is view
    # Negative control: a view of 8-token blocks read for a 4-token group
    # would name every other block; it is refused, not passed through.
    wide = BlockHashListWithBlockSize(hashes, 2, 8, CoarseBlockHash.LAST)
    with pytest.raises(AssertionError):
        resolve_block_hashes(wide, 2, 4, CoarseBlockHash.LAST)
