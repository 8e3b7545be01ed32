"""Sparse prefix-cache checkpoints (prefix_cache_retention_interval), replay
boundaries, reachable_block_mask and the shared-prefix boundary
(specs/KV_CACHE_MANAGER.md §9.2, §9.2.1, §9.4.4, §10, §11), on impl alone;
expectations derived by hand from the spec. The live differential run is the
`retention` fuzz template (tests/harness/test_kinds_live.py)."""

from __future__ import annotations

import pytest

from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.invariants import InvariantChecker
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from impl.managers.mamba import MambaManager
from impl.managers.sliding_window import SlidingWindowManager
from impl.profiles import PrefixCacheRetention, get_profile
from impl.request import Request
from impl.retention import replay_boundaries, thinned_kinds, validate_retention_interval

P32, P17 = get_profile("0.32"), get_profile("0.17")
MAMBA = MambaSpec(16, shapes=((1,),), dtype_sizes=(4,), mamba_cache_mode="align")


def kept(mask):
    return None if mask is None else {i for i, keep in enumerate(mask) if keep}


def swa(window, block_size=16):
    return SlidingWindowSpec(block_size, sliding_window=window)


# -- masks -------------------------------------------------------------------------------


@pytest.mark.parametrize("retention,boundaries,expected", [
    (None, (255,), None),             # dense: every state
    (16, (255,), None),               # an interval of one block: every state
    (64, (255,), {3, 7, 11, 14, 15}),  # segment ends, and 240 // 16 - 1
    (0, (255,), {14}),
    (0, (255, 96), {5, 14}),
    (0, (255, 100), {5, 14}),         # floored to the alignment
    (0, (255, 512), {14}),            # past the blocks asked about
])
def test_mamba_keeps_one_state_per_segment_and_boundary(retention, boundaries, expected):
    mask = MambaManager.reachable_block_mask(0, 16, 16, MAMBA, False, retention, boundaries)
    assert kept(mask) == expected


def test_mamba_states_are_not_scaled_by_dcp():
    masks = [kept(MambaManager.reachable_block_mask(0, 16, 64, MAMBA, False, 64, (255,),
                                                    dcp_world_size=d)) for d in (1, 16)]
    assert masks[0] == masks[1] == {3, 7, 11, 15}


@pytest.mark.parametrize("window,retention,boundaries,expected", [
    (16, None, (), {3, 7, 11, 15}),    # dense at alignment 64: need 1 of 4
    (48, 0, (255, 96), {3, 4, 5, 12, 13, 14}),  # need 3 before 96 and 240
    (16, 64, (255, 96), {3, 5, 7, 11, 14, 15}),
    (16, 0, (), set()),
])
def test_sliding_window_keeps_the_windows_tail(window, retention, boundaries, expected):
    alignment = 64 if retention is None else 16
    mask = SlidingWindowManager.reachable_block_mask(0, 16, alignment, swa(window), False,
                                                     retention, boundaries)
    assert kept(mask) == expected


def test_sliding_window_eagle_keeps_one_block_more_shifted():
    # need 1 + 1, shift 1: block i when (i - 1) % 4 >= 2.
    mask = SlidingWindowManager.reachable_block_mask(0, 16, 64, swa(16), True)
    assert kept(mask) == {3, 4, 7, 8, 11, 12, 15}


def test_sliding_window_final_partial_segment():
    # Blocks of 4, window 16 (need 4), alignment 36: 9 blocks a segment.
    def mask(final):
        return {243 + i for i in kept(SlidingWindowManager.reachable_block_mask(
            243, 250, 36, swa(16, 4), False, final_segment_end_block=final))}
    assert mask(300) == {248, 249}  # segment 243-251 ends at 251: its tail 248-251
    assert mask(250) == {246, 247, 248, 249}  # the request ends at 250: tail 246-249


def test_sliding_window_mask_is_dense_below_the_block():
    assert SlidingWindowManager.reachable_block_mask(0, 16, 24, swa(32), False, 24) is None
    assert SlidingWindowManager.reachable_block_mask(0, 16, 64, swa(32), False, 64, (),
                                                     dcp_world_size=3) is None


# -- replay boundaries and validation --------------------------------------------------------


def test_replay_boundaries():
    assert replay_boundaries(100, 32, False) == (99,)
    assert replay_boundaries(100, 32, True) == (64,)  # 96 - 32 and 96 - 32
    assert replay_boundaries(96, 32, True) == (32, 64)  # a resend stops a block earlier
    assert replay_boundaries(20, 32, True) == (0,)
    # 0.29 keeps the resend's boundary alone, under EAGLE too.
    resend_only = PrefixCacheRetention.KV_CACHE_CONFIG_RESEND_ONLY
    assert replay_boundaries(96, 32, True, resend_only) == (95,)
    assert replay_boundaries(100, 32, False, resend_only) == (99,)


def test_0_28_thins_mamba_but_refuses_any_interval_without_a_thinned_group():
    shape = PrefixCacheRetention.ENVIRONMENT_WITH_MAMBA
    assert MambaSpec in thinned_kinds(shape)
    assert MambaSpec not in thinned_kinds(PrefixCacheRetention.SLIDING_WINDOW_ONLY)
    validate_retention_interval(0, 16, [FullAttentionSpec(16), MAMBA], shape)
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        validate_retention_interval(0, 16, [FullAttentionSpec(16)], shape)
    assert replay_boundaries(96, 32, True, shape) == (95,)


def test_0_29_validates_and_thins_as_0_30():
    resend_only = PrefixCacheRetention.KV_CACHE_CONFIG_RESEND_ONLY
    assert thinned_kinds(resend_only) == thinned_kinds(PrefixCacheRetention.KV_CACHE_CONFIG)
    validate_retention_interval(0, 16, [FullAttentionSpec(16)], resend_only)
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        validate_retention_interval(16, 16, [FullAttentionSpec(16)], resend_only)


@pytest.mark.parametrize("interval,specs,message", [
    (33, [FullAttentionSpec(32), swa(64, 8)], "multiple of scheduler_block_size"),
    (-32, [FullAttentionSpec(32), swa(64, 8)], "non-negative"),
    (16, [FullAttentionSpec(16)], "no sliding-window or Mamba"),
])
def test_invalid_intervals_are_refused(interval, specs, message):
    with pytest.raises(ValueError, match=message):
        validate_retention_interval(interval, 32, specs)


def test_zero_and_none_need_no_sparse_group():
    validate_retention_interval(0, 16, [FullAttentionSpec(16)])
    validate_retention_interval(None, 16, [FullAttentionSpec(16)])


# -- through the manager ---------------------------------------------------------------------


class Run:
    def __init__(self, specs, hbs, retention, profile=P32, num_blocks=100, **kw):
        cfg = KVCacheConfig(num_blocks, tuple(KVCacheGroupSpec((f"l{i}",), s)
                                              for i, s in enumerate(specs)),
                            prefix_cache_retention_interval=retention)
        self.m = KVCacheManager(cfg, 8192, hbs, profile, **kw)
        self.hasher = RequestBlockHasher(hbs, get_hash_fn("sha256"),
                                         none_hash(profile, "sha256", "0"), True)
        self.checker = InvariantChecker()
        self.hbs = hbs

    def admit(self, tokens, rid, num_new=None):
        """A new request in a new step: look up, allocate `num_new` tokens."""
        self.m.new_step_starts()
        r = Request(rid, list(tokens), len(tokens))
        self.hasher.update(r)
        blocks, hit, boundary = self.m.get_computed_blocks(r)
        r.shared_prefix_boundary = boundary  # as the scheduler keeps it
        n = len(tokens) - hit if num_new is None else num_new
        assert self.m.allocate_slots(r, n, hit, blocks) is not None
        r.num_computed_tokens = hit + n
        self.checker.check(self.m)
        return r, hit, boundary

    def cached(self, r, group):
        pool = self.m.block_pool
        return {i for i, h in enumerate(r.block_hashes)
                if pool.get_cached_block(h, [group]) is not None}


def test_a_sliding_window_model_keeps_sparse_tails():
    run = Run([swa(16)], 16, 64, enable_caching=True)
    tokens = [i for i in range(16) for _ in range(16)]
    r, _, _ = run.admit(tokens, "0")
    assert run.cached(r, 0) == {3, 7, 11, 14, 15}
    assert run.admit(tokens, "1", 1)[1] == 240  # the replay boundary is there


def test_shared_prefix_boundary_pins_the_junction():
    """Three requests share two blocks: the third finds the Mamba state at
    the junction the second one stopped at (retention 0)."""
    run = Run([FullAttentionSpec(16), MAMBA], 16, 0, scheduler_block_size=16)
    shared = [7] * 32
    # The scheduler stops the first prefill at its last cacheable state (48).
    first, _, boundary = run.admit(shared + [50] * 32, "0", 48)
    assert boundary == 0 and run.cached(first, 1) == {2}  # only its replay boundary
    second, hit, boundary = run.admit(shared + [60] * 32, "1", 32)
    # Full attention hit 2 blocks, Mamba none: the junction is 0 + 32.
    assert (hit, boundary) == (0, 32) and 1 in run.cached(second, 1)
    assert run.admit(shared + [70] * 32, "2", 1)[1] == 32


def test_0_17_has_no_retention_interval():
    with pytest.raises(ValueError, match="0.17 has no prefix_cache_retention_interval"):
        Run([swa(16)], 16, 0, profile=P17)


def test_the_interval_is_read_when_blocks_are_cached():
    """vLLM's coordinator reads its retention_interval attribute each time it
    caches (vLLM 0.32's own tests set it on a built manager): a manager built
    dense and set to 0 afterwards keeps only the replay boundary, as one built
    with 0 does. Caught impl caching every state after it had fixed each
    group's interval at construction (18 of 0.32's peer tests failed)."""
    tokens = [i for i in range(16) for _ in range(16)]
    built_zero = Run([swa(16)], 16, 0, enable_caching=True)
    late_zero = Run([swa(16)], 16, None, enable_caching=True)
    late_zero.m.coordinator.retention_interval = 0
    kept_states = [run.cached(run.admit(tokens, "0")[0], 0) for run in (built_zero, late_zero)]
    assert kept_states[0] == kept_states[1] != set(range(16))
