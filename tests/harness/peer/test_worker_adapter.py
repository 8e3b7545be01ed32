"""harness/peer/adapters/worker.py: vLLM's worker table and per-rank length
names over impl, held to vLLM's own objects on the same calls (vLLM is
required: these import it)."""

import numpy as np
import pytest
import torch

from harness.backends.vllm_worker import _overrides_registered
from harness.peer.adapters import worker


def _drive(tables):
    tables.add_row(([1, 2, 3], [7]), 0)
    tables.add_row(([4], [8, 9]), 1)
    tables.append_row(([5], []), 1)
    tables.add_row(([6, 10], [11]), 2)
    tables.move_row(2, 0)
    tables.swap_row(0, 1)
    tables.clear_row(1)
    tables.add_row(([12], [13]), 2)


def test_tables_match_vllms_after_the_same_row_operations():
    from vllm.v1.worker.block_table import MultiGroupBlockTable, SlotMappingMode

    kw = dict(max_num_reqs=4, max_num_batched_tokens=32, pin_memory=False,
              device=torch.device("cpu"), block_sizes=[4, 16], max_num_blocks=[5, 3],
              slot_mapping_modes=[SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.NONE])
    ref, ours = MultiGroupBlockTable(**kw), worker.MultiGroupBlockTable(**kw)
    _drive(ref)
    _drive(ours)
    for a, b in zip(ref.block_tables, ours.block_tables):
        assert a.max_num_blocks_per_req == b.max_num_blocks_per_req
        assert np.array_equal(a.block_table.np, b.block_table.np)
        assert np.array_equal(a.num_blocks_per_row, b.num_blocks_per_row)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    pos = torch.tensor([0, 4, 9, 2, 3], dtype=torch.int64)
    ours.compute_slot_mapping(2, qsl, pos)
    _overrides_registered()  # vLLM's CPU slot-mapping op, as the gate runs it
    ref.commit_block_table(2)
    ref.compute_slot_mapping(2, qsl, pos)
    assert ours[0].slot_mapping.np[:5].tolist() == ref[0].slot_mapping.gpu[:5].tolist()
    assert ours[0].slot_mapping.np[:5].tolist() == [16, 20, 1, 2, 3]
    # Field-by-field equality (as vLLM's InputBatch test compares tables) is
    # over impl's arrays: one differing entry makes two tables unequal.
    other = worker.MultiGroupBlockTable(**kw)
    _drive(other)
    assert ours[0].block_table == other[0].block_table
    other.append_row(([99], []), 0)
    assert ours[0].block_table != other[0].block_table
    assert "_impl" not in dir(ours[0])


@pytest.mark.parametrize("world,interleave", [(2, 16), (4, 16), (8, 16), (4, 1), (2, 3)])
def test_per_rank_lengths_match_vllms(world, interleave):
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    lens = torch.tensor([0, 1, 2, 10, 33, 100, 257], dtype=torch.int32)
    assert torch.equal(worker.get_dcp_local_seq_lens(lens, world, None, interleave),
                       get_dcp_local_seq_lens(lens, world, None, interleave))
    for r in range(world):
        assert torch.equal(worker.get_dcp_local_seq_lens(lens, world, r, interleave),
                           get_dcp_local_seq_lens(lens, world, r, interleave))


def test_the_input_batch_builds_impls_table_once_rebound():
    from vllm.v1.worker import gpu_input_batch

    from harness.peer import rebind

    saved = gpu_input_batch.MultiGroupBlockTable
    try:
        rebind.rebind_vllm_callers()
        assert gpu_input_batch.MultiGroupBlockTable is worker.MultiGroupBlockTable
    finally:
        gpu_input_batch.MultiGroupBlockTable = saved


def _vllm_planned(layout: str, specs: dict, memory: int):
    """vLLM's own grouping and tensor plan for `specs` (a stand-in engine
    config, as vLLM's packing tests use)."""
    from unittest.mock import MagicMock

    from vllm.config import CacheConfig
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, UniformTypeKVCacheSpecs

    config = MagicMock()
    config.cache_config = CacheConfig()
    config.cache_config.num_gpu_blocks_override = None
    config.cache_config.kv_cache_layout = layout
    config.attention_config.hisparse_config = None
    groups = []
    for names in specs:
        layer_specs = specs[names]
        spec = (UniformTypeKVCacheSpecs(block_size=next(iter(layer_specs.values())).block_size,
                                        kv_cache_specs=layer_specs)
                if len(set(layer_specs.values())) > 1 else next(iter(layer_specs.values())))
        groups.append(KVCacheGroupSpec(list(layer_specs), spec))
    return get_kv_cache_config_from_groups(config, groups, memory)


def _sparse_mla_specs():
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowSpec, SparseCacheRole

    common = dict(block_size=64, num_kv_heads=1, dtype=torch.uint8)
    target = MLAAttentionSpec(**common, head_size=576, state_content_bytes=656,
                              block_stride_alignment=656, cache_dtype_str="fp8_ds_mla")
    indexer = MLAAttentionSpec(**common, head_size=132, cache_role=SparseCacheRole.INDEXER,
                               block_stride_alignment=512)
    draft = SlidingWindowSpec(block_size=64, num_kv_heads=4, head_size=64,
                              dtype=torch.bfloat16, sliding_window=2048)
    return {"main": {"t.0": target, "t.1": target, "i.0": indexer},
            "draft": {"d.0": draft}}


def _full_specs():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    return {"main": {f"l.{i}": full for i in range(3)}}


@pytest.mark.parametrize("layout,specs,kernel", [
    ("BLHNC", _sparse_mla_specs, [64, 64]),
    ("BLNHC", _sparse_mla_specs, None),
    ("LBNHC", _full_specs, [8]),
    ("BLHNC", _full_specs, None),
    ("LHBNC", _full_specs, [16]),
])
def test_allocation_views_match_vllms(layout, specs, kernel):
    from vllm.v1.kv_cache_interface import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    config = _vllm_planned(layout, specs(), 8 * 1024 * 1024)
    ref = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout[layout], kernel)
    ours = worker.allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout[layout], kernel)
    assert set(ours) == set(ref)
    for name, view in ref.items():
        mine = ours[name]
        assert (mine.shape, mine.stride(), mine.dtype, mine.storage_offset()) == (
            view.shape, view.stride(), view.dtype, view.storage_offset()), name
        assert mine.untyped_storage().nbytes() == view.untyped_storage().nbytes()


def test_allocation_refuses_what_vllm_refuses():
    """Negative control for the comparison above: a kernel split of packed
    blocks is refused on both sides (ValueError), not answered differently."""
    from vllm.v1.kv_cache_interface import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    config = _vllm_planned("BLHNC", _full_specs(), 8 * 1024 * 1024)
    with pytest.raises(ValueError):
        allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.BLHNC, [8])
    with pytest.raises(ValueError):
        worker.allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.BLHNC, [8])


@pytest.fixture
def import_hook(monkeypatch):
    """The impl run's import hook, for one test only (this suite's own
    modules are named tests.* too)."""
    import builtins

    from harness.peer import rebind

    monkeypatch.setattr(builtins, "__import__", builtins.__import__)
    monkeypatch.setattr(rebind, "_real_import", None)
    rebind.install_import_hook()
    return rebind


def test_a_test_importing_allocate_kv_cache_gets_impls(import_hook):
    """In the impl run, `from vllm.v1.worker.utils import allocate_kv_cache`
    inside a test gives the adapter; a test holding the module itself keeps
    vLLM's module (it monkeypatches other names there for vLLM's callers)."""
    import types

    import vllm.v1.worker.utils as vllm_worker_utils

    rebind = import_hook
    test_globals = {"__name__": "tests.v1.core.test_probe"}
    exec("from vllm.v1.worker.utils import allocate_kv_cache\n"
         "from vllm.v1.worker import utils as worker_utils", test_globals)
    assert test_globals["allocate_kv_cache"] is worker.allocate_kv_cache
    module = types.ModuleType("tests.v1.core.test_probe_module")
    module.worker_utils = vllm_worker_utils
    rebind.rebind_module(module)
    assert module.worker_utils is vllm_worker_utils
    # Outside vLLM's tests the name is vLLM's own.
    other = {"__name__": "somewhere_else"}
    exec("from vllm.v1.worker.utils import allocate_kv_cache", other)
    assert other["allocate_kv_cache"] is vllm_worker_utils.allocate_kv_cache
