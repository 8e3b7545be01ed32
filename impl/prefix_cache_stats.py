"""Prefix-cache hit counters (vLLM's name: PrefixCacheStats); specs/KV_CACHE_MANAGER.md §8."""

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    requests: int = 0
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found cached
    # Lookups of requests coming back after a preemption, counted apart: a
    # resumed request mostly finds its own blocks and would inflate the rate.
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    # A reset_prefix_cache succeeded since the previous snapshot.
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    def as_dict(self) -> dict:
        return asdict(self)
