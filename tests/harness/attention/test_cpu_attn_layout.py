"""The conversion of vLLM's CPU attention cache, checked against vLLM's own
cpu_attn_reshape_and_cache for every ISA this CPU runs: what vLLM packs, unpack
gives back exactly; what pack builds, vLLM's attention reads as its own."""

import pytest
import torch

from harness.attention.kinds import AttentionKind
from harness.backends.vllm_cpu_attention import VllmCpuAttention
from harness.backends.vllm_cpu_attn_layout import pack, region_index, unpack
from impl.kernels.reshape_and_cache import reshape_and_cache
from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

pytestmark = pytest.mark.vllm

# (dtype, block_size, head_size): vec16 (block 16), vec (fp32/fp16, block 32)
# and amx (bf16, block 32, where the CPU has AMX; vec otherwise). Head sizes
# are ones vLLM's CPU backend declares it serves.
SHAPES = [(torch.float32, 16, 32), (torch.float16, 32, 64), (torch.bfloat16, 32, 64),
          (torch.bfloat16, 64, 128), (torch.bfloat16, 16, 128)]


def _written(dtype, block_size, head_size, seed=0):
    v = VllmCpuAttention(num_blocks=5, block_size=block_size, num_heads=4, num_kv_heads=2,
                         head_size=head_size, dtype=dtype, scale=1.0, kind=AttentionKind())
    g = torch.Generator().manual_seed(seed)
    n = 3 * block_size
    slots = torch.randperm(5 * block_size, generator=g)[:n]
    key = torch.randn(n, 2, head_size, generator=g).to(dtype)
    value = torch.randn(n, 2, head_size, generator=g).to(dtype)
    v.write(key, value, slots)
    return v, slots, key, value


@pytest.mark.parametrize("dtype, block_size, head_size", SHAPES)
def test_unpack_gives_back_what_vllm_wrote(dtype, block_size, head_size):
    v, slots, key, value = _written(dtype, block_size, head_size)
    k, val = unpack(v.cache, v.isa)
    assert torch.equal(k.reshape(-1, 2, head_size)[slots], key)
    assert torch.equal(val.reshape(-1, 2, head_size)[slots], value)
    assert torch.equal(pack(k, val, v.isa), v.cache)


def test_impl_cpu_attn_layout_is_vllms_vec_layout_byte_for_byte():
    # fp32 with block 32 runs vLLM's "vec" kernels everywhere on x86.
    v, slots, key, value = _written(torch.float32, 32, 64, seed=1)
    assert v.isa == "vec"
    shape = KVCacheShape(32, 2, 64, torch.float32)
    plan = plan_kv_cache_tensors(["l"], 5, shape, KVCacheLayout.CPU_ATTN)
    mine = allocate_kv_cache(plan, 5, shape, KVCacheLayout.CPU_ATTN, fill=0.0)["l"]
    reshape_and_cache(key, value, mine.key, mine.value, slots)
    assert torch.equal(mine.raw, v.cache)


def test_region_index_is_a_permutation():
    for isa, itemsize in [("vec", 4), ("vec16", 2), ("amx", 2)]:
        k, v = region_index(isa, 32, 64, itemsize)
        for index in (k, v):
            assert torch.equal(index.flatten().sort().values, torch.arange(32 * 64))
    with pytest.raises(ValueError, match="no conversion"):
        region_index("neon", 32, 64, 2)
