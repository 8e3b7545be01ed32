"""Paged-attention inputs for kernel tests, small (CPU, interpreter) or
realistic (ci/gpu_check.py): the same builders at any size.

A case lays out a batch of sequences in a KV cache the way the manager would:
distinct random blocks per sequence, the null block (0) standing in for blocks a
sliding window has dropped, every cache element not written NaN (so a read of a
block nobody wrote poisons the output), context tokens written with plain
indexing (independent of impl's reshape_and_cache) and mirrored in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.attention.reference import MirrorCache
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


@dataclass(frozen=True, slots=True)
class AttentionCase:
    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 32
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    sliding_window: int | None = None
    layout: KVCacheLayout = KVCacheLayout.LBNHC
    kv_cache_dtype: str = "auto"
    # Spare blocks beyond what the sequences need (never written: NaN).
    spare_blocks: int = 3

    @property
    def num_blocks(self) -> int:
        needed = sum(-(-s // self.block_size) for s in self.seq_lens)
        return 1 + needed + self.spare_blocks

    @property
    def scale(self) -> float:
        return self.head_size ** -0.5


@dataclass(slots=True)
class PagedInputs:
    case: AttentionCase
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    new_key: torch.Tensor  # [num_tokens, num_kv_heads, head_size]: the query tokens'
    new_value: torch.Tensor
    cache: LayerKVCache
    mirror: MirrorCache
    batch: AttentionBatch
    # Scale of an fp8 cache (ones otherwise).
    k_scale: torch.Tensor
    v_scale: torch.Tensor


def _randn(g: torch.Generator, shape: Sequence[int]) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def build_case(case: AttentionCase, device: str = "cpu", seed: int = 0,
               write_new: bool = True) -> PagedInputs:
    """The batch's context tokens are in the cache; with write_new the query
    tokens' own keys and values are too (else they wait for reshape_and_cache:
    the mirror has them either way)."""
    if len(case.query_lens) != len(case.seq_lens):
        raise ValueError("one query length per sequence")
    g = torch.Generator().manual_seed(seed)
    bs, hk, d = case.block_size, case.num_kv_heads, case.head_size
    cache_dtype = cache_torch_dtype(case.kv_cache_dtype, case.dtype)
    shape = KVCacheShape(bs, hk, d, cache_dtype)
    plan = plan_kv_cache_tensors(["layer"], case.num_blocks, shape, case.layout)
    cache = allocate_kv_cache(plan, case.num_blocks, shape, case.layout, device,
                              fill=float("nan"))["layer"]
    fp8 = case.kv_cache_dtype != "auto"
    k_scale = torch.tensor([0.5 if fp8 else 1.0], device=device)
    v_scale = torch.tensor([0.25 if fp8 else 1.0], device=device)
    mirror = MirrorCache(case.num_blocks, bs, hk, d, case.kv_cache_dtype,
                         float(k_scale), float(v_scale), device)

    free = (torch.randperm(case.num_blocks - 1, generator=g) + 1).tolist()
    width = max(-(-s // bs) for s in case.seq_lens)
    table = torch.full((len(case.seq_lens), width), NULL_BLOCK_ID, dtype=torch.int32)
    queries, new_keys, new_values = [], [], []
    for i, (q_len, seq_len) in enumerate(zip(case.query_lens, case.seq_lens, strict=True)):
        if not 0 < q_len <= seq_len:
            raise ValueError(f"sequence {i}: query length {q_len}, length {seq_len}")
        context = seq_len - q_len
        # Blocks wholly before the first query's window: dropped (null).
        first_visible = max(0, context - case.sliding_window + 1) if case.sliding_window else 0
        for j in range(-(-seq_len // bs)):
            if (j + 1) * bs > first_visible:
                table[i, j] = free.pop()
        positions = torch.arange(first_visible, seq_len)
        blocks = table[i, positions // bs].long()
        offsets = positions % bs
        k = _randn(g, (len(positions), hk, d)).to(case.dtype)
        v = _randn(g, (len(positions), hk, d)).to(case.dtype)
        mirror.write(k, v, blocks * bs + offsets)
        stored = positions < context if not write_new else positions >= 0
        _store(cache, blocks[stored], offsets[stored], k[stored], v[stored],
               case.kv_cache_dtype, k_scale, v_scale, device)
        queries.append(_randn(g, (q_len, case.num_heads, d)).to(case.dtype))
        new_keys.append(k[len(positions) - q_len:])
        new_values.append(v[len(positions) - q_len:])

    qsl = torch.zeros(len(case.query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(case.query_lens).cumsum(0)
    slot_mapping = torch.cat([
        table[i, torch.arange(s - q, s) // bs].long() * bs + torch.arange(s - q, s) % bs
        for i, (q, s) in enumerate(zip(case.query_lens, case.seq_lens))])
    batch = AttentionBatch(qsl.to(device), torch.tensor(case.seq_lens, dtype=torch.int32,
                                                        device=device),
                           table.to(device), slot_mapping.to(device),
                           max(case.query_lens), max(case.seq_lens))
    return PagedInputs(case, torch.cat(queries).to(device), torch.cat(new_keys).to(device),
                       torch.cat(new_values).to(device), cache, mirror, batch,
                       k_scale, v_scale)


def _store(cache: LayerKVCache, blocks, offsets, k, v, kv_cache_dtype: str,
           k_scale: torch.Tensor, v_scale: torch.Tensor, device: str) -> None:
    """Plain indexing writes, as the cache holds them (fp8: x / scale, rounded
    by torch's cast)."""
    blocks, offsets = blocks.to(device), offsets.to(device)
    if kv_cache_dtype != "auto":
        from harness.attention.reference import quantize

        k = (quantize(k, kv_cache_dtype, float(k_scale)) / float(k_scale))
        v = (quantize(v, kv_cache_dtype, float(v_scale)) / float(v_scale))
    cache.key[blocks, offsets] = k.to(device).to(cache.key.dtype)
    cache.value[blocks, offsets] = v.to(device).to(cache.value.dtype)
