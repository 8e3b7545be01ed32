import tracemalloc

import pytest

from impl.block import KVCacheBlock
from impl.free_queue import FreeKVCacheBlockQueue


def make(n):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_initial_order_is_block_id_order():
    _, q = make(5)
    assert q.block_ids() == [0, 1, 2, 3, 4]
    assert q.num_free_blocks == 5


def test_popleft_remove_append_prepend():
    blocks, q = make(6)
    assert q.popleft() is blocks[0]
    q.remove(blocks[3])  # from the middle
    assert q.block_ids() == [1, 2, 4, 5]
    q.append(blocks[3])
    q.prepend_n([blocks[0]])
    assert q.block_ids() == [0, 1, 2, 4, 5, 3]
    assert [b.block_id for b in q.popleft_n(3)] == [0, 1, 2]
    assert q.block_ids() == [4, 5, 3]
    assert q.num_free_blocks == 3
    q.prepend_n([blocks[0], blocks[1]])  # prepend keeps the given order
    q.append_n([blocks[2]])
    assert q.block_ids() == [0, 1, 4, 5, 3, 2]
    assert q.num_free_blocks == 6


def test_popped_blocks_are_unlinked():
    blocks, q = make(3)
    b = q.popleft()
    assert b.prev_free_block is None and b.next_free_block is None
    with pytest.raises(RuntimeError):
        q.remove(b)


def test_pop_from_empty_raises():
    _, q = make(1)
    q.popleft()
    with pytest.raises(ValueError):
        q.popleft()
    with pytest.raises(AssertionError):  # vLLM asserts too
        q.popleft_n(1)
    assert q.block_ids() == [] and q.popleft_n(0) == []


def test_empty_queue_links_the_sentinels():
    q = FreeKVCacheBlockQueue([])
    assert q.fake_free_list_head.next_free_block is q.fake_free_list_tail
    assert q.fake_free_list_tail.prev_free_block is q.fake_free_list_head
    assert q.get_all_free_blocks() == [] and q.num_free_blocks == 0


@pytest.mark.parametrize("op", ["append", "append_n", "prepend_n"])
def test_a_corrupted_queue_is_refused_before_anything_changes(op):
    """vLLM's own test breaks the tail sentinel and expects an AssertionError
    (not an AttributeError from half-done relinking) and an untouched queue."""
    blocks = [KVCacheBlock(i) for i in range(2)]
    q = FreeKVCacheBlockQueue([])
    sentinel = "fake_free_list_head" if op == "prepend_n" else "fake_free_list_tail"
    link = "next_free_block" if op == "prepend_n" else "prev_free_block"
    setattr(getattr(q, sentinel), link, None)
    with pytest.raises(AssertionError):
        getattr(q, op)(blocks[0] if op == "append" else blocks[:1])
    assert q.num_free_blocks == 0
    assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None


def test_block_hash_set_and_reset():
    b = KVCacheBlock(3)
    b.set_block_hash(b"key", num_tokens=16)
    assert (b.block_hash, b.block_hash_num_tokens) == (b"key", 16)
    with pytest.raises(AssertionError):
        b.set_block_hash(b"other")
    assert b.block_hash == b"key"
    b.reset_hash()
    assert b.block_hash is None and b.block_hash_num_tokens is None
    b.set_block_hash(b"other")
    assert b.block_hash == b"other" and b.block_hash_num_tokens is None
    assert not hasattr(b, "__dict__")
    assert KVCacheBlock(0, is_null=True).is_null


def _peak_growth(body, rounds: int) -> int:
    """Peak traced memory while calling body() `rounds` times, above the start."""
    it = iter(range(rounds))
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    for _ in it:
        body()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak - start


def test_single_block_operations_allocate_nothing():
    blocks, q = make(64)
    a, b = blocks[10], blocks[20]
    remove, append, popleft = q.remove, q.append, q.popleft

    def body():
        remove(a)
        append(a)
        remove(b)
        append(b)
        append(popleft())

    # Relinking rewrites attributes of existing blocks: no object is created,
    # not even a transient one, however many operations run. (Best of three:
    # another thread, e.g. a test runner's, may allocate during one window; an
    # allocating operation would show in every window.)
    baseline = min(_peak_growth(lambda: None, 3000) for _ in range(3))
    assert min(_peak_growth(body, 3000) for _ in range(3)) <= baseline
    assert q.num_free_blocks == 64
