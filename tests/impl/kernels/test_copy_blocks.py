"""copy_blocks (copy-on-write): every layer's dst block becomes a copy of its
src block, in every layout; other blocks keep their bits."""

import pytest
import torch

from impl.kernels.copy_blocks import copy_blocks
from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

NUM_BLOCKS = 10


def _layers(dtype, layout, n=3):
    shape = KVCacheShape(16, 3, 40, dtype)
    names = [f"layer.{i}" for i in range(n)]
    caches = allocate_kv_cache(plan_kv_cache_tensors(names, NUM_BLOCKS, shape, layout),
                               NUM_BLOCKS, shape, layout)
    g = torch.Generator().manual_seed(0)
    for c in caches.values():
        c.key.copy_(torch.randn(c.key.shape, generator=g).to(dtype))
        c.value.copy_(torch.randn(c.value.shape, generator=g).to(dtype))
    return list(caches.values())


@pytest.mark.parametrize("layout", list(KVCacheLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dst_blocks_become_copies_and_the_rest_is_untouched(dtype, layout):
    layers = _layers(dtype, layout)
    before = [(c.key.clone(), c.value.clone()) for c in layers]
    mapping = torch.tensor([[1, 7], [3, 2], [3, 9], [8, 4]])
    copy_blocks([c.key for c in layers], [c.value for c in layers], mapping)
    for c, (k0, v0) in zip(layers, before):
        expected_k, expected_v = k0.clone(), v0.clone()
        expected_k[mapping[:, 1]] = k0[mapping[:, 0]]
        expected_v[mapping[:, 1]] = v0[mapping[:, 0]]
        assert torch.equal(c.key, expected_k) and torch.equal(c.value, expected_v)


def test_fp8_blocks_are_copied_bit_for_bit():
    layers = _layers(torch.float8_e4m3fn, KVCacheLayout.CPU_ATTN, n=1)
    c = layers[0]
    k0 = c.key.clone()
    copy_blocks([c.key], [c.value], torch.tensor([[5, 6]]))
    assert torch.equal(c.key[6].view(torch.uint8), k0[5].view(torch.uint8))


def test_ambiguous_mappings_are_refused():
    layers = _layers(torch.float32, KVCacheLayout.LBNHC, n=1)
    keys, values = [layers[0].key], [layers[0].value]
    with pytest.raises(ValueError, match="distinct"):
        copy_blocks(keys, values, torch.tensor([[1, 2], [3, 2]]))
    with pytest.raises(ValueError, match="sources"):
        copy_blocks(keys, values, torch.tensor([[1, 2], [2, 3]]))
    with pytest.raises(ValueError, match="pairs"):
        copy_blocks(keys, values, torch.tensor([1, 2, 3]))
    copy_blocks(keys, values, torch.empty(0, 2, dtype=torch.int64))  # nothing to do
