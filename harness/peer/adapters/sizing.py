"""vLLM's KV cache sizing names (kv_cache_utils) over impl.kv_cache_sizing."""

from __future__ import annotations

REBOUND: tuple[str, ...] = ()
