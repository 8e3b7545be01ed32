"""The kernels on a CUDA GPU (compiled when TRITON_INTERPRET=0, as
ci/gpu_check.py runs them), and swapping blocks between GPU and host."""

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.kernel_cases import AttentionCase, build_case
from harness.attention.reference import reference
from harness.attention.tolerances import allowed, impl_path
from impl.kernels.copy_blocks import copy_blocks
from impl.kernels.reshape_and_cache import reshape_and_cache
from impl.kernels.swap_blocks import swap_blocks
from impl.kernels.unified_attention import unified_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_attention_through_reshape_and_cache_on_the_gpu(dtype):
    case = AttentionCase("gpu", query_lens=(1, 37, 20, 1, 128), seq_lens=(300, 37, 90, 1, 700),
                         num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                         dtype=dtype, sliding_window=257)
    p = build_case(case, device="cuda", write_new=False)
    b = p.batch
    reshape_and_cache(p.new_key, p.new_value, p.cache.key, p.cache.value, b.slot_mapping)
    out = torch.full_like(p.query, float("nan"))
    unified_attention(p.query, p.cache.key, p.cache.value, out, b.query_start_loc,
                      b.seq_lens, b.block_table, case.scale, case.sliding_window)
    ref = reference(p.query, p.mirror, b, case.scale, case.attention)
    stats = error_stats(out, ref.out, allowed(ref, dtype, impl_path()))
    assert stats.ok, stats


def test_copy_blocks_on_the_gpu():
    k = torch.randn(8, 16, 2, 64, device="cuda")
    v = torch.randn_like(k)
    k0 = k.clone()
    copy_blocks([k], [v], torch.tensor([[1, 5], [2, 6]], device="cuda"))
    assert torch.equal(k[5], k0[1]) and torch.equal(k[6], k0[2])


def test_swap_out_and_back_in():
    gpu = torch.randn(8, 16, 2, 64, device="cuda").bfloat16()
    host = torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16)
    swap_blocks(gpu, host, torch.tensor([[3, 0], [4, 1]]))
    back = torch.zeros_like(gpu)
    swap_blocks(host, back, torch.tensor([[0, 6], [1, 7]]))
    torch.cuda.synchronize()
    assert torch.equal(back[6], gpu[3]) and torch.equal(back[7], gpu[4])
