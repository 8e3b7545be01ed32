"""The float64 reference: a mirror of the KV cache and attention over it.

The mirror is written with plain tensor indexing from the same slot mapping the
kernels get, and read back through the block table, so it shares no code with
impl/kernels: a wrong slot, a wrong block-table read or a wrong mask in a kernel
shows up as a difference. Every kind of harness/attention/kinds.py is computed
here from its definition, position by position (static sinks are read from
their own blocks, not through a shifted table; MLA's values are the first
kv_lora_rank elements of the latent row).

Besides the output, the reference returns what the error model of
specs/ATTENTION.md needs per output element (tolerances.py): the magnitude of
the terms summed into it (`mix` = sum_i p_i |v_i|), their random-walk size
(`spread` = sqrt(sum_i p_i^2 v_i^2)), the largest logit magnitude a row sums
(`logit_scale` = max_i scale * sum_j |q_j k_ij| + |bias_i|) and the number of
keys it sees (`num_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.attention.kinds import AttentionKind
from impl.attention_batch import AttentionBatch
from impl.kernels.reshape_and_cache import FP8_DTYPES

FULL = AttentionKind()
# Elements of one float64 [heads, queries, keys] temporary of the reference:
# queries are taken in chunks that keep each temporary about this size.
_CHUNK_ELEMENTS = 1 << 22


def quantize(x: torch.Tensor, kv_cache_dtype: str, scale: float = 1.0,
             rounding: str = "nearest") -> torch.Tensor:
    """What a cache of kv_cache_dtype holds for x, as float64: x itself, or x
    / scale saturated and put on the fp8 grid, times scale. `rounding`:
    "nearest" (ties to even: torch's cast, CUDA, impl) or "toward_zero" (vLLM's
    CPU fp8 cache, which keeps the leading mantissa bits)."""
    if kv_cache_dtype == "auto":
        return x.to(torch.float64)
    fp8, (_, _, max_val) = FP8_DTYPES[kv_cache_dtype]
    y = (x.to(torch.float32) / scale).clamp(-max_val, max_val)
    q = y.to(fp8)
    if rounding == "toward_zero":
        bits = q.view(torch.uint8).to(torch.int16)
        away = q.to(torch.float32).abs() > y.abs()
        # Magnitude bits are monotonic in the value: one step down is toward zero.
        bits = torch.where(away & ((bits & 0x7F) != 0), bits - 1, bits)
        q = bits.to(torch.uint8).view(fp8)
    elif rounding != "nearest":
        raise ValueError(f"unknown rounding '{rounding}'")
    return q.to(torch.float64) * scale


class MirrorCache:
    """float64 [num_blocks, block_size, num_kv_heads, head_size] key and value
    (MLA: the latent rows as `key`, `value` unused)."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_size: int, kv_cache_dtype: str = "auto",
                 k_scale: float = 1.0, v_scale: float = 1.0,
                 device: torch.device | str = "cpu", rounding: str = "nearest") -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        # NaN until written: reading a slot nobody wrote poisons the result.
        self.key = torch.full(shape, float("nan"), dtype=torch.float64, device=device)
        self.value = torch.full(shape, float("nan"), dtype=torch.float64, device=device)
        self.device = self.key.device
        self.block_size = block_size
        self.kv_cache_dtype, self.k_scale, self.v_scale = kv_cache_dtype, k_scale, v_scale
        self.rounding = rounding

    def write(self, key: torch.Tensor, value: torch.Tensor | None,
              slot_mapping: torch.Tensor) -> None:
        slots = slot_mapping.to(self.device)
        keep = slots >= 0
        n = slots.shape[0]
        flat_k = self.key.view(-1, *self.key.shape[2:])
        key = key[:n].to(self.device)
        flat_k[slots[keep]] = quantize(key[keep], self.kv_cache_dtype, self.k_scale,
                                       self.rounding)
        if value is not None:
            flat_v = self.value.view(-1, *self.value.shape[2:])
            value = value[:n].to(self.device)
            flat_v[slots[keep]] = quantize(value[keep], self.kv_cache_dtype, self.v_scale,
                                           self.rounding)

    def gather(self, block_row: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value [len(positions), num_kv_heads, head_size] of one
        request whose block table row is block_row."""
        positions = positions.to(self.device)
        blocks = block_row.to(self.device).long()[positions // self.block_size]
        offsets = positions % self.block_size
        return self.key[blocks, offsets], self.value[blocks, offsets]

    def gather_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = slots.to(self.device).long()
        b, o = slots // self.block_size, slots % self.block_size
        return self.key[b, o], self.value[b, o]


@dataclass(slots=True)
class ReferenceOutput:
    """float64, on the mirror's device; [tokens, heads, head_size_v] unless noted."""

    out: torch.Tensor
    mix: torch.Tensor  # sum_i p_i |v_i|
    spread: torch.Tensor  # sqrt(sum_i p_i^2 v_i^2)
    logit_scale: torch.Tensor  # [tokens, heads]
    num_keys: torch.Tensor  # [tokens, heads]


def reference(query: torch.Tensor, cache: MirrorCache, batch: AttentionBatch, scale: float,
              kind: AttentionKind = FULL, sink_block: int = 1) -> ReferenceOutput:
    """The batch's attention in float64 with its error-model scales. `batch`
    is the plain one (no sink blocks in its table): static sinks are read
    from block sink_block on."""
    qsl = batch.query_start_loc.cpu().tolist()
    seq_lens = batch.seq_lens.cpu().tolist()
    num_heads, head_size = query.shape[1], query.shape[2]
    dv = kind.head_size_v(head_size)
    dev = cache.device
    tokens = qsl[-1]
    out = torch.empty(tokens, num_heads, dv, dtype=torch.float64, device=dev)
    mix, spread = torch.empty_like(out), torch.empty_like(out)
    logit_scale = torch.empty(tokens, num_heads, dtype=torch.float64, device=dev)
    num_keys = torch.empty_like(logit_scale)
    slopes = kind.alibi_slopes(num_heads)
    sinks = kind.sink_logits(num_heads)
    for i, seq_len in enumerate(seq_lens):
        start, end = qsl[i], qsl[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k, v, key_pos = _keys(cache, batch.block_table[i], seq_len, q_len, kind, sink_block)
        if kind.is_mla:
            v = k[..., :dv]
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // (num_heads * k.shape[0]))
        for c0 in range(0, q_len, rows_per_chunk):
            c1 = min(q_len, c0 + rows_per_chunk)
            q = query[start + c0:start + c1].to(dev, torch.float64)
            q_pos = torch.arange(seq_len - q_len + c0, seq_len - q_len + c1, device=dev)
            res = _attend(q, k, v, key_pos, q_pos, scale, kind, slopes, sinks)
            rows = slice(start + c0, start + c1)
            out[rows], mix[rows], spread[rows], logit_scale[rows], num_keys[rows] = res
    return ReferenceOutput(out, mix, spread, logit_scale, num_keys)


def reference_attention(query: torch.Tensor, cache: MirrorCache, batch: AttentionBatch,
                        scale: float, sliding_window: int | None = None,
                        kind: AttentionKind | None = None) -> torch.Tensor:
    """The output alone, float64 [num_actual_tokens, num_heads, head_size_v]."""
    if kind is None:
        kind = FULL.with_window(sliding_window)
    return reference(query, cache, batch, scale, kind).out


def _keys(cache: MirrorCache, block_row: torch.Tensor, seq_len: int, q_len: int,
          kind: AttentionKind, sink_block: int):
    """Keys and values a sequence's queries may see, and their positions
    (static sinks: -sink_len .. -1, before the sequence's own)."""
    dev = cache.device
    lo = 0
    if kind.causal:
        first_q = seq_len - q_len
        if kind.sliding_window:
            lo = max(0, first_q - kind.sliding_window + 1)
        if kind.chunk_size:
            lo = max(lo, first_q // kind.chunk_size * kind.chunk_size)
    positions = torch.arange(lo, seq_len, device=dev)
    k, v = cache.gather(block_row, positions)
    if kind.sink_len:
        first = sink_block * cache.block_size
        sk, sv = cache.gather_slots(torch.arange(first, first + kind.sink_len))
        k, v = torch.cat([sk, k]), torch.cat([sv, v])
        positions = torch.cat([torch.arange(-kind.sink_len, 0, device=dev), positions])
    return k, v, positions


def _attend(q, k, v, key_pos, q_pos, scale, kind: AttentionKind, slopes, sinks):
    dev = q.device
    terms = torch.einsum("qhd,khd->hqk", q.abs(), k.abs()) * scale
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if kind.softcap:
        scores = kind.softcap * torch.tanh(scores / kind.softcap)
    if slopes is not None:
        bias = slopes.to(dev, torch.float64)[:, None, None] \
            * (key_pos[None, None, :] - q_pos[None, :, None]).to(torch.float64)
        scores = scores + bias
        terms = terms + bias.abs()
    visible = torch.ones(len(q_pos), len(key_pos), dtype=torch.bool, device=dev)
    if kind.causal:
        visible &= key_pos[None, :] <= q_pos[:, None]
    if kind.sliding_window:
        visible &= q_pos[:, None] - key_pos[None, :] < kind.sliding_window
    if kind.chunk_size:
        chunk_start = q_pos // kind.chunk_size * kind.chunk_size
        visible &= (key_pos[None, :] >= chunk_start[:, None]) | (key_pos[None, :] < 0)
    scores = scores.masked_fill(~visible, float("-inf"))
    terms = terms.masked_fill(~visible, 0.0)
    if sinks is not None:
        sink = sinks.to(dev, torch.float64)[:, None, None].expand(-1, len(q_pos), 1)
        scores = torch.cat([scores, sink], dim=-1)
        terms = torch.cat([terms, sink.abs()], dim=-1)
        v_ext = torch.cat([v, torch.zeros_like(v[:1])])
    else:
        v_ext = v
    p = scores.softmax(dim=-1)
    p = p.nan_to_num(0.0)  # a row that sees nothing (never in a valid batch)
    out = torch.einsum("hqk,khd->qhd", p, v_ext)
    mix = torch.einsum("hqk,khd->qhd", p, v_ext.abs())
    spread = torch.einsum("hqk,khd->qhd", p * p, v_ext * v_ext).sqrt()
    logit_scale = terms.amax(dim=-1).transpose(0, 1)
    num_keys = (visible.sum(-1).to(torch.float64) + (sinks is not None))[:, None] \
        .expand(-1, q.shape[1])
    return out, mix, spread, logit_scale, num_keys
