"""Least recently used, by rank: every use gives a key the next rank, and the
evictable key of lowest rank goes first. Ranks move while a key is pinned;
the evictable keys sit in a min-heap whose stale entries are skipped and,
when they pile up, dropped by a rebuild.

Ranks are pairs: (counter, 0) for a use; with request ranks (0.33,
profile.offload_request_ranks) a running request's positioned chunks take
(its one rank, -position), so its tail goes before its head until the
request's finish re-ranks them as uses."""

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from impl.kv_offload.chunk import Chunk
from impl.kv_offload.policies.base import CachePolicy, prefix_order

# Below this many entries the heap is never rebuilt.
_REBUILD_FLOOR = 64

Rank = tuple[int, int]


@dataclass(slots=True)
class _RunningRequestRank:
    """A request's shared rank, kept in its context; stale once the policy
    that gave it is cleared or another policy reads it."""

    policy: object
    generation: int
    value: int


class LRUCachePolicy(CachePolicy):
    # Whether positioned chunks of a running request share one rank.
    request_ranks = False

    def __init__(self, cache_capacity: int):
        CachePolicy.__init__(self, cache_capacity)
        self.held: dict[bytes, Chunk] = {}
        self.rank: dict[bytes, Rank] = {}
        self.idle: set[bytes] = set()
        self.queue: list[tuple[Rank, bytes]] = []
        self.clock = 0
        self.generation = 0

    def _stamp(self, key: bytes) -> None:
        self.clock += 1
        self.rank[key] = (self.clock, 0)

    def _request_rank(self, ctx) -> int:
        mine = ctx.get_state(_RunningRequestRank)
        if mine is None or mine.policy is not self or mine.generation != self.generation:
            self.clock += 1
            mine = _RunningRequestRank(self, self.generation, self.clock)
            ctx.set_state(mine)
        return mine.value

    def _requeue(self, renewed: list[bytes]) -> None:
        # A long renewal is cheaper as one rebuild than as many pushes.
        if len(renewed) >= max(_REBUILD_FLOOR, len(self.idle) // 4):
            self._rebuild()
            return
        for key in renewed:
            heapq.heappush(self.queue, (self.rank[key], key))
        self._trim()

    def _rebuild(self) -> None:
        self.queue = [(self.rank[key], key) for key in self.idle]
        heapq.heapify(self.queue)

    def _trim(self) -> None:
        if len(self.queue) >= max(_REBUILD_FLOOR, 2 * len(self.idle)):
            self._rebuild()

    def _renew(self, keys_last_first: Iterable[bytes]) -> None:
        renewed = []
        for key in keys_last_first:
            if key in self.held:
                self._stamp(key)
                if key in self.idle:
                    renewed.append(key)
        if renewed:
            self._requeue(renewed)

    def get(self, key: bytes) -> Chunk | None:
        return self.held.get(key)

    def insert(self, key: bytes, chunk: Chunk, req_context=None) -> None:
        self.held[key] = chunk
        position = (None if not self.request_ranks or req_context is None
                    else req_context.get_offload_key_position(key))
        if position is None:
            self._stamp(key)
        else:
            self.rank[key] = (self._request_rank(req_context), -position)
        if chunk.ref_cnt == 0:
            self.idle.add(key)
            heapq.heappush(self.queue, (self.rank[key], key))

    def remove(self, key: bytes) -> None:
        del self.held[key]
        self.rank.pop(key, None)
        self.idle.discard(key)

    def touch(self, keys: Iterable[bytes], req_context) -> None:
        # The first key of a prefix ends up the most recent.
        self._renew(reversed(list(keys)))

    def on_request_access(self, keys: Iterable[bytes], req_context) -> None:
        if not self.request_ranks:
            return
        request_rank = self._request_rank(req_context)
        renewed = []
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None or key not in self.held:
                continue
            # Only upwards: an older request does not demote a newer use.
            rank = (request_rank, -position)
            if self.rank[key] >= rank:
                continue
            self.rank[key] = rank
            if key in self.idle:
                renewed.append(key)
        if renewed:
            self._requeue(renewed)

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys,
                            req_context) -> None:
        self._renew(reversed(prefix_order(key_groups, req_context)))

    def clear(self) -> None:
        self.held.clear()
        self.rank.clear()
        self.idle.clear()
        self.queue.clear()
        self.clock = 0
        self.generation += 1

    def _live(self, entry: tuple[Rank, bytes]) -> bool:
        rank, key = entry
        return key in self.idle and self.rank.get(key) == rank

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        if n == 0:
            return []
        picked: list[tuple[Rank, bytes]] = []
        picked_keys: set[bytes] = set()
        skipped: list[tuple[Rank, bytes]] = []
        while self.queue and len(picked) < n:
            entry = heapq.heappop(self.queue)
            if not self._live(entry) or entry[1] in picked_keys:
                continue
            if entry[1] in protected:
                skipped.append(entry)
                continue
            picked.append(entry)
            picked_keys.add(entry[1])
        if len(picked) < n:
            # Not enough: put every live entry back, change nothing.
            for entry in picked + skipped:
                heapq.heappush(self.queue, entry)
            return None
        for entry in skipped:
            heapq.heappush(self.queue, entry)
        out = []
        for _, key in picked:
            self.idle.remove(key)
            del self.rank[key]
            out.append((key, self.held.pop(key)))
        self._trim()
        return out

    def mark_evictable(self, key: bytes) -> None:
        self.idle.add(key)
        heapq.heappush(self.queue, (self.rank[key], key))
        self._trim()

    def mark_non_evictable(self, key: bytes) -> None:
        self.idle.remove(key)
