"""0.33's LRU (specs/KV_OFFLOAD.md, "LRU by request"): a running request's
keys share one rank, taken from the clock when the request first needs one,
and are ordered under it by end-token position, the tail first out; the
request's finish then ranks its keys as plain uses, as before 0.33.

A key whose position the request does not know ranks as a plain use."""

from collections.abc import Iterable
from dataclasses import dataclass

from impl.kv_offload.policies.lru import LRUCachePolicy


@dataclass(slots=True, eq=False)
class _RequestRank:
    """Kept in the request's context; stale once the policy is cleared."""

    policy: object
    generation: int
    rank: int


class RequestRankedLRUCachePolicy(LRUCachePolicy):
    def __init__(self, cache_capacity: int):
        LRUCachePolicy.__init__(self, cache_capacity)
        self.generation = 0

    def _request_rank(self, req_context) -> int:
        mine = req_context.get_state(_RequestRank)
        if mine is None or mine.policy is not self or mine.generation != self.generation:
            self.clock += 1
            mine = _RequestRank(self, self.generation, self.clock)
            req_context.set_state(mine)
        return mine.rank

    def _rank_new(self, key: bytes, req_context) -> None:
        pos = None if req_context is None else req_context.get_offload_key_position(key)
        if pos is None:
            self._stamp(key)
        else:
            self.rank[key] = (self._request_rank(req_context), -pos)

    def on_request_access(self, keys: Iterable[bytes], req_context) -> None:
        # The request's rank is taken even when no key is raised by it.
        shared = self._request_rank(req_context)
        raised = []
        for key in keys:
            pos = req_context.get_offload_key_position(key)
            if pos is None or key not in self.held:
                continue
            rank = (shared, -pos)
            # Only ever raised: a later batch never lowers what an earlier set.
            if self.rank[key] >= rank:
                continue
            self.rank[key] = rank
            if key in self.idle:
                raised.append(key)
        self._requeue(raised)

    def clear(self) -> None:
        LRUCachePolicy.clear(self)
        self.generation += 1
