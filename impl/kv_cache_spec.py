"""KV cache specs and the KV cache config (vLLM: vllm.v1.kv_cache_interface).

A spec says how one layer stores its KV cache; layers with equal specs form a KV
cache group, and each group gets one single-type manager over the shared pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    block_size: int

    # The `kv_cache_spec_kind` that BlockStored events carry for this group.
    kind = "unknown"


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 1
    dtype_size: int = 4


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    kind = "full_attention"


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = field(default_factory=tuple)
