"""reshape_and_cache: each token's key/value row lands at its slot
(block_id * block_size + offset) in every layout, -1 slots are skipped, nothing
else in the cache changes; fp8 caches hold x / scale rounded to nearest."""

import pytest
import torch

from harness.attention.reference import quantize
from impl.kernels.reshape_and_cache import cache_torch_dtype, reshape_and_cache
from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD = 9, 16, 3, 40  # odd sizes: masks matter


def _cache(dtype, layout, kv_cache_dtype="auto"):
    shape = KVCacheShape(BLOCK_SIZE, HEADS, HEAD, cache_torch_dtype(kv_cache_dtype, dtype))
    plan = plan_kv_cache_tensors(["l"], NUM_BLOCKS, shape, layout)
    return allocate_kv_cache(plan, NUM_BLOCKS, shape, layout, fill=float("nan"))["l"]


def _tokens(dtype, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(n, HEADS, HEAD, generator=g) * 3).to(dtype)
    v = (torch.randn(n, HEADS, HEAD, generator=g) * 3).to(dtype)
    return k, v


def _slots(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Distinct slots anywhere but the null block, some tokens padding (-1).
    slots = torch.randperm((NUM_BLOCKS - 1) * BLOCK_SIZE, generator=g)[:n] + BLOCK_SIZE
    slots[[1, n // 2, n - 1]] = -1
    return slots


@pytest.mark.parametrize("layout", list(KVCacheLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_land_at_their_slots_and_nothing_else_changes(dtype, layout):
    cache = _cache(dtype, layout)
    k, v = _tokens(dtype, 37)
    slots = _slots(37)
    reshape_and_cache(k, v, cache.key, cache.value, slots)

    keep = slots >= 0
    blocks, offsets = slots[keep] // BLOCK_SIZE, slots[keep] % BLOCK_SIZE
    assert torch.equal(cache.key[blocks, offsets], k[keep])
    assert torch.equal(cache.value[blocks, offsets], v[keep])
    untouched = torch.ones(NUM_BLOCKS, BLOCK_SIZE, dtype=torch.bool)
    untouched[blocks, offsets] = False
    assert cache.key[untouched].isnan().all() and cache.value[untouched].isnan().all()


def test_int32_slot_mapping_and_strided_inputs():
    cache = _cache(torch.float16, KVCacheLayout.LBNHC)
    # key/value as views into a fused qkv buffer (strided tokens), as vLLM's
    # attention layer hands them over.
    qkv = torch.randn(20, 3, HEADS, HEAD).half()
    k, v = qkv[:, 1], qkv[:, 2]
    slots = _slots(20, seed=1).to(torch.int32)
    reshape_and_cache(k, v, cache.key, cache.value, slots)
    keep = slots >= 0
    b, o = slots[keep].long() // BLOCK_SIZE, slots[keep].long() % BLOCK_SIZE
    assert torch.equal(cache.key[b, o], k[keep]) and torch.equal(cache.value[b, o], v[keep])


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_holds_scaled_values_rounded_to_nearest(dtype, kv_cache_dtype):
    cache = _cache(dtype, KVCacheLayout.CPU_ATTN, kv_cache_dtype)
    k, v = _tokens(dtype, 30, seed=2)
    k[0, 0, 0] = 1e5  # saturates rather than becoming NaN
    slots = _slots(30, seed=2)
    k_scale, v_scale = torch.tensor([0.37]), torch.tensor([2.5])
    reshape_and_cache(k, v, cache.key, cache.value, slots, kv_cache_dtype, k_scale, v_scale)
    keep = slots >= 0
    b, o = slots[keep] // BLOCK_SIZE, slots[keep] % BLOCK_SIZE
    got_k = cache.key[b, o].double() * 0.37
    got_v = cache.value[b, o].double() * 2.5
    # quantize(): torch's own (rounding) cast of x / scale, saturated.
    assert torch.equal(got_k, quantize(k[keep], kv_cache_dtype, 0.37))
    assert torch.equal(got_v, quantize(v[keep], kv_cache_dtype, 2.5))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_an_fp8_cache_holds_the_bytes_of_torchs_cast_signed_zeros_included(kv_cache_dtype):
    """Values that round to zero keep their sign, as torch's (and CUDA's)
    cast stores them: -0 and +0 are equal as numbers, so only the bytes tell
    (the attention differential compares the cache's bytes)."""
    cache = _cache(torch.float32, KVCacheLayout.CPU_ATTN, kv_cache_dtype)
    k, v = _tokens(torch.float32, 30, seed=4)
    k[:, 0, :6] = torch.tensor([-1e-9, 1e-9, -0.0, 0.0, -1e-30, 2.0])
    slots = _slots(30, seed=4)
    reshape_and_cache(k, v, cache.key, cache.value, slots, kv_cache_dtype,
                      torch.tensor([1.0]), torch.tensor([1.0]))
    keep = slots >= 0
    b, o = slots[keep] // BLOCK_SIZE, slots[keep] % BLOCK_SIZE
    fp8 = cache_torch_dtype(kv_cache_dtype, torch.float32)
    assert torch.equal(cache.key[b, o].view(torch.uint8), k[keep].to(fp8).view(torch.uint8))
    assert torch.equal(cache.value[b, o].view(torch.uint8), v[keep].to(fp8).view(torch.uint8))


def test_a_wider_input_is_rounded_into_a_narrower_cache():
    cache = _cache(torch.bfloat16, KVCacheLayout.STACKED)
    k, v = _tokens(torch.float32, 16, seed=3)
    slots = _slots(16, seed=3)
    reshape_and_cache(k, v, cache.key, cache.value, slots)
    keep = slots >= 0
    b, o = slots[keep] // BLOCK_SIZE, slots[keep] % BLOCK_SIZE
    assert torch.equal(cache.key[b, o], k[keep].to(torch.bfloat16))


def test_bad_arguments_are_refused():
    cache = _cache(torch.float32, KVCacheLayout.LBNHC)
    k, v = _tokens(torch.float32, 4)
    with pytest.raises(ValueError, match="shorter"):
        reshape_and_cache(k, v, cache.key, cache.value, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="heads"):
        reshape_and_cache(k[:, :2], v[:, :2], cache.key, cache.value, torch.arange(4))
    with pytest.raises(ValueError, match="fp8"):
        reshape_and_cache(k, v, cache.key, cache.value, torch.arange(4), "fp8",
                          torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        cache_torch_dtype("int4", torch.float16)
