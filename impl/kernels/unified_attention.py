"""Paged attention: one kernel for prefill, chunked prefill and decode.

A batch is a list of sequences laid end to end (varlen): sequence s has query
tokens q[cu_seqlens_q[s]:cu_seqlens_q[s+1]] and seq_lens[s] tokens in the KV
cache, of which the last q_len are its own query tokens (so a decode has
q_len 1, a first prefill chunk q_len == seq_len, a later chunk sits in between).
Attention is causal: the query at position p sees keys at positions <= p, and
with a sliding window of W only keys at positions > p - W (W tokens, itself
included), as in vLLM; the other kinds vLLM serves (non-causal cross
attention, chunked local attention, ALiBi, logit soft-capping, attention sinks,
MLA's latent cache) are parameters of the same kernel (see unified_attention).

Keys and values are read through the block table: position t of sequence s
lives in block block_table[s, t // block_size] at offset t % block_size.
Grid: (query tiles, kv heads). A program takes BLOCK_Q query tokens of one
sequence and every query head that shares one kv head (GQA), so each K/V tile
is loaded once for all of them; it walks the KV tiles it can see with an
online softmax in fp32. Tiles wholly outside the causal window are never
touched, and keys outside it are masked at load, so blocks out of the window
(null blocks from a sliding-window manager, stale ids) are never read.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from impl.kernels import triton_mode
from impl.kernels.rounding import cast_rounded


@triton.jit
def _find_seq(pid, cu_seqlens_q_ptr, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence owning query tile `pid`: sequence s owns the tiles from
    cu_seqlens_q[s] // BLOCK_Q + s on (a bound that needs no host sync)."""
    lo = tl.full([], 0, tl.int32)
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        owns = first <= pid
        lo = tl.where(owns, mid, lo)
        hi = tl.where(owns, hi, mid)
    return lo


@triton.jit
def _tanh(x):
    """tanh from exp2, stable at both ends (Triton has no portable tanh)."""
    return 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def _unified_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr,
    k_scale_ptr, v_scale_ptr, alibi_ptr, sinks_ptr,
    num_seqs, head_size, head_size_v, block_size, window, chunk, softcap, scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kc_b, stride_kc_n, stride_kc_h, stride_kc_d,
    stride_vc_b, stride_vc_n, stride_vc_h, stride_vc_d,
    stride_bt,
    QUERIES_PER_KV: tl.constexpr, QPK_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr,
    USE_ALIBI: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * QPK_PAD
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    seq = _find_seq(pid, cu_seqlens_q_ptr, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    q_tile_start = (pid - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if q_tile_start >= q_len:
        return  # an unused tile of the upper-bound grid
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    # Row r is query token q_tile_start + r // QPK_PAD, query head
    # kv_head * QUERIES_PER_KV + r % QPK_PAD.
    rows = tl.arange(0, BLOCK_M)
    q_local = q_tile_start + rows // QPK_PAD
    head = kv_head * QUERIES_PER_KV + rows % QPK_PAD
    row_ok = (q_local < q_len) & (rows % QPK_PAD < QUERIES_PER_KV)
    q_pos = context_len + q_local
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_size
    dims_v = tl.arange(0, BLOCK_DV)
    dim_v_ok = dims_v < head_size_v

    q = tl.load(q_ptr + (q_start + q_local)[:, None] * stride_qt
                + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    # Keys this tile of queries can see at all. Without a causal mask (cross
    # attention, encoders) every query sees the whole sequence.
    if CAUSAL:
        hi_pos = context_len + tl.minimum(q_tile_start + BLOCK_Q, q_len) - 1
    else:
        hi_pos = seq_len - 1
    lo_pos = 0
    if USE_WINDOW:
        lo_pos = tl.maximum(context_len + q_tile_start - window + 1, 0)
    if USE_CHUNK:
        lo_pos = tl.maximum(lo_pos, ((context_len + q_tile_start) // chunk) * chunk)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if USE_SINKS:
        # A sink is one more logit in every row's softmax, with no value: the
        # running max starts at it and the sum at exp(0) = 1.
        m_i = tl.load(sinks_ptr + head, mask=row_ok, other=float("-inf")).to(tl.float32) \
            * 1.4426950408889634
        l_i = tl.where(row_ok, 1.0, 0.0)
    if USE_ALIBI:
        slope = tl.load(alibi_ptr + head, mask=row_ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if KV_FP8:
        k_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)

    for tile_start in range((lo_pos // TILE_N) * TILE_N, hi_pos + 1, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        pos_ok = (pos >= lo_pos) & (pos <= hi_pos)
        block = tl.load(block_table_ptr + seq * stride_bt + pos // block_size,
                        mask=pos_ok, other=0).to(tl.int64)
        offset = pos % block_size
        k_off = block * stride_kc_b + offset * stride_kc_n + kv_head * stride_kc_h
        v_off = block * stride_vc_b + offset * stride_vc_n + kv_head * stride_vc_h
        # K is loaded transposed, [dims, positions], ready for Q @ K^T.
        k = tl.load(k_cache_ptr + k_off[None, :] + dims[:, None] * stride_kc_d,
                    mask=pos_ok[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_off[:, None] + dims_v[None, :] * stride_vc_d,
                    mask=pos_ok[:, None] & dim_v_ok[None, :], other=0.0)
        if KV_FP8:
            k = k.to(tl.float32) * k_scale
            v = v.to(tl.float32) * v_scale
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k.to(q.dtype))
        s = s * scale
        if USE_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        if USE_ALIBI:
            s = s + slope[:, None] * (pos[None, :] - q_pos[:, None]).to(tl.float32)
        s = s * 1.4426950408889634  # log2 domain: exp2 below

        visible = row_ok[:, None] & pos_ok[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (q_pos[:, None] - pos[None, :] < window)
        if USE_CHUNK:
            visible = visible & (pos[None, :] >= (q_pos[:, None] // chunk) * chunk)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen nothing yet keeps -inf; subtract 0 instead so
        # that exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_FP32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + q_local)[:, None] * stride_ot
             + head[:, None] * stride_oh + dims_v[None, :],
             cast_rounded(out, out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_v_ok[None, :])


def default_tiles(max_query_len: int, queries_per_kv: int) -> tuple[int, int]:
    """(rows of queries x heads, kv tokens) per program.

    Compiled: 64 x 64 for prefill and 16 x 64 for decode (tl.dot needs >= 16
    in each dimension). Interpreted, every Triton op costs Python time, so
    tiles are as large as possible.
    """
    if triton_mode.INTERPRETED:
        return 128, 128
    return (64 if max_query_len > 1 else 16), 64


def unified_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    max_query_len: int | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    block_m: int | None = None,
    tile_n: int | None = None,
    causal: bool = True,
    chunk_size: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_size]; out: [num_tokens, num_heads,
    head_size_v]; key_cache: [num_blocks, block_size, num_kv_heads, head_size]
    and value_cache [..., head_size_v] views (any strides; MLA passes two views
    of one latent cache, the values being its first head_size_v dims);
    cu_seqlens_q: [num_seqs + 1] int32; seq_lens: [num_seqs] int32;
    block_table: [num_seqs, max_blocks] int32. Tokens past cu_seqlens_q[-1]
    (padding) are not written. Returns out.

    Kinds: `causal=False` lets every query see its whole sequence (cross
    attention, encoders); `sliding_window` W: keys p - W < t <= p;
    `chunk_size` C (chunked local attention): keys of the query's own chunk,
    (p // C) * C <= t <= p; `alibi_slopes` [num_heads]: logits plus
    slope * (t - p); `softcap` c: logits become c * tanh(logit / c) (before
    ALiBi); `sinks` [num_heads]: one more logit per head in the softmax
    denominator, with no value (gpt-oss style attention sinks)."""
    num_tokens, num_heads, head_size = q.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    head_size_v = value_cache.shape[3]
    if cache_dim != head_size or num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads of {head_size}; the cache "
                         f"{num_kv_heads} heads of {cache_dim}")
    if out.shape[1:] != (num_heads, head_size_v) or value_cache.shape[:3] != key_cache.shape[:3]:
        raise ValueError(f"out {tuple(out.shape)} / value cache {tuple(value_cache.shape)} "
                         f"do not fit {num_heads} heads of {head_size_v}")
    if q.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("q and out must be contiguous in head_size")
    if block_table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous")
    if not causal and (sliding_window or chunk_size or alibi_slopes is not None):
        raise ValueError("sliding windows, chunks and ALiBi need causal attention")
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or num_tokens == 0:
        return out
    kv_fp8 = kv_cache_dtype != "auto"
    if kv_fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 cache needs k_scale and v_scale")
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    qpk = num_heads // num_kv_heads
    qpk_pad = triton.next_power_of_2(qpk)
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    rows, cols = default_tiles(max_query_len, qpk)
    rows = block_m or rows
    tile_n = tile_n or cols
    block_q = max(1, min(rows // qpk_pad, triton.next_power_of_2(max_query_len)))
    if not triton_mode.INTERPRETED:
        block_q = max(block_q, triton.cdiv(16, qpk_pad))  # tl.dot needs 16 rows
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        q, key_cache, value_cache, out, cu_seqlens_q, seq_lens, block_table,
        k_scale if kv_fp8 else one, v_scale if kv_fp8 else one,
        one if alibi_slopes is None else alibi_slopes, one if sinks is None else sinks,
        num_seqs, head_size, head_size_v, block_size, sliding_window or 0, chunk_size or 1,
        float(softcap or 1.0), float(scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *key_cache.stride(), *value_cache.stride(), block_table.stride(0),
        QUERIES_PER_KV=qpk, QPK_PAD=qpk_pad, BLOCK_Q=block_q, TILE_N=tile_n,
        BLOCK_D=triton.next_power_of_2(head_size),
        BLOCK_DV=triton.next_power_of_2(head_size_v),
        CAUSAL=causal, USE_WINDOW=bool(sliding_window), USE_CHUNK=bool(chunk_size),
        USE_ALIBI=alibi_slopes is not None, USE_SOFTCAP=bool(softcap),
        USE_SINKS=sinks is not None, KV_FP8=kv_fp8,
        DOT_FP32=triton_mode.INTERPRETED or q.dtype == torch.float32,
    )
    return out
