"""Paged attention against the float64 reference, one launch per batch of
mixed prefill, chunked-prefill and decode sequences.

Every case (harness/attention/kernel_cases.py) fills each cache element nobody
wrote with NaN, null block included, and pads each block-table row with the
null block, so a kernel that reads past a sequence, through a dropped
(sliding-window) block or an unwritten slot produces NaN; the output buffer is
poisoned with NaN and has spare rows, so every row must be written, and only
those."""

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.impl_call import impl_attention, impl_write
from harness.attention.kernel_cases import AttentionCase, build_case
from harness.attention.kinds import KINDS
from harness.attention.reference import reference
from harness.attention.tolerances import allowed, impl_path
from impl.kernels.unified_attention import unified_attention
from impl.kv_cache_tensors import KVCacheLayout

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SPARE_ROWS = 3

SCENARIOS = {
    # Context lengths around block (16) and tile boundaries; a lone token.
    "decode": dict(query_lens=(1, 1, 1, 1), seq_lens=(1, 17, 64, 130)),
    "prefill": dict(query_lens=(23, 64, 5), seq_lens=(23, 64, 5)),
    # Chunks starting mid-block, block-aligned, a decode and a first chunk.
    "chunked": dict(query_lens=(17, 16, 1, 40), seq_lens=(50, 48, 33, 40)),
    # The window drops whole blocks (null in the table, NaN in the cache).
    "sliding_window": dict(query_lens=(1, 21, 30), seq_lens=(100, 90, 30),
                           sliding_window=20),
}


def run_case(case: AttentionCase, block_m=None, tile_n=None, through_reshape=False):
    p = build_case(case, write_new=not through_reshape)
    b = p.batch
    kind = case.attention
    if through_reshape:
        impl_write(p.new_key, p.new_value, p.cache, b.slot_mapping, kind, case.kv_cache_dtype,
                   p.k_scale, p.v_scale)
    n = p.query.shape[0]
    out = torch.full((n + SPARE_ROWS, case.num_heads, case.head_size_v), float("nan"),
                     dtype=case.dtype)
    impl_attention(p.query, p.cache, out, b, case.scale, kind, case.kv_cache_dtype,
                   p.k_scale, p.v_scale, block_m, tile_n)
    assert out[n:].isnan().all(), "rows past the batch were written"
    ref = reference(p.query, p.mirror, b, case.scale, kind)
    stats = error_stats(out[:n], ref.out, allowed(ref, case.dtype, impl_path(),
                                                  kv_cache_dtype=case.kv_cache_dtype))
    assert stats.nonfinite == 0, "a row was not written or read a poisoned element"
    assert stats.ok, stats
    return stats


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference(dtype, scenario):
    run_case(AttentionCase(scenario, dtype=dtype, num_heads=8, num_kv_heads=2,
                           **SCENARIOS[scenario]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_kinds_in_one_launch_with_small_tiles(dtype):
    # 16 x 16 tiles: many query tiles per sequence, many KV tiles per query
    # tile, block and tile boundaries misaligned (block 32); the online
    # softmax must carry across tiles.
    case = AttentionCase("mixed", query_lens=(1, 37, 20, 1, 9),
                         seq_lens=(70, 37, 90, 1, 50), num_heads=6, num_kv_heads=2,
                         head_size=40, block_size=32, dtype=dtype, sliding_window=33)
    run_case(case, block_m=16, tile_n=16)


@pytest.mark.parametrize("heads", [(4, 4), (4, 1), (8, 2)], ids=["mha", "mqa", "gqa"])
def test_head_grouping(heads):
    run_case(AttentionCase("heads", num_heads=heads[0], num_kv_heads=heads[1],
                           head_size=64, **SCENARIOS["chunked"]), block_m=32, tile_n=64)


# Every kind vLLM serves, written through impl's own write kernels; the
# context crosses tiles (16) and blocks (16) and, for the chunked kind, chunks.
KIND_SCENARIO = dict(query_lens=(1, 9, 20, 1), seq_lens=(45, 9, 50, 70))
CROSS_SCENARIO = dict(query_lens=(3, 9, 1), seq_lens=(13, 9, 50))  # queries vs encoder


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind(kind, dtype=torch.bfloat16):
    # bf16 (rounded once at the end); float32 runs the same fp32 arithmetic
    # under the interpreter, and test_vllm_cpu_attention runs every kind in it.
    k = KINDS[kind]
    shape = dict(head_size=80, num_kv_heads=1) if k.is_mla else {}
    scenario = CROSS_SCENARIO if not k.causal else KIND_SCENARIO
    run_case(AttentionCase(kind, dtype=dtype, kind=k, **shape, **scenario),
             block_m=16, tile_n=16, through_reshape=True)


@pytest.mark.parametrize("layout", list(KVCacheLayout))
def test_every_layout_written_through_reshape_and_cache(layout):
    run_case(AttentionCase("layout", layout=layout, dtype=torch.bfloat16,
                           **SCENARIOS["chunked"]), through_reshape=True)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache(kv_cache_dtype):
    run_case(AttentionCase("fp8", dtype=torch.float16, kv_cache_dtype=kv_cache_dtype,
                           **SCENARIOS["sliding_window"]), through_reshape=True)


def test_a_window_of_one_sees_only_the_token_itself():
    case = AttentionCase("w1", query_lens=(5,), seq_lens=(12,), sliding_window=1)
    p = build_case(case)
    out = torch.empty_like(p.query)
    b = p.batch
    unified_attention(p.query, p.cache.key, p.cache.value, out, b.query_start_loc,
                      b.seq_lens, b.block_table, case.scale, 1)
    # Softmax over one key is 1: the output is that token's value row.
    expected = p.new_value.repeat_interleave(case.num_heads // case.num_kv_heads, dim=1)
    assert torch.allclose(out, expected, atol=1e-6)


def test_empty_batch_and_bad_shapes():
    case = AttentionCase("x", query_lens=(2,), seq_lens=(4,))
    p = build_case(case)
    b = p.batch
    out = torch.empty(0, 4, 32)
    unified_attention(p.query[:0], p.cache.key, p.cache.value, out, b.query_start_loc[:1],
                      b.seq_lens[:0], b.block_table[:0])
    with pytest.raises(ValueError, match="heads"):
        unified_attention(p.query[:, :3], p.cache.key, p.cache.value, p.query[:, :3],
                          b.query_start_loc, b.seq_lens, b.block_table)
