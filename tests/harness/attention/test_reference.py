"""The float64 reference itself: against torch's SDPA on dense tensors, and its
sliding-window rule spelled out position by position."""

import torch
import torch.nn.functional as F

from harness.attention.kinds import AttentionKind
from harness.attention.reference import MirrorCache, quantize, reference, reference_attention
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


# Each kind spelled out for one query, as its definition reads (kinds.py).

def _one_query(seq_len=12, dim=4, seed=1):
    mirror, table, k, v = _scattered(seq_len=seq_len, heads=1, kv_heads=1, dim=dim, seed=seed)
    q = torch.randn(1, 1, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    return mirror, table, k[:, 0], v[:, 0], q


def _softmax_out(logits, values):
    w = torch.softmax(logits, 0)
    return w @ values


def test_chunked_local_sees_only_its_own_chunk():
    mirror, table, k, v, q = _one_query()
    out = reference(q, mirror, _batch(1, 12, table), 0.5, AttentionKind(chunk_size=4)).out
    # Position 11, chunks of 4: positions 8..11.
    assert torch.allclose(out[0, 0], _softmax_out(k[8:12] @ q[0, 0] * 0.5, v[8:12]))


def test_alibi_softcap_and_sinks():
    mirror, table, k, v, q = _one_query()
    b = _batch(1, 12, table)
    s = k @ q[0, 0] * 0.5
    slope = AttentionKind(alibi=True).alibi_slopes(1)[0].item()
    bias = slope * (torch.arange(12) - 11).double()
    out = reference(q, mirror, b, 0.5, AttentionKind(alibi=True)).out
    assert torch.allclose(out[0, 0], _softmax_out(s + bias, v))
    out = reference(q, mirror, b, 0.5, AttentionKind(softcap=1.5)).out
    assert torch.allclose(out[0, 0], _softmax_out(1.5 * torch.tanh(s / 1.5), v))
    sink = AttentionKind(sinks=True).sink_logits(1)[0].item()
    out = reference(q, mirror, b, 0.5, AttentionKind(sinks=True)).out
    w = torch.softmax(torch.cat([s, torch.tensor([sink], dtype=torch.float64)]), 0)
    assert torch.allclose(out[0, 0], w[:12] @ v)


def test_cross_attention_sees_every_encoder_token():
    mirror, table, k, v, q = _one_query()
    q3 = q.repeat(3, 1, 1)
    out = reference(q3, mirror, _batch(3, 12, table), 0.5, AttentionKind(causal=False)).out
    assert torch.allclose(out[2, 0], _softmax_out(k @ q[0, 0] * 0.5, v))


def test_static_sinks_are_read_from_their_own_blocks():
    # Sinks in block 1 (block size 4): slots 4..7; the sequence elsewhere.
    mirror = MirrorCache(8, 4, 1, 4)
    g = torch.Generator().manual_seed(3)
    sk, sv = (torch.randn(4, 1, 4, dtype=torch.float64, generator=g) for _ in range(2))
    mirror.write(sk, sv, torch.arange(4, 8))
    k, v = (torch.randn(6, 1, 4, dtype=torch.float64, generator=g) for _ in range(2))
    table = torch.tensor([5, 6], dtype=torch.int32)
    mirror.write(k, v, torch.cat([torch.arange(20, 24), torch.arange(24, 26)]))
    q = torch.randn(1, 1, 4, dtype=torch.float64, generator=g)
    out = reference(q, mirror, _batch(1, 6, table), 0.5, AttentionKind(sink_len=4)).out
    keys, values = torch.cat([sk, k])[:, 0], torch.cat([sv, v])[:, 0]
    assert torch.allclose(out[0, 0], _softmax_out(keys @ q[0, 0] * 0.5, values))


def test_mla_values_are_the_latent_part_of_the_row():
    mirror, table, k, v, q = _one_query(dim=6)
    out = reference(q, mirror, _batch(1, 12, table), 0.5, AttentionKind(mla_rope_dim=2)).out
    assert out.shape == (1, 1, 4)
    assert torch.allclose(out[0, 0], _softmax_out(k @ q[0, 0] * 0.5, k[:, :4]))


def test_error_model_scales_describe_the_sum():
    mirror, table, k, v, q = _one_query()
    ref = reference(q, mirror, _batch(1, 12, table), 0.5)
    w = torch.softmax(k @ q[0, 0] * 0.5, 0)
    assert torch.allclose(ref.mix[0, 0], w @ v.abs())
    assert torch.allclose(ref.spread[0, 0], ((w * w) @ (v * v)).sqrt())
    assert ref.num_keys[0, 0] == 12
    assert torch.isclose(ref.logit_scale[0, 0], (k.abs() @ q[0, 0].abs() * 0.5).max())


def test_toward_zero_rounding_never_rounds_up():
    x = torch.linspace(-3, 3, 1001)
    near, down = quantize(x, "fp8", 1.0), quantize(x, "fp8", 1.0, "toward_zero")
    assert (down.abs() <= x.abs().double() + 1e-12).all()
    assert ((near - down).abs() > 0).any() and ((near - down).abs() <= 0.25).all()
