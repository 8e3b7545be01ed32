"""BlockPool in isolation: free order per profile, touch, eviction, reset, events."""

import pytest

from impl.block_hash import external_block_hash, make_block_hash_with_group_id
from impl.block_pool import BlockPool
from impl.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from impl.profiles import get_profile
from impl.request import Request


def pool(n=8, profile="0.32", caching=True, events=True):
    return BlockPool(n, caching, 4, events, profile=get_profile(profile))


def cached_request(tokens, hashes):
    r = Request("r", tokens, len(tokens))
    r.block_hashes = hashes
    return r


def test_null_block_is_taken_out():
    p = pool(5)
    assert p.null_block.block_id == 0 and p.null_block.is_null
    assert p.free_block_queue.block_ids() == [1, 2, 3, 4]
    assert p.get_usage() == 0.0


def test_free_order_0_32_unhashed_first():
    p = pool()
    blocks = p.get_new_blocks(4)  # 1 2 3 4
    req = cached_request(list(range(8)), [b"h1", b"h2"])
    p.cache_full_blocks(req, blocks, 0, 2, 4, 0)  # 1, 2 cached; 3, 4 not
    p.free_blocks(reversed(blocks))
    # Unhashed 4, 3 go to the head in the order given; hashed 2, 1 to the tail.
    assert p.free_block_queue.block_ids() == [4, 3, 5, 6, 7, 2, 1]


def test_free_order_0_17_appends_all():
    p = pool(profile="0.17")
    blocks = p.get_new_blocks(4)
    req = cached_request(list(range(8)), [b"h1", b"h2"])
    p.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    p.free_blocks(reversed(blocks))
    assert p.free_block_queue.block_ids() == [5, 6, 7, 4, 3, 2, 1]


def test_free_with_caching_off_prepends_everything_0_32():
    p = pool(caching=False)
    blocks = p.get_new_blocks(3)
    p.free_blocks(reversed(blocks))
    assert p.free_block_queue.block_ids() == [3, 2, 1, 4, 5, 6, 7]


def test_shared_block_is_freed_by_its_last_holder_only():
    p = pool()
    (b,) = p.get_new_blocks(1)
    p.cache_full_blocks(cached_request([0] * 4, [b"h"]), [b], 0, 1, 4, 0)
    p.touch([b])
    assert b.ref_cnt == 2
    p.free_blocks([b])
    assert b.ref_cnt == 1 and b.block_id not in p.free_block_queue.block_ids()
    p.free_blocks([b])
    assert p.free_block_queue.block_ids()[-1] == b.block_id


def test_touch_pulls_a_free_cached_block_out_of_the_queue():
    p = pool()
    (b,) = p.get_new_blocks(1)
    p.cache_full_blocks(cached_request([0] * 4, [b"h"]), [b], 0, 1, 4, 0)
    p.free_blocks([b])
    assert p.get_cached_block(b"h", [0]) == [b]
    p.touch([b])
    assert b.ref_cnt == 1 and b.block_id not in p.free_block_queue.block_ids()
    assert p.get_num_free_blocks() == 6


def test_allocation_evicts_lru_and_emits_events():
    p = pool(4)
    blocks = p.get_new_blocks(3)
    req = cached_request(list(range(12)), [b"a", b"b", b"c"])
    p.cache_full_blocks(req, blocks, 0, 3, 4, 0)
    stored = p.take_events()
    assert len(stored) == 1 and isinstance(stored[0], BlockStored)
    assert stored[0].block_hashes == [external_block_hash(h, True) for h in (b"a", b"b", b"c")]
    assert stored[0].parent_block_hash is None and stored[0].token_ids == list(range(12))
    p.free_blocks(reversed(blocks))  # queue: 3 2 1 (tail block evicted first)
    new = p.get_new_blocks(2)
    assert [b.block_id for b in new] == [3, 2]
    events = p.take_events()
    assert [type(e) for e in events] == [BlockRemoved, BlockRemoved]
    assert [e.block_hashes for e in events] == [[external_block_hash(b"c", True)],
                                                [external_block_hash(b"b", True)]]
    assert p.get_cached_block(b"a", [0]) is not None
    assert p.get_cached_block(b"b", [0]) is None


def test_identical_blocks_are_not_deduplicated():
    p = pool()
    b1, b2 = p.get_new_blocks(2)
    p.cache_full_blocks(cached_request([0] * 4, [b"h"]), [b1], 0, 1, 4, 0)
    p.cache_full_blocks(cached_request([0] * 4, [b"h"]), [b2], 0, 1, 4, 0)
    key = make_block_hash_with_group_id(b"h", 0)
    assert b1.block_hash == b2.block_hash == key
    # A lookup returns the first cached one; evicting it exposes the second.
    assert p.get_cached_block(b"h", [0]) == [b1]
    p.evict_blocks([b1.block_id])
    assert p.get_cached_block(b"h", [0]) == [b2]


def test_evict_blocks_keeps_them_allocated():
    p = pool()
    (b,) = p.get_new_blocks(1)
    p.cache_full_blocks(cached_request([0] * 4, [b"h"]), [b], 0, 1, 4, 0)
    p.evict_blocks([b.block_id])
    assert b.block_hash is None and b.ref_cnt == 1
    with pytest.raises(ValueError):
        p.evict_blocks([99])


def test_reset_refused_while_held_then_clears_everything():
    p = pool()
    blocks = p.get_new_blocks(2)
    p.cache_full_blocks(cached_request(list(range(8)), [b"x", b"y"]), blocks, 0, 2, 4, 0)
    p.take_events()
    assert p.reset_prefix_cache() is False
    p.free_blocks(reversed(blocks))
    assert p.reset_prefix_cache() is True
    assert all(b.block_hash is None for b in p.blocks)
    assert p.get_cached_block(b"x", [0]) is None
    assert [type(e) for e in p.take_events()] == [AllBlocksCleared]


def test_usage_excludes_the_null_block():
    p = pool(5)
    p.get_new_blocks(1)
    assert p.get_usage() == pytest.approx(0.25)
    with pytest.raises(ValueError):
        p.get_new_blocks(4)
