"""Invariants of a KV cache manager's state, checkable after every operation.

They catch impl bugs at the operation that causes them, long before a diverging
block id would show up; the fuzzer runs them after every call.
"""

from __future__ import annotations

from impl.kv_cache_manager import KVCacheManager


class InvariantViolation(AssertionError):
    pass


def check_invariants(manager: KVCacheManager) -> None:
    """Raise InvariantViolation naming the first broken invariant (stateless
    checks only; InvariantChecker adds the ones that need history).

    Written to be cheap enough to run after every operation of a fuzz run: one
    walk of the free queue, one of the held blocks and a few passes over the
    pool in comprehensions; messages are built only on failure.
    """
    pool = manager.block_pool
    queue = pool.free_block_queue
    blocks = pool.blocks

    # The free queue is a well-formed list: links agree both ways, its length is
    # num_free_blocks, and no block appears twice.
    in_queue: set[int] = set()
    add = in_queue.add
    prev, block, tail = queue.fake_free_list_head, queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail
    n = 0
    while block is not tail:
        if block is None:
            raise InvariantViolation("free queue is broken: a link is None")
        if block.prev_free_block is not prev:
            raise InvariantViolation(f"free queue back-link of block {block.block_id} is wrong")
        add(block.block_id)
        n += 1
        if n > len(blocks):
            raise InvariantViolation("free queue has a cycle")
        prev, block = block, block.next_free_block
    if tail.prev_free_block is not prev:
        raise InvariantViolation("free queue tail back-link is wrong")
    if len(in_queue) != n:
        raise InvariantViolation("a block is in the free queue twice")
    if n != queue.num_free_blocks:
        raise InvariantViolation(f"num_free_blocks={queue.num_free_blocks} but the queue "
                                 f"holds {n}")

    null = pool.null_block
    if null.block_id in in_queue:
        raise InvariantViolation("the null block is in the free queue")
    if null.block_hash is not None:
        raise InvariantViolation("the null block is cached")

    # Blocks set aside for good (0.17's attention sinks) are neither free nor held.
    reserved = {
        b.block_id
        for m in manager.coordinator.single_type_managers
        for b in getattr(m, "sink_blocks", ())
    }

    # A block is in the free queue iff nobody references it.
    for block_id in in_queue:
        if blocks[block_id].ref_cnt != 0:
            b = blocks[block_id]
            raise InvariantViolation(f"block {block_id} ref_cnt={b.ref_cnt} but in the free queue")
    refs = [b.ref_cnt for b in blocks]
    refs[null.block_id] = 0  # the null block's count is not maintained
    if min(refs) < 0:
        i = min(range(len(refs)), key=refs.__getitem__)
        raise InvariantViolation(f"block {i} has ref_cnt {refs[i]} < 0")
    if refs.count(0) - 1 - len(reserved) != n:
        i = next(i for i, r in enumerate(refs) if r == 0 and i != null.block_id
                 and i not in in_queue and i not in reserved)
        raise InvariantViolation(f"block {i} ref_cnt=0 but not in the free queue")

    # Every reference is a request holding the block (prefix sharing included).
    held: dict[int, int] = {}
    for holders in _holders(manager).values():
        for block_id in holders:
            held[block_id] = held.get(block_id, 0) + 1
    for block_id, count in held.items():
        if refs[block_id] != count:
            raise InvariantViolation(f"block {block_id} has ref_cnt {refs[block_id]} but "
                                     f"{count} request(s) hold it")
    if len(refs) - refs.count(0) != len(held):
        i = next(i for i, r in enumerate(refs) if r > 0 and i not in held)
        raise InvariantViolation(f"block {i} has ref_cnt {refs[i]} but 0 request(s) hold it")

    # The hash map points only at blocks carrying that very key (as their
    # primary hash or a partial entry), and every key of a block is in the map.
    extra_keys = pool.cached_block_hashes_by_block
    mapped = 0
    for key, b in pool.cached_block_hash_to_block.items():
        if b.block_hash != key and key not in extra_keys.get(b.block_id, ()):
            raise InvariantViolation(
                f"hash map entry {key.hex()[:12]} points at block {b.block_id} whose "
                f"hash is {b.block_hash.hex()[:12] if b.block_hash else None}"
            )
        mapped += 1
    for block_id, keys in extra_keys.items():
        if blocks[block_id].block_hash is None:
            raise InvariantViolation(f"block {block_id} has partial keys but no hash")
    num_hashed = sum(b.block_hash is not None for b in blocks) + sum(
        len(k) for k in extra_keys.values()
    )
    if num_hashed != mapped:
        raise InvariantViolation(f"{num_hashed} block keys exist but the map holds {mapped}")
    if not manager.enable_caching and mapped:
        raise InvariantViolation("blocks are cached while caching is disabled")


# Holder names of pending copies (not request ids: those come from traces).
_COPY = "<pending copy>"


def _holders(manager: KVCacheManager) -> dict[str, list[int]]:
    """(group, request) -> ids of the non-null blocks it holds; pending
    copy-on-write copies hold their source and copy until drained."""
    out: dict[str, list[int]] = {}
    for group in manager.coordinator.single_type_managers:
        for req, blocks in group.req_to_blocks.items():
            out[f"{group.kv_cache_group_id}/{req}"] = [
                b.block_id for b in blocks if not b.is_null
            ]
        for i, (src, dst) in enumerate(group._copies):
            out[f"{group.kv_cache_group_id}/{_COPY}{i}"] = [src.block_id, dst.block_id]
    return out


class InvariantChecker:
    """check_invariants plus the invariant that needs to remember the previous
    state: a block is handed to a second request only through a prefix hit.

    A request starts holding a block either by allocation (the block was free, so
    nobody else held it) or by a prefix hit (the block was cached). So whenever a
    block gains a holder while another request holds it, it must be cached right
    after that operation; its hash may be evicted later, which is legitimate.
    """

    def __init__(self) -> None:
        self._previous: dict[int, set[str]] = {}

    def check(self, manager: KVCacheManager) -> None:
        check_invariants(manager)
        current: dict[int, set[str]] = {}
        for holder, block_ids in _holders(manager).items():
            for block_id in block_ids:
                current.setdefault(block_id, set()).add(holder)
        blocks = manager.block_pool.blocks
        for block_id, holders in current.items():
            if len(holders) < 2:
                continue
            # A pending copy shares its blocks legitimately.
            new = {h for h in holders - self._previous.get(block_id, set())
                   if _COPY not in h}
            if new and blocks[block_id].block_hash is None:
                raise InvariantViolation(
                    f"block {block_id} was handed to {sorted(new)} while "
                    f"{sorted(holders - new)} held it, and it is not cached: it was "
                    "shared without a prefix hit"
                )
        self._previous = current
