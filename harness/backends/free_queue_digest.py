"""The free queue's order as one number, kept up to date as the queue changes.

A checkpoint's `free_queue` is a list of every free block: at a million blocks,
a list of a million ids at every free, on both sides. `free_queue_digest`
answers the same question in O(1): the queue is the chain head -> b1 -> ... ->
bn -> tail, and the digest is the sum, modulo 2^64, of `link(a, b)` over its n+1
links (specs/TRACE_FORMAT.md defines `link`). Two queues with the same links
are the same list in the same order; a link is a 64-bit mix of its two ends, so
two different orders share a digest only by a 64-bit coincidence.

Both backends' queues keep vLLM's shape (FreeKVCacheBlockQueue: sentinel blocks
`fake_free_list_head`/`fake_free_list_tail`, blocks linked through
`prev_free_block`/`next_free_block`), so the same code tracks both: the queue
object is given a subclass whose mutating methods take the links they break
off the running sum and add the links they make, read from the blocks after
the call (what the queue really did, not what it was asked to do). A method
of the queue this module does not know marks the digest stale: the next read
walks the whole queue once.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
# Node codes: the sentinels, then block b as b + 2.
_HEAD, _TAIL = 0, 1
# Methods that only read the queue.
_READERS = frozenset({"get_all_free_blocks", "block_ids"})


def link(a: int, b: int) -> int:
    """The value of the link from node code a to node code b (splitmix64 of
    the pair packed into 64 bits)."""
    z = ((a << 32 | b) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def digest_of_ids(block_ids: list[int]) -> str:
    """The digest of a free queue given as its block ids, head first."""
    total, prev = 0, _HEAD
    for b in block_ids:
        total += link(prev, b + 2)
        prev = b + 2
    return f"{(total + link(prev, _TAIL)) & _MASK:016x}"


class _State:
    __slots__ = ("total", "stale")

    def __init__(self) -> None:
        self.total = 0
        self.stale = True


def _walk_total(head, tail) -> int:
    total, code_prev, block = 0, _HEAD, head.next_free_block
    while block is not None and block is not tail:
        code = block.block_id + 2
        total += link(code_prev, code)
        code_prev, block = code, block.next_free_block
    return total + link(code_prev, _TAIL)


def track(queue) -> _State:
    """Keep `queue`'s digest from now on (once per queue); its state."""
    state = getattr(type(queue), "_kvconform_digest", None)
    if state is not None:
        return state
    base = type(queue)
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    state = _State()

    def code(block) -> int:
        if block is head:
            return _HEAD
        if block is tail:
            return _TAIL
        return block.block_id + 2

    def chain(start, links: int) -> int:
        """The sum of up to `links` links from `start` forward."""
        total, a = 0, start
        for _ in range(links):
            b = a.next_free_block
            if b is None:
                break
            total += link(code(a), code(b))
            if b is tail:
                break
            a = b
        return total

    def changed(anchor, before: int, mutate, *args):
        """Run `mutate`; the links after `anchor` it rewrote: `before` of them
        before the call, the queue's growth + 1 after it."""
        gone = chain(anchor, before)
        n0 = queue.num_free_blocks
        try:
            result = mutate(queue, *args)
        except BaseException:
            state.stale = True
            raise
        state.total += chain(anchor, max(queue.num_free_blocks - n0, 0) + 1) - gone
        return result

    def popleft(self):
        return changed(head, 2, base.popleft)

    def popleft_n(self, n):
        return changed(head, n + 1, base.popleft_n, n)

    def remove(self, block):
        before = block.prev_free_block
        if before is None:  # not queued: the queue's own error
            return base.remove(self, block)
        return changed(before, 2, base.remove, block)

    def append(self, block):
        return changed(tail.prev_free_block, 1, base.append, block)

    def append_n(self, blocks):
        return changed(tail.prev_free_block, 1, base.append_n, blocks)

    def prepend_n(self, blocks):
        return changed(head, 1, base.prepend_n, blocks)

    known = {"popleft": popleft, "popleft_n": popleft_n, "remove": remove,
             "append": append, "append_n": append_n, "prepend_n": prepend_n}
    namespace: dict = {"__slots__": (), "_kvconform_digest": state}
    for name in dir(base):
        if name.startswith("_") or name in _READERS:
            continue
        if not callable(getattr(base, name)):
            continue
        if name in known:
            namespace[name] = known[name]
        else:
            namespace[name] = _staling(getattr(base, name), state)
    queue.__class__ = type(base.__name__, (base,), namespace)
    return state


def _staling(method, state: _State):
    def call(self, *args, **kwargs):
        state.stale = True
        return method(self, *args, **kwargs)
    return call


def free_queue_digest(queue) -> str:
    """The digest of `queue` (16 hex digits), tracked from the first call on."""
    state = track(queue)
    if state.stale:
        state.total = _walk_total(queue.fake_free_list_head, queue.fake_free_list_tail)
        state.stale = False
    return f"{state.total & _MASK:016x}"
