"""The rules every block pool keeps, whichever manager drives it: a
well-formed free queue, an unkeyed null block outside it, and the messages
naming a broken count or a stale map entry. impl/invariants.py checks the
device pool with them, impl/hisparse/invariants.py each of its two pools.
"""

from impl.block import KVCacheBlock


class InvariantViolation(AssertionError):
    pass


def walk_free_queue(pool) -> set[int]:
    """The free queue is a well-formed list: links agree both ways, no cycle,
    no block twice, as long as num_free_blocks says. Returns its block ids."""
    queue = pool.free_block_queue
    ids: set[int] = set()
    limit = len(pool.blocks)
    behind = queue.fake_free_list_head
    cursor = behind.next_free_block
    end = queue.fake_free_list_tail
    while cursor is not end:
        if cursor is None:
            raise InvariantViolation("free queue is broken: a link is None")
        if cursor.prev_free_block is not behind:
            raise InvariantViolation(
                f"free queue back-link of block {cursor.block_id} is wrong")
        if cursor.block_id in ids:
            raise InvariantViolation(f"block {cursor.block_id} is in the free queue twice")
        ids.add(cursor.block_id)
        if len(ids) > limit:
            raise InvariantViolation("free queue has a cycle")
        behind, cursor = cursor, cursor.next_free_block
    if end.prev_free_block is not behind:
        raise InvariantViolation("free queue tail back-link is wrong")
    if len(ids) != queue.num_free_blocks:
        raise InvariantViolation(
            f"num_free_blocks={queue.num_free_blocks} but the queue holds {len(ids)}")
    return ids


def check_null_block(pool, queued: bool) -> None:
    null = pool.null_block
    if queued:
        raise InvariantViolation("the null block is in the free queue")
    if null.block_hash is not None:
        raise InvariantViolation("the null block is cached")


def count_message(block_id: int, ref_cnt: int, holders: int) -> str:
    return f"block {block_id} has ref_cnt {ref_cnt} but {holders} request(s) hold it"


def keys_of(pool, block: KVCacheBlock) -> set[bytes]:
    keys = set(pool.cached_block_hashes_by_block.get(block.block_id, ()))
    if block.block_hash is not None:
        keys.add(block.block_hash)
    return keys


def stale_entry_message(key: bytes, block: KVCacheBlock) -> str:
    own = block.block_hash.hex()[:12] if block.block_hash else None
    return f"hash map entry {key.hex()[:12]} points at block {block.block_id} whose hash is {own}"
