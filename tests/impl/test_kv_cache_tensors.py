"""KV cache allocation: raw buffers of the sizing plan, per-layer key/value
views whose elements sit where each layout says."""

import pytest
import torch

from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    KVCacheTensor,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

SHAPE = KVCacheShape(block_size=4, num_kv_heads=2, head_size=3, dtype=torch.float16)
PAGE = 2 * 4 * 2 * 3 * 2  # bytes: K and V of 4 tokens x 2 heads x 3 dims, fp16


def _numbered(layout, num_blocks=5):
    """A cache whose raw elements are numbered 0, 1, 2, ... in memory order."""
    plan = plan_kv_cache_tensors(["l"], num_blocks, SHAPE, layout)
    c = allocate_kv_cache(plan, num_blocks, SHAPE, layout)["l"]
    flat = c.raw.view(-1) if c.raw.is_contiguous() else None
    assert flat is not None
    flat.copy_(torch.arange(flat.numel(), dtype=torch.float16))
    return c


def test_page_size_is_vllms():
    assert SHAPE.page_size_bytes == PAGE
    plan = plan_kv_cache_tensors(["a", "b"], 7, SHAPE)
    assert [t.size for t in plan] == [7 * PAGE, 7 * PAGE]
    assert [t.layers for t in plan] == [("a",), ("b",)]


def test_stacked_layout_is_k_blocks_then_v_blocks():
    c = _numbered(KVCacheLayout.STACKED)
    assert c.raw.shape == (2, 5, 4, 2, 3)
    half = 5 * 4 * 2 * 3  # elements of K of all blocks
    # key[b, n, h, d] at ((b * 4 + n) * 2 + h) * 3 + d; value half later.
    assert c.key[1, 2, 1, 0] == ((1 * 4 + 2) * 2 + 1) * 3
    assert c.value[1, 2, 1, 0] == half + ((1 * 4 + 2) * 2 + 1) * 3


def test_lbnhc_keeps_a_tokens_key_and_value_side_by_side():
    c = _numbered(KVCacheLayout.LBNHC)
    assert c.raw.shape == (5, 4, 2, 6)
    base = ((3 * 4 + 1) * 2 + 1) * 6  # block 3, token 1, head 1
    assert c.key[3, 1, 1].tolist() == [base, base + 1, base + 2]
    assert c.value[3, 1, 1].tolist() == [base + 3, base + 4, base + 5]


def test_cpu_attn_pages_are_k_column_major_then_v_row_major_per_head():
    c = _numbered(KVCacheLayout.CPU_ATTN)
    assert c.raw.shape == (5, 2, 4, 6)  # vLLM CPU_ATTN's allocation shape
    region = 4 * 3  # block_size * head_size
    head_base = (2 * 2 + 1) * 2 * region  # block 2, head 1
    # K: [dim, token]; V: [token, dim], after K.
    assert c.key[2, 3, 1, 2] == head_base + 2 * 4 + 3
    assert c.value[2, 3, 1, 2] == head_base + region + 3 * 3 + 2


def test_several_layers_in_one_buffer_and_fill():
    layer_stride = 3 * PAGE
    t = KVCacheTensor(size=2 * layer_stride + 8, layers=("x", "y"), layer_stride=layer_stride,
                      block_stride=PAGE, offset=8)
    caches = allocate_kv_cache([t], 3, SHAPE, KVCacheLayout.LBNHC, fill=1.5)
    x, y = caches["x"], caches["y"]
    assert x.key.untyped_storage().data_ptr() == y.key.untyped_storage().data_ptr()
    assert (x.key == 1.5).all() and (y.value == 1.5).all()
    y.key.zero_()
    assert (x.key == 1.5).all(), "layers must not overlap"
    assert x.raw.data_ptr() - x.raw.untyped_storage().data_ptr() == 8


def test_fp8_caches_allocate():
    shape = KVCacheShape(16, 2, 32, torch.float8_e4m3fn)
    plan = plan_kv_cache_tensors(["l"], 4, shape, KVCacheLayout.CPU_ATTN)
    c = allocate_kv_cache(plan, 4, shape, KVCacheLayout.CPU_ATTN, fill=0.0)["l"]
    assert c.key.dtype == torch.float8_e4m3fn and c.key.shape == (4, 16, 2, 32)


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="need"):
        allocate_kv_cache([KVCacheTensor(PAGE, ("l",), PAGE, PAGE)], 2, SHAPE)
    with pytest.raises(ValueError, match="block_stride"):
        allocate_kv_cache([KVCacheTensor(9 * PAGE, ("l",), 9 * PAGE, PAGE // 2)], 2, SHAPE)
    with pytest.raises(ValueError, match="half a page"):
        allocate_kv_cache([KVCacheTensor(9 * PAGE, ("l",), 9 * PAGE, PAGE)], 2, SHAPE,
                          KVCacheLayout.STACKED)
    with pytest.raises(ValueError, match="multiples"):
        allocate_kv_cache([KVCacheTensor(9 * PAGE, ("l",), 9 * PAGE, PAGE, offset=1)], 2, SHAPE)
    two = plan_kv_cache_tensors(["l"], 2, SHAPE) * 2
    with pytest.raises(ValueError, match="more than one"):
        allocate_kv_cache(two, 2, SHAPE)


def test_an_mla_layer_caches_one_latent_row_per_token():
    """vLLM's MLAAttentionSpec page: block_size x head_size (no separate value),
    allocated (num_blocks, block_size, head_size) whatever the layout."""
    shape = KVCacheShape(block_size=4, num_kv_heads=1, head_size=6, dtype=torch.float16,
                         mla=True)
    assert shape.page_size_bytes == 4 * 6 * 2
    for layout in KVCacheLayout:
        plan = plan_kv_cache_tensors(["l"], 3, shape, layout)
        c = allocate_kv_cache(plan, 3, shape, layout)["l"]
        assert c.raw.shape == (3, 4, 6) and c.key.shape == (3, 4, 1, 6)
        c.raw.copy_(torch.arange(72, dtype=torch.float16).view(3, 4, 6))
        assert c.key[2, 1, 0, 5] == 2 * 24 + 1 * 6 + 5
        assert c.value.data_ptr() == c.key.data_ptr()
