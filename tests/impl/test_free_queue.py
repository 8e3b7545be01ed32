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
    with pytest.raises(ValueError):
        q.popleft_n(1)
    assert q.block_ids() == []


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
