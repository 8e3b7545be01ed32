"""Paged-attention inputs for kernel tests, small (CPU, interpreter) or
realistic (ci/gpu_check.py): the same builders at any size, for every kind of
kinds.py.

A case lays out a batch of sequences in a KV cache the way the manager would:
distinct random blocks per sequence, the null block (0) standing in for blocks a
sliding window or a past chunk has dropped, every cache element not written NaN
(so a read of a block nobody wrote poisons the output), context tokens written
with plain indexing (independent of impl's reshape_and_cache) and mirrored in
float64. Static sinks occupy the blocks right after the null block. For
cross attention (non-causal) a sequence's seq_len tokens are the encoder's,
all written as "new" keys: the slot mapping covers them, not the queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.attention.kinds import AttentionKind
from harness.attention.reference import MirrorCache, quantize
from impl.attention_batch import AttentionBatch
from impl.block_table import NULL_BLOCK_ID
from impl.kernels.reshape_and_cache import cache_torch_dtype
from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    LayerKVCache,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

FULL = AttentionKind()


@dataclass(frozen=True, slots=True)
class AttentionCase:
    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 32  # MLA: kv_lora_rank + rope dim
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    sliding_window: int | None = None  # shorthand for kind.sliding_window
    layout: KVCacheLayout = KVCacheLayout.LBNHC
    kv_cache_dtype: str = "auto"
    # Spare blocks beyond what the sequences need (never written: NaN).
    spare_blocks: int = 3
    kind: AttentionKind = FULL
    # Standard deviation of queries (keys and values have 1): sets how peaked
    # the softmax is (logit std = query std with the default scale).
    query_std: float = 1.0

    @property
    def attention(self) -> AttentionKind:
        """The kind, with the shorthand window applied."""
        return self.kind.with_window(self.sliding_window) if self.sliding_window else self.kind

    @property
    def sink_blocks(self) -> int:
        return self.kind.sink_len // self.block_size

    @property
    def num_blocks(self) -> int:
        needed = sum(-(-s // self.block_size) for s in self.seq_lens)
        return 1 + self.sink_blocks + needed + self.spare_blocks

    @property
    def scale(self) -> float:
        return self.head_size ** -0.5

    @property
    def head_size_v(self) -> int:
        return self.kind.head_size_v(self.head_size)

    @property
    def cache_shape(self) -> KVCacheShape:
        kv_heads = 1 if self.kind.is_mla else self.num_kv_heads
        return KVCacheShape(self.block_size, kv_heads, self.head_size,
                            cache_torch_dtype(self.kv_cache_dtype, self.dtype),
                            mla=self.kind.is_mla)


@dataclass(slots=True)
class PagedInputs:
    case: AttentionCase
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    # The keys and values the batch writes (MLA: latent rows as key, value None):
    new_key: torch.Tensor  # [num_new, num_kv_heads, head_size]
    new_value: torch.Tensor | None
    cache: LayerKVCache
    mirror: MirrorCache
    batch: AttentionBatch  # its slot_mapping: where new_key/new_value go
    # Scale of an fp8 cache (ones otherwise).
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    # Every row the case puts in the cache (sinks, context and new tokens),
    # before any fp8 rounding: (slots, key, value), for another backend's
    # cache to be written with its own ops.
    all_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None


def _randn(g: torch.Generator, shape: Sequence[int], std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32) * std


def build_case(case: AttentionCase, device: str = "cpu", seed: int = 0,
               write_new: bool = True) -> PagedInputs:
    """The batch's context tokens are in the cache; with write_new the new
    tokens' keys and values are too (else they wait for reshape_and_cache:
    the mirror has them either way)."""
    if len(case.query_lens) != len(case.seq_lens):
        raise ValueError("one query length per sequence")
    kind = case.attention
    g = torch.Generator().manual_seed(seed)
    bs = case.block_size
    shape = case.cache_shape
    hk, d = shape.num_kv_heads, case.head_size
    plan = plan_kv_cache_tensors(["layer"], case.num_blocks, shape, case.layout)
    cache = allocate_kv_cache(plan, case.num_blocks, shape, case.layout, device,
                              fill=float("nan"))["layer"]
    fp8 = case.kv_cache_dtype != "auto"
    k_scale = torch.tensor([0.5 if fp8 else 1.0], device=device)
    v_scale = torch.tensor([0.25 if fp8 else 1.0], device=device)
    mirror = MirrorCache(case.num_blocks, bs, hk, d, case.kv_cache_dtype,
                         float(k_scale), float(v_scale), device)
    value_of = (lambda n: None) if kind.is_mla else (lambda n: _randn(g, (n, hk, d)))

    first_free = 1 + case.sink_blocks
    all_rows = []
    if kind.sink_len:
        slots = torch.arange(bs, bs + kind.sink_len)
        k, v = _randn(g, (kind.sink_len, hk, d)).to(case.dtype), value_of(kind.sink_len)
        v = None if v is None else v.to(case.dtype)
        mirror.write(k, v, slots)
        _store(cache, slots // bs, slots % bs, k, v, case, k_scale, v_scale, device)
        all_rows.append((slots, k, v))
    free = (torch.randperm(case.num_blocks - first_free, generator=g) + first_free).tolist()
    width = max(-(-s // bs) for s in case.seq_lens)
    table = torch.full((len(case.seq_lens), width), NULL_BLOCK_ID, dtype=torch.int32)
    queries, new_keys, new_values, new_slots = [], [], [], []
    for i, (q_len, seq_len) in enumerate(zip(case.query_lens, case.seq_lens, strict=True)):
        if q_len <= 0 or seq_len <= 0 or (kind.causal and q_len > seq_len):
            raise ValueError(f"sequence {i}: query length {q_len}, length {seq_len}")
        context = seq_len - q_len if kind.causal else 0
        # Blocks wholly before the first query's window or chunk: dropped (null).
        first_visible = 0
        if kind.sliding_window:
            first_visible = max(0, context - kind.sliding_window + 1)
        if kind.chunk_size:
            first_visible = max(first_visible, context // kind.chunk_size * kind.chunk_size)
        for j in range(-(-seq_len // bs)):
            if (j + 1) * bs > first_visible:
                table[i, j] = free.pop()
        positions = torch.arange(first_visible, seq_len)
        blocks = table[i, positions // bs].long()
        offsets = positions % bs
        k = _randn(g, (len(positions), hk, d)).to(case.dtype)
        v = value_of(len(positions))
        v = None if v is None else v.to(case.dtype)
        mirror.write(k, v, blocks * bs + offsets)
        all_rows.append((blocks * bs + offsets, k, v))
        new = positions >= context
        stored = ~new if not write_new else positions >= 0
        _store(cache, blocks[stored], offsets[stored], k[stored],
               None if v is None else v[stored], case, k_scale, v_scale, device)
        queries.append(_randn(g, (q_len, case.num_heads, d), case.query_std).to(case.dtype))
        new_keys.append(k[new])
        new_values.append(None if v is None else v[new])
        new_slots.append((blocks * bs + offsets)[new])

    qsl = torch.zeros(len(case.query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(case.query_lens).cumsum(0)
    batch = AttentionBatch(qsl.to(device), torch.tensor(case.seq_lens, dtype=torch.int32,
                                                        device=device),
                           table.to(device), torch.cat(new_slots).to(device),
                           max(case.query_lens), max(case.seq_lens))
    values = None if kind.is_mla else torch.cat(new_values).to(device)
    rows = (torch.cat([r[0] for r in all_rows]), torch.cat([r[1] for r in all_rows]),
            None if kind.is_mla else torch.cat([r[2] for r in all_rows]))
    return PagedInputs(case, torch.cat(queries).to(device), torch.cat(new_keys).to(device),
                       values, cache, mirror, batch, k_scale, v_scale, rows)


def _store(cache: LayerKVCache, blocks, offsets, k, v, case: AttentionCase,
           k_scale: torch.Tensor, v_scale: torch.Tensor, device: str) -> None:
    """Plain indexing writes, as the cache holds them (fp8: x / scale, rounded
    to nearest by torch's cast)."""
    blocks, offsets = blocks.to(device), offsets.to(device)
    if case.kv_cache_dtype != "auto":
        k = quantize(k, case.kv_cache_dtype, float(k_scale)) / float(k_scale)
        v = None if v is None else quantize(v, case.kv_cache_dtype, float(v_scale)) \
            / float(v_scale)
    cache.key[blocks, offsets] = k.to(device).to(cache.key.dtype)
    if v is not None:
        cache.value[blocks, offsets] = v.to(device).to(cache.value.dtype)
