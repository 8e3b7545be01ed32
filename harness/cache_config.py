"""The cache configuration a trace (or a test, or the fuzzer) runs the KV cache
manager with. Both backends build their manager from it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One KV cache group: its attention kind and block size."""

    block_size: int
    kind: str = "full_attention"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    num_blocks: int
    groups: tuple[GroupConfig, ...] = field(default_factory=lambda: (GroupConfig(16),))
    hash_algo: str = "sha256"
    # PYTHONHASHSEED for the NONE_HASH seed; None reproduces vLLM's unseeded
    # behaviour, which for some versions/algorithms is random (not replayable).
    hash_seed: str | None = "0"
    enable_caching: bool = True
    max_model_len: int = 1 << 16
    log_stats: bool = True
    enable_kv_cache_events: bool = True
    # KV events publish hashes as 64-bit ints (vLLM's default) or raw bytes.
    events_use_int_hashes: bool = True
    watermark: float = 0.0

    @property
    def block_size(self) -> int:
        """The block size of the (first) group; the hash block size for now."""
        return self.groups[0].block_size

    @property
    def hash_block_size(self) -> int:
        return min(g.block_size for g in self.groups)
