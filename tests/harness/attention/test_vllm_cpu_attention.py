"""Live: impl's reshape_and_cache and paged attention against vLLM's CPU
attention ops (cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache), fed
the same keys, values, slot mappings and block tables; both also against the
float64 reference."""

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.cpu_attn_layout import pack
from harness.attention.kernel_cases import AttentionCase, build_case
from harness.attention.reference import reference_attention
from harness.attention.tolerances import tolerance
from harness.backends.vllm_cpu_attention import VllmCpuAttention
from impl.kernels.reshape_and_cache import reshape_and_cache
from impl.kernels.unified_attention import unified_attention
from impl.kv_cache_tensors import KVCacheLayout

pytestmark = pytest.mark.vllm

CASES = {
    "mixed": dict(query_lens=(1, 40, 17, 1), seq_lens=(75, 40, 64, 33)),
    "sliding_window": dict(query_lens=(1, 25, 3), seq_lens=(130, 90, 70), sliding_window=40),
}


def _both(case: AttentionCase):
    """impl and vLLM, each writing the whole sequences' keys and values itself."""
    p = build_case(case, write_new=False)
    b = p.batch
    vllm = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads,
                            case.num_kv_heads, case.head_size, case.dtype, case.scale,
                            case.sliding_window)
    # Every position the mirror holds (context and new), written by both.
    written = (~p.mirror.key[..., 0, 0].isnan()).flatten().nonzero().flatten()
    bs = case.block_size
    k = p.mirror.key.view(-1, case.num_kv_heads, case.head_size)[written].to(case.dtype)
    v = p.mirror.value.view(-1, case.num_kv_heads, case.head_size)[written].to(case.dtype)
    reshape_and_cache(k, v, p.cache.key, p.cache.value, written)
    vllm.write(k, v, written)
    mine = torch.full_like(p.query, float("nan"))
    unified_attention(p.query, p.cache.key, p.cache.value, mine, b.query_start_loc,
                      b.seq_lens, b.block_table, case.scale, case.sliding_window)
    theirs = vllm.forward(p.query, b)
    ref = reference_attention(p.query, p.mirror, b, case.scale, case.sliding_window)
    return p, vllm, written // bs, written % bs, mine, theirs, ref


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_impl_matches_vllm_cpu_attention(dtype, name):
    case = AttentionCase(name, num_heads=8, num_kv_heads=2, head_size=64, block_size=32,
                         dtype=dtype, layout=KVCacheLayout.CPU_ATTN, **CASES[name])
    p, vllm, blocks, offsets, mine, theirs, ref = _both(case)
    # The cache writes agree element for element (vLLM's layout converted).
    their_k, their_v = vllm.unpacked_cache()
    assert torch.equal(p.cache.key[blocks, offsets], their_k[blocks, offsets])
    assert torch.equal(p.cache.value[blocks, offsets], their_v[blocks, offsets])
    # The outputs agree within the spec's tolerances, and both with the reference.
    vs_vllm = error_stats(mine, theirs, tolerance(dtype, "vllm"))
    assert vs_vllm.ok, vs_vllm
    assert error_stats(mine, ref, tolerance(dtype, "reference")).ok
    assert error_stats(theirs, ref, tolerance(dtype, "reference")).ok


def test_vllm_reads_impl_cache_converted_as_its_own():
    case = AttentionCase("read", num_heads=4, num_kv_heads=2, head_size=64, block_size=32,
                         dtype=torch.bfloat16, **CASES["mixed"])
    p, vllm, *_, theirs, _ = _both(case)
    converted = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads,
                                 case.num_kv_heads, case.head_size, case.dtype, case.scale)
    converted.cache.copy_(pack(p.cache.key.nan_to_num(0.0), p.cache.value.nan_to_num(0.0),
                               converted.isa))
    assert torch.equal(converted.forward(p.query, p.batch), theirs)
