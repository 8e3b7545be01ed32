"""KVCacheManager's two reads of a request's blocks, kind by kind
(specs/KV_CACHE_MANAGER.md §16.10): get_block_ids_for_computed_tokens and
estimate_cached_tokens. Hand-derived; tests/harness/test_computed_token_reads_live.py
holds the same answers against vLLM 0.32."""

from __future__ import annotations

import pytest

import impl.kv_cache_spec as ks
from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from impl.profiles import get_profile
from impl.request import Request
from impl.uniform_type_spec import UniformTypeKVCacheSpecs

P = get_profile("0.32")
# Every test hashes 4-token blocks with one seeded hasher.
HASHER = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(P, "sha256", "0"), True)
ALIGN_MAMBA = MambaSpec(4, shapes=((1,),), dtype_sizes=(4,), mamba_cache_mode="align")


def manager(*specs, num_blocks=40, **kwargs) -> KVCacheManager:
    """One group a spec (layer names l0, l1, ...) in a pool of `num_blocks`."""
    config = ks.KVCacheConfig(num_blocks, tuple(
        ks.KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs)))
    return KVCacheManager(config, 4096, 4, P, **kwargs)


def request(rid: str, num_tokens: int) -> Request:
    """A request of tokens 0, 1, ..., its full blocks hashed."""
    r = Request(rid, list(range(num_tokens)), num_tokens)
    HASHER.update(r)
    return r


def admit(m: KVCacheManager, r: Request, **kwargs) -> int:
    """The whole prompt in one step, after a lookup; returns the hit."""
    blocks, hit, _ = m.get_computed_blocks(r)
    assert m.allocate_slots(r, r.num_tokens - hit, hit, blocks, **kwargs) is not None
    r.num_computed_tokens = r.num_tokens
    return hit


# -- which kinds each read treats apart: the spec's row -----------------------------------

@pytest.mark.parametrize("spec, clipped, counted", [
    (FullAttentionSpec(4), True, True),
    (MLAAttentionSpec(4), True, True),
    (SinkFullAttentionSpec(4, sink_len=4), True, True),
    (SlidingWindowSpec(4, sliding_window=8), True, True),
    (ChunkedLocalAttentionSpec(4, attention_chunk_size=8), True, True),
    (CircularBufferSpec(4), True, False),  # attention, but never keyed
    (CrossAttentionSpec(4), False, False),  # the encoder's tokens
    (ALIGN_MAMBA, False, True),  # states, not token slots
    (HiSparseResidentSpec(block_size=4, page_size=16), False, False),
    (HiSparseHotSpec(block_size=4, page_size=16, blocks_per_request=2), False, False),
    (UniformTypeKVCacheSpecs(4, {"a": FullAttentionSpec(4),
                                 "b": FullAttentionSpec(4, head_size=2)}), False, True),
])
def test_each_kind_states_how_the_two_reads_treat_it(spec, clipped, counted):
    assert spec.clipped_to_computed_tokens is clipped
    assert spec.counts_cached_tokens is counted


# -- get_block_ids_for_computed_tokens ----------------------------------------------------


def test_attention_groups_are_cut_to_the_blocks_the_computed_tokens_fill():
    m = manager(FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=4))
    admit(m, request("a", 14))
    m.remove_skipped_blocks("a", 14, 14)
    # The window's table keeps its null padding: the cut is by position.
    assert m.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 7, 8])
    assert m.get_block_ids_for_computed_tokens("a", 0) == ([], [])
    assert m.get_block_ids_for_computed_tokens("a", 5) == ([1, 2], [0, 0])
    assert m.get_block_ids_for_computed_tokens("a", 8) == ([1, 2], [0, 0])
    assert m.get_block_ids_for_computed_tokens("a", 14) == ([1, 2, 3, 4], [0, 0, 7, 8])
    assert m.get_block_ids_for_computed_tokens("a", 99) == ([1, 2, 3, 4], [0, 0, 7, 8])


def test_a_circular_buffer_is_attention_and_is_cut_too():
    m = manager(FullAttentionSpec(4), CircularBufferSpec(4))
    admit(m, request("a", 14))
    assert m.get_block_ids_for_computed_tokens("a", 0) == ([], [])
    assert m.get_block_ids_for_computed_tokens("a", 3) == ([1], [5])


def test_mamba_states_keep_every_id():
    m = manager(FullAttentionSpec(4), ALIGN_MAMBA)
    admit(m, request("a", 14))
    mamba = m.get_block_ids("a")[1]
    for n in (0, 5, 14):
        assert m.get_block_ids_for_computed_tokens("a", n)[1] == mamba


def test_cross_attention_keeps_the_encoder_blocks_whole():
    m = manager(FullAttentionSpec(4), CrossAttentionSpec(4), enable_caching=False)
    r = request("a", 14)
    m.allocate_slots(r, 14, num_encoder_tokens=10)
    assert m.get_block_ids("a") == ([1, 2, 3, 4], [5, 6, 7])
    assert m.get_block_ids_for_computed_tokens("a", 0) == ([], [5, 6, 7])
    assert m.get_block_ids_for_computed_tokens("a", 5) == ([1, 2], [5, 6, 7])


def test_a_request_without_blocks_reads_empty_lists():
    m = manager(FullAttentionSpec(4), ALIGN_MAMBA)
    assert m.get_block_ids_for_computed_tokens("nobody", 8) == ([], [])
    assert m.estimate_cached_tokens(request("nobody", 8)) == 0


# -- estimate_cached_tokens ---------------------------------------------------------------


def test_the_estimate_is_the_least_keyed_prefix_over_the_groups():
    # Full attention keys 12 of 14 tokens; the Mamba state at 14 is inside
    # a block, so that group has nothing keyed yet: the least is 0.
    m = manager(FullAttentionSpec(4), ALIGN_MAMBA)
    r = request("a", 14)
    admit(m, r)
    assert m.estimate_cached_tokens(r) == 0
    m = manager(FullAttentionSpec(4), ALIGN_MAMBA)
    r = request("a", 16)
    admit(m, r)
    assert m.estimate_cached_tokens(r) == 16  # both keyed to the end


def test_a_block_keyed_for_part_of_its_tokens_counts_that_part():
    # The 8-token group's second block holds tokens 8..13 and is keyed for
    # the 12 of whole 4-token hash blocks, as the 4-token group is.
    m = manager(FullAttentionSpec(4), FullAttentionSpec(8))
    r = request("a", 14)
    admit(m, r)
    assert [b.block_hash_num_tokens for b in m.get_blocks("a").blocks[1]] == [8, 12]
    assert m.estimate_cached_tokens(r) == 12


def test_groups_never_keyed_do_not_count():
    m = manager(FullAttentionSpec(4), CircularBufferSpec(4))
    r = request("a", 14)
    admit(m, r)
    assert m.estimate_cached_tokens(r) == 12  # not 0: the ring does not count
    cross = manager(FullAttentionSpec(4), CrossAttentionSpec(4), enable_caching=False)
    r = request("a", 14)
    cross.allocate_slots(r, 14, num_encoder_tokens=10)
    assert cross.estimate_cached_tokens(r) == 0  # nothing keyed without caching


def test_shared_blocks_count_with_the_keys_another_request_gave_them():
    m = manager(FullAttentionSpec(4))
    admit(m, request("a", 14))
    b = request("b", 14)
    assert m.estimate_cached_tokens(b) == 0  # no blocks yet
    assert admit(m, b) == 12
    assert m.estimate_cached_tokens(b) == 12


# -- a new kind gets both from its row ----------------------------------------------------


class _EncoderSideFull(FullAttentionSpec):
    """A kind of the test's own: kept like full attention (the registry
    walks its bases) but holding encoder tokens, as its row says."""

    reads_encoder_tokens = True


def test_a_kind_is_treated_by_its_row_not_its_name():
    m = manager(FullAttentionSpec(4), _EncoderSideFull(8))
    r = request("a", 14)
    admit(m, r)
    ids = m.get_block_ids("a")
    assert m.get_block_ids_for_computed_tokens("a", 1) == (ids[0][:1], ids[1])
    assert m.estimate_cached_tokens(r) == 12  # its keyed 8 tokens do not count


def test_negative_control_a_row_that_lies_changes_the_answer(monkeypatch):
    """The reads ask the spec: cross attention claiming the request's own
    tokens has its encoder blocks cut."""
    m = manager(FullAttentionSpec(4), CrossAttentionSpec(4), enable_caching=False)
    m.allocate_slots(request("a", 14), 14, num_encoder_tokens=10)
    monkeypatch.setattr(CrossAttentionSpec, "reads_encoder_tokens", False)
    assert m.get_block_ids_for_computed_tokens("a", 0) == ([], [])
