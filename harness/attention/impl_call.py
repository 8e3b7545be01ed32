"""impl's kernels called for any attention kind (kinds.py): the one place that
turns a kind into kernel arguments, so the kernel tests, the trace
differential and ci/gpu_check.py all run impl the same way.

MLA: the cache is one latent row per token; attention reads it as the key and
its first kv_lora_rank elements as the value; writes go through
concat_and_cache_mla. Static sinks: the batch's table gets the sink blocks in
front (impl.attention_batch.with_static_sinks), as vLLM's sink layers do.
"""

from __future__ import annotations

import torch

from harness.attention.kinds import AttentionKind
from impl.attention_batch import AttentionBatch, with_static_sinks
from impl.kernels.concat_and_cache_mla import concat_and_cache_mla
from impl.kernels.reshape_and_cache import reshape_and_cache
from impl.kernels.unified_attention import unified_attention
from impl.kv_cache_tensors import LayerKVCache


def impl_write(key: torch.Tensor, value: torch.Tensor | None, cache: LayerKVCache,
               slots: torch.Tensor, kind: AttentionKind, kv_cache_dtype: str = "auto",
               k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None
               ) -> None:
    """key (MLA: the latent rows), value: [tokens, kv heads, head_size]."""
    if kind.is_mla:
        latent = key.shape[2] - kind.mla_rope_dim
        concat_and_cache_mla(key[:, 0, :latent], key[:, 0, latent:], cache.raw, slots)
        return
    reshape_and_cache(key, value, cache.key, cache.value, slots, kv_cache_dtype,
                      k_scale, v_scale)


def impl_attention(query: torch.Tensor, cache: LayerKVCache, out: torch.Tensor,
                   batch: AttentionBatch, scale: float, kind: AttentionKind,
                   kv_cache_dtype: str = "auto", k_scale: torch.Tensor | None = None,
                   v_scale: torch.Tensor | None = None, block_m: int | None = None,
                   tile_n: int | None = None, sink_block: int = 1) -> torch.Tensor:
    """out: [tokens, heads, head_size_v] (MLA: kv_lora_rank wide)."""
    dev = query.device
    value = cache.value
    if kind.is_mla:
        value = cache.key[..., :kind.head_size_v(cache.key.shape[3])]
    if kind.sink_len:
        batch = with_static_sinks(batch, kind.sink_len, cache.key.shape[1], sink_block)
    slopes = kind.alibi_slopes(query.shape[1])
    sinks = kind.sink_logits(query.shape[1])
    return unified_attention(
        query, cache.key, value, out, batch.query_start_loc, batch.seq_lens,
        batch.block_table, scale, kind.sliding_window, batch.max_query_len,
        kv_cache_dtype, k_scale, v_scale, block_m, tile_n, causal=kind.causal,
        chunk_size=kind.chunk_size, alibi_slopes=None if slopes is None else slopes.to(dev),
        softcap=kind.softcap, sinks=None if sinks is None else sinks.to(dev))
