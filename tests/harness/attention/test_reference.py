"""The float64 reference itself: against torch's SDPA on dense tensors, and its
sliding-window rule spelled out position by position."""

import torch
import torch.nn.functional as F

from harness.attention.reference import MirrorCache, quantize, reference_attention
from impl.attention_batch import AttentionBatch


def _scattered(seq_len, heads, kv_heads, dim, block_size=4, seed=0):
    """One sequence's keys/values in shuffled blocks of a mirror cache."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-seq_len // block_size)
    table = (torch.randperm(blocks + 3, generator=g)[:blocks] + 1).to(torch.int32)
    mirror = MirrorCache(blocks + 4, block_size, kv_heads, dim)
    k = torch.randn(seq_len, kv_heads, dim, generator=g, dtype=torch.float64)
    v = torch.randn(seq_len, kv_heads, dim, generator=g, dtype=torch.float64)
    pos = torch.arange(seq_len)
    mirror.write(k, v, table[pos // block_size].long() * block_size + pos % block_size)
    return mirror, table, k, v


def _batch(q_len, seq_len, table):
    return AttentionBatch(torch.tensor([0, q_len], dtype=torch.int32),
                          torch.tensor([seq_len], dtype=torch.int32), table[None], torch.empty(0),
                          q_len, seq_len)


def test_matches_sdpa_on_a_chunk_of_a_longer_sequence():
    mirror, table, k, v = _scattered(seq_len=23, heads=6, kv_heads=2, dim=8)
    q = torch.randn(9, 6, 8, dtype=torch.float64)
    out = reference_attention(q, mirror, _batch(9, 23, table), scale=0.3)
    # SDPA with the query rows at positions 14..22 (bottom-right causal).
    mask = torch.arange(23)[None, :] <= torch.arange(14, 23)[:, None]
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(3, 1).transpose(0, 1),
        v.repeat_interleave(3, 1).transpose(0, 1), attn_mask=mask, scale=0.3).transpose(0, 1)
    assert torch.allclose(out, want, atol=1e-12)


def test_window_counts_the_query_itself():
    mirror, table, k, v = _scattered(seq_len=10, heads=1, kv_heads=1, dim=4)
    q = torch.randn(1, 1, 4, dtype=torch.float64)
    out = reference_attention(q, mirror, _batch(1, 10, table), scale=1.0, sliding_window=3)
    # Position 9 with a window of 3 sees positions 7, 8, 9.
    w = torch.softmax(k[7:10, 0] @ q[0, 0], 0)
    assert torch.allclose(out[0, 0], w @ v[7:10, 0], atol=1e-12)


def test_mirror_skips_padding_and_quantizes_like_the_cache():
    mirror = MirrorCache(3, 2, 1, 2, kv_cache_dtype="fp8", k_scale=0.5, v_scale=1.0)
    k = torch.tensor([[[1.03, -700.0]], [[5.0, 5.0]]])
    mirror.write(k, k, torch.tensor([3, -1]))
    assert mirror.key[1, 1, 0].tolist() == quantize(k[0, 0], "fp8", 0.5).tolist()
    assert mirror.key[1, 1, 0, 1] == -448 * 0.5  # saturated, not NaN
    assert mirror.key.isnan().sum() == mirror.key.numel() - 2
