"""Least recently used, by rank: every use gives a key the next rank, and the
evictable key of lowest rank goes first. Ranks move while a key is pinned;
the evictable keys sit in a min-heap whose stale entries are skipped and,
when they pile up, dropped by a rebuild."""

import heapq
from collections.abc import Iterable

from impl.kv_offload.chunk import Chunk
from impl.kv_offload.policies.base import CachePolicy, prefix_order

# Below this many entries the heap is never rebuilt.
_REBUILD_FLOOR = 64


class LRUCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int):
        CachePolicy.__init__(self, cache_capacity)
        self.held: dict[bytes, Chunk] = {}
        # (clock, 0) for a plain use; the subclass ranks a request's keys
        # under one clock value, by position (request_lru.py).
        self.rank: dict[bytes, tuple[int, int]] = {}
        self.idle: set[bytes] = set()
        self.queue: list[tuple[tuple[int, int], bytes]] = []
        self.clock = 0

    def _stamp(self, key: bytes) -> None:
        self.clock += 1
        self.rank[key] = (self.clock, 0)

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
        self._requeue(renewed)

    def _requeue(self, renewed: list[bytes]) -> None:
        """Idle keys whose rank changed back into the heap."""
        if not renewed:
            return
        # A long renewal is cheaper as one rebuild than as many pushes.
        if len(renewed) >= max(_REBUILD_FLOOR, len(self.idle) // 4):
            self._rebuild()
            return
        for key in renewed:
            heapq.heappush(self.queue, (self.rank[key], key))
        self._trim()

    def get(self, key: bytes) -> Chunk | None:
        return self.held.get(key)

    def insert(self, key: bytes, chunk: Chunk, req_context=None) -> None:
        self.held[key] = chunk
        self._rank_new(key, req_context)
        if chunk.ref_cnt == 0:
            self.idle.add(key)
            heapq.heappush(self.queue, (self.rank[key], key))

    def _rank_new(self, key: bytes, req_context) -> None:
        self._stamp(key)

    def remove(self, key: bytes) -> None:
        del self.held[key]
        self.rank.pop(key, None)
        self.idle.discard(key)

    def touch(self, keys: Iterable[bytes], req_context) -> None:
        # The first key of a prefix ends up the most recent.
        self._renew(reversed(list(keys)))

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys,
                            req_context) -> None:
        self._renew(reversed(prefix_order(key_groups, req_context)))

    def clear(self) -> None:
        self.held.clear()
        self.rank.clear()
        self.idle.clear()
        self.queue.clear()
        self.clock = 0

    def _live(self, entry: tuple[tuple[int, int], bytes]) -> bool:
        rank, key = entry
        return key in self.idle and self.rank.get(key) == rank

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        if n == 0:
            return []
        picked: list[tuple[tuple[int, int], bytes]] = []
        picked_keys: set[bytes] = set()
        skipped: list[tuple[tuple[int, int], bytes]] = []
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
