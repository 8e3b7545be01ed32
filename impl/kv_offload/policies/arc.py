"""Adaptive replacement: T1 holds chunks seen once, T2 chunks reused; B1 and
B2 remember keys recently evicted from each, and a hit on one of those ghosts
moves the target size of T1 towards the list that would have kept it."""

import collections
from collections.abc import Iterable, Iterator

from impl.kv_offload.chunk import Chunk
from impl.kv_offload.policies.base import CachePolicy, prefix_order


class ARCCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int):
        CachePolicy.__init__(self, cache_capacity)
        self.target_t1_size = 0.0  # a float: the adaptation steps are ratios
        self.t1: collections.OrderedDict[bytes, Chunk] = collections.OrderedDict()
        self.t2: collections.OrderedDict[bytes, Chunk] = collections.OrderedDict()
        self.b1: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.b2: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def get(self, key: bytes) -> Chunk | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def insert(self, key: bytes, chunk: Chunk, req_context=None) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: bytes) -> None:
        for held in (self.t1, self.t2):
            if held.pop(key, None) is not None:
                return

    def _ghost_hit(self, key: bytes) -> None:
        if key in self.b1:
            step = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + step, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            step = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - step, 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[bytes], req_context) -> None:
        for key in list(keys)[::-1]:
            self._ghost_hit(key)

    def touch(self, keys: Iterable[bytes], req_context) -> None:
        for key in list(keys)[::-1]:
            chunk = self.t1.get(key)
            if chunk is not None:
                del self.t1[key]
                # A chunk still being written was not really used twice.
                (self.t2 if chunk.is_ready else self.t1)[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys,
                            req_context) -> None:
        for key in reversed(prefix_order(key_groups, req_context)):
            only_inserted = key in insertion_only_keys
            if only_inserted:
                # Storing is not reuse: recency only, in whichever list it is.
                for held in (self.t1, self.t2):
                    if key in held:
                        held.move_to_end(key)
                        break
            elif key in reused_keys:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.target_t1_size = 0.0

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        if n == 0:
            return []
        # Each list is scanned once, oldest first; victims are chosen before
        # anything changes, so a failure leaves the policy as it was.
        t1_scan = iter(self.t1.items())
        t2_scan = iter(self.t2.items())

        def next_idle(scan: Iterator[tuple[bytes, Chunk]]):
            for key, chunk in scan:
                if key not in protected and chunk.ref_cnt == 0:
                    return key, chunk
            return None

        t1_left = len(self.t1)
        victims: list[tuple[bytes, Chunk, bool]] = []
        for _ in range(n):
            found = None
            if t1_left >= int(self.target_t1_size):
                found = next_idle(t1_scan)
                if found is not None:
                    victims.append((*found, True))
                    t1_left -= 1
                    continue
            found = next_idle(t2_scan)
            if found is not None:
                victims.append((*found, False))
                continue
            found = next_idle(t1_scan)
            if found is None:
                return None
            victims.append((*found, True))
            t1_left -= 1
        out = []
        for key, chunk, from_t1 in victims:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.cache_capacity:
                ghosts.popitem(last=False)
        return out
