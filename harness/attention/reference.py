"""The float64 reference: a mirror of the KV cache and attention over it.

The mirror is written with plain tensor indexing from the same slot mapping the
kernels get, and read back through the same block table, so it shares no code
with impl/kernels: a wrong slot, a wrong block-table read or a wrong mask in a
kernel shows up as a difference. Sliding-window semantics are vLLM's: the query
at position p sees keys at positions p - W < t <= p.
"""

from __future__ import annotations

import torch

from impl.attention_batch import AttentionBatch
from impl.kernels.reshape_and_cache import FP8_DTYPES


def quantize(x: torch.Tensor, kv_cache_dtype: str, scale: float = 1.0) -> torch.Tensor:
    """What a cache of kv_cache_dtype holds for x, as float64: x itself, or x
    / scale saturated and rounded to the fp8 grid (torch's cast), times scale."""
    if kv_cache_dtype == "auto":
        return x.to(torch.float64)
    fp8, (_, _, max_val) = FP8_DTYPES[kv_cache_dtype]
    q = (x.to(torch.float32) / scale).clamp(-max_val, max_val).to(fp8)
    return q.to(torch.float64) * scale


class MirrorCache:
    """float64 [num_blocks, block_size, num_kv_heads, head_size] key and value."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_size: int, kv_cache_dtype: str = "auto",
                 k_scale: float = 1.0, v_scale: float = 1.0,
                 device: torch.device | str = "cpu") -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        # NaN until written: reading a slot nobody wrote poisons the result.
        self.key = torch.full(shape, float("nan"), dtype=torch.float64, device=device)
        self.value = torch.full(shape, float("nan"), dtype=torch.float64, device=device)
        self.device = self.key.device
        self.block_size = block_size
        self.kv_cache_dtype, self.k_scale, self.v_scale = kv_cache_dtype, k_scale, v_scale

    def write(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        slots = slot_mapping.to(self.device)
        keep = slots >= 0
        flat_k = self.key.view(-1, *self.key.shape[2:])
        flat_v = self.value.view(-1, *self.value.shape[2:])
        n = slots.shape[0]
        key, value = key[:n].to(self.device), value[:n].to(self.device)
        flat_k[slots[keep]] = quantize(key[keep], self.kv_cache_dtype, self.k_scale)
        flat_v[slots[keep]] = quantize(value[keep], self.kv_cache_dtype, self.v_scale)

    def gather(self, block_row: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value [len(positions), num_kv_heads, head_size] of one
        request whose block table row is block_row."""
        positions = positions.to(self.device)
        blocks = block_row.to(self.device).long()[positions // self.block_size]
        offsets = positions % self.block_size
        return self.key[blocks, offsets], self.value[blocks, offsets]


def reference_attention(
    query: torch.Tensor, cache: MirrorCache, batch: AttentionBatch, scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """float64 [num_actual_tokens, num_heads, head_size], on the mirror's device."""
    qsl = batch.query_start_loc.cpu().tolist()
    seq_lens = batch.seq_lens.cpu().tolist()
    num_heads, head_size = query.shape[1], query.shape[2]
    dev = cache.device
    out = torch.empty(qsl[-1], num_heads, head_size, dtype=torch.float64, device=dev)
    for i, seq_len in enumerate(seq_lens):
        start, end = qsl[i], qsl[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        context = seq_len - q_len
        lo = max(0, context - sliding_window + 1) if sliding_window else 0
        positions = torch.arange(lo, seq_len, device=dev)
        k, v = cache.gather(batch.block_table[i], positions)
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].to(dev, torch.float64)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(context, seq_len, device=dev)[:, None]
        visible = positions[None, :] <= q_pos
        if sliding_window:
            visible &= q_pos - positions[None, :] < sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out
