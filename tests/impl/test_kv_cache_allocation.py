"""The worker's KV cache allocation over a whole config (impl/worker/
kv_cache_allocation.py; specs/WORKER_BLOCK_TABLE.md, "The KV cache tensors").
Every expected shape, stride and offset below is worked out by hand from the
spec's rules, not read back from the code."""

import pytest
import torch

from impl.hisparse.specs import HiSparseHotSpec
from impl.kv_cache_sizing import (
    KVCacheConfigPlan,
    KVCacheTensor,
    get_kv_cache_config_from_groups,
)
from impl.kv_cache_spec import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, MLAAttentionSpec
from impl.uniform_type_spec import UniformTypeKVCacheSpecs
from impl.worker.kv_cache_allocation import allocate_kv_cache, element_type, plan_tensor_views

# 4 tokens, 2 KV heads, head size 3, fp16: a cell is K+V = 6 elements = 12 bytes,
# a page 2 heads x 4 states x 12 = 96 bytes.
FULL = FullAttentionSpec(4, num_kv_heads=2, head_size=3, dtype_size=2,
                         dtype_label="torch.float16")
PAGE = 96


def _full_config(num_blocks=5, layers=("a", "b")):
    """Layer-outer plan by hand: each layer its own region of num_blocks pages."""
    size = PAGE * num_blocks * len(layers)
    tensor = KVCacheTensor(size, list(layers), layer_stride=PAGE * num_blocks,
                           block_stride=PAGE)
    return KVCacheConfigPlan(num_blocks, [tensor], [KVCacheGroupSpec(tuple(layers), FULL)])


def test_layer_outer_views_follow_the_layout_order():
    caches = allocate_kv_cache(_full_config(), "LBNHC")
    a, b = caches["a"], caches["b"]
    # [B, H, N, C] in fp16 elements: C = 12 bytes / 2.
    assert a.shape == (5, 2, 4, 6) and a.dtype == torch.float16
    # LBNHC: C innermost (1), then H (6), then N (2 heads x 6 = 12), B fixed
    # at 96 bytes = 48 elements.
    assert a.stride() == (48, 6, 12, 1)
    # Layer b starts one region (5 pages = 480 bytes = 240 elements) later.
    assert b.storage_offset() - a.storage_offset() == 240
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert torch.all(a == 0)  # zeroed


def test_head_outer_order_within_a_block():
    a = allocate_kv_cache(_full_config(), "LBHNC")["a"]
    # LBHNC: C (1), N (6: one cell), H (4 states x 6 = 24), B fixed 48.
    assert a.stride() == (48, 24, 6, 1)


def _sparse_mla_config(num_blocks=3):
    """Block-outer, one uniform group: a 32-byte MLA page and a 16-byte
    indexer page side by side in every 48-byte block."""
    target = MLAAttentionSpec(4, num_kv_heads=1, head_size=8, dtype_size=1,
                              dtype_label="torch.uint8")
    indexer = MLAAttentionSpec(4, num_kv_heads=1, head_size=4, dtype_size=1,
                               dtype_label="torch.uint8", cache_role="indexer")
    group = KVCacheGroupSpec(("t", "i"), UniformTypeKVCacheSpecs(
        4, {"t": target, "i": indexer}))
    size = 48 * num_blocks
    tensors = [KVCacheTensor(size, ["t"], 32, 48, 0), KVCacheTensor(size, ["i"], 16, 48, 32)]
    return KVCacheConfigPlan(num_blocks, tensors, [group])


def _block_bytes(raw_view):
    """Which bytes of the allocation a view's elements are."""
    # The same strides over a fresh byte buffer: the bytes it marks.
    start = raw_view.data_ptr() - raw_view.untyped_storage().data_ptr()
    probe = torch.zeros(raw_view.untyped_storage().nbytes(), dtype=torch.uint8)
    probe.as_strided(raw_view.shape, raw_view.stride(), start).fill_(1)
    return set(probe.nonzero().flatten().tolist())


def test_block_outer_pages_sit_side_by_side():
    caches = allocate_kv_cache(_sparse_mla_config(), "BLHNC")
    t, i = caches["t"], caches["i"]
    # BLHNC: C (1), N (8 bytes a state), H (32: 4 states, one head), B 48.
    assert t.shape == (3, 1, 4, 8) and t.stride() == (48, 32, 8, 1)
    assert i.shape == (3, 1, 4, 4) and i.stride() == (48, 16, 4, 1)
    assert i.storage_offset() - t.storage_offset() == 32
    # Block 1 of the target is bytes 48..79; the indexer's block 0 is 32..47
    # and its block 1 80..95: never the same bytes.
    assert _block_bytes(t[1]) == set(range(48, 80))
    assert _block_bytes(i[0]) == set(range(32, 48))
    t[1].fill_(7)
    assert torch.all(i == 0)
    # Flat rows as a sparse kernel reads them: block b's row r is row b * 6 + r
    # (48 bytes a block / 8 bytes a row).
    rows = t.squeeze(1).as_strided((2 * 6 + 4, 8), (8, 1))
    assert torch.all(rows[6:10] == 7)


def test_negative_control_a_dense_view_misaddresses_the_packed_block():
    """What the side-by-side test catches: viewing the target as if its
    blocks were contiguous 32-byte pages puts its block 1 on the indexer's
    block 0 bytes."""
    caches = allocate_kv_cache(_sparse_mla_config(), "BLHNC")
    t = caches["t"]
    dense = t.as_strided((3, 1, 4, 8), (32, 32, 8, 1))
    assert _block_bytes(dense[1]) != set(range(48, 80))
    assert _block_bytes(dense[1]) & _block_bytes(caches["i"][0])


def test_kernel_blocks_split_a_dense_block():
    caches = allocate_kv_cache(_full_config(), "LBNHC", kernel_block_sizes=[2])
    a = caches["a"]
    # 5 blocks of 4 tokens as 10 kernel blocks of 2: N = 2 states, block
    # stride 96 / 2 = 48 bytes = 24 elements.
    assert a.shape == (10, 2, 2, 6) and a.stride() == (24, 6, 12, 1)
    # Kernel block 3 is block 1's second half: bytes 96 + 48 = 144 from a.
    assert (a[3].data_ptr() - a.data_ptr()) == 144


def test_a_short_kernel_list_leaves_later_groups_unsplit():
    config = _full_config()
    assert plan_tensor_views(config, config.kv_cache_tensors[0], "LBNHC", []).shape == (
        2, 5, 2, 4, 12)


def test_kernel_blocks_refused_where_a_block_is_not_one_dense_page():
    # Block-outer with two layers: a block is both layers' pages (192 bytes).
    tensor = KVCacheTensor(PAGE * 2 * 5, ["a", "b"], layer_stride=PAGE, block_stride=2 * PAGE)
    config = KVCacheConfigPlan(5, [tensor], [KVCacheGroupSpec(("a", "b"), FULL)])
    allocate_kv_cache(config, "BLHNC")  # unsplit: fine
    with pytest.raises(ValueError, match="BLHNC"):
        allocate_kv_cache(config, "BLHNC", kernel_block_sizes=[2])
    with pytest.raises(AssertionError):
        allocate_kv_cache(_full_config(), "LBNHC", kernel_block_sizes=[3])


def test_one_allocation_and_empty_configs():
    assert allocate_kv_cache(KVCacheConfigPlan(4, [], []), "LBNHC") == {}
    config = _full_config()
    config.kv_cache_tensors.append(KVCacheTensor(1, ["c"], 1, 1))
    with pytest.raises(ValueError, match="allocation sizes"):
        allocate_kv_cache(config, "LBNHC")


def test_spec_without_layer_views_gets_the_whole_allocation():
    hot = HiSparseHotSpec(16, page_size=64, blocks_per_request=2)
    config = KVCacheConfigPlan(3, [KVCacheTensor(192, ["h"], 64, 64)],
                               [KVCacheGroupSpec(("h",), hot)])
    raw = allocate_kv_cache(config, "BLHNC")["h"]
    assert raw.shape == (192,) and raw.dtype == torch.int8


def test_mamba_stays_in_bytes():
    mamba = MambaSpec(16, shapes=((2, 3),), dtype_sizes=(2,))  # a 12-byte state
    config = KVCacheConfigPlan(4, [KVCacheTensor(48, ["m"], 48, 12)],
                               [KVCacheGroupSpec(("m",), mamba)])
    m = allocate_kv_cache(config, "LBNHC")["m"]
    assert m.shape == (4, 1, 1, 12) and m.dtype == torch.int8 and m.stride()[0] == 12


def test_element_type_reads_the_label():
    assert element_type(FULL) is torch.float16
    unlabelled = FullAttentionSpec(4, num_kv_heads=2, head_size=3, dtype_size=2)
    assert element_type(unlabelled) is None
    with pytest.raises(ValueError, match="bytes an element"):
        element_type(FullAttentionSpec(4, dtype_size=4, dtype_label="torch.float16"))


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_views_of_a_sizing_plan_cover_each_layer_once(layout):
    """A plan made by impl's sizing, viewed: each layer's blocks are its own bytes."""
    specs = {"x": MLAAttentionSpec(4, head_size=8, dtype_size=1, dtype_label="torch.uint8"),
             "y": MLAAttentionSpec(4, head_size=4, dtype_size=1, dtype_label="torch.uint8")}
    group = KVCacheGroupSpec(("x", "y"), UniformTypeKVCacheSpecs(4, specs))
    plan = get_kv_cache_config_from_groups([group], 48 * 6, layout=layout)
    caches = allocate_kv_cache(plan, layout)
    for value, name in enumerate(("x", "y"), start=1):
        caches[name].fill_(value)
    for value, name in enumerate(("x", "y"), start=1):
        assert torch.all(caches[name] == value)
        assert caches[name].shape[0] == plan.num_blocks == 6
