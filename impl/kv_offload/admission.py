"""The store threshold: a block is written to the CPU tier only once it has
been offered `threshold` times. Offers are counted in a bounded map, oldest
entries dropped first (specs/KV_OFFLOAD.md, "The store threshold")."""

import collections
from collections.abc import Sequence


class OfferCounter:
    __slots__ = ("threshold", "capacity", "counts")

    def __init__(self, threshold: int, capacity: int) -> None:
        self.threshold = threshold
        self.capacity = capacity
        self.counts: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    def record(self, keys: Sequence[bytes]) -> None:
        counts = self.counts
        bumped: set[bytes] = set()
        for key in keys:
            if key in counts:
                counts[key] += 1
                counts.move_to_end(key)
                bumped.add(key)
        # Keys bumped by this very offer are never dropped to admit its new ones.
        droppable = len(counts) - len(bumped)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.capacity:
                if droppable <= 0:
                    continue
                counts.popitem(last=False)
                droppable -= 1
            counts[key] = 1

    def admits(self, key: bytes) -> bool:
        return self.counts.get(key, 0) >= self.threshold
