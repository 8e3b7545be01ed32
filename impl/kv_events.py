"""KV cache events the block pool publishes (vLLM: vllm.distributed.kv_events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    session_id: str | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str | None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
