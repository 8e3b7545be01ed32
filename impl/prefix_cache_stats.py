"""Prefix-cache hit statistics (vLLM: PrefixCacheStats)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    requests: int = 0
    queries: int = 0
    hits: int = 0
    # The same counts for requests looked up again after a preemption.
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    # Whether reset_prefix_cache succeeded since the last snapshot.
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def as_dict(self) -> dict:
        return asdict(self)
