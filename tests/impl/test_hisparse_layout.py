"""HiSparse's grouping and pool sizing (impl/hisparse/layout.py, spec §14.5),
and the spec / config helpers beside it (has_layer_views, transfer groups,
zeroing). Expected values are worked out by hand in the comments."""

import pytest

from impl import kv_cache_planning as iplan
from impl import kv_cache_sizing as isizing
from impl.hisparse import layout as hl
from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_spec import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
)
from impl.profiles import HiSparseLayoutStage

BS = 64


def _mla(head_size, role="sparse", leader=False, **kw):
    return MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=head_size, dtype_size=2,
                            cache_role=role, is_index_group_leader=leader, **kw)


def _model(layers=4):
    specs = {}
    for i in range(layers):
        specs[f"l{i}"] = _mla(576, leader=True)
        specs[f"l{i}.indexer"] = _mla(128, role="indexer")
    return specs


def _no_rest(specs):
    raise AssertionError(f"unexpected non-MLA layers {list(specs)}")


def test_groups_order_roles_and_derived_names():
    planning = hl.HiSparsePlanning(index_topk=128)
    groups = hl.hisparse_kv_cache_groups(_model(), planning, _no_rest)
    source, indexer, *rest = groups
    assert source.role is KVCacheGroupRole.HISPARSE_SOURCE and source.host_resident
    assert indexer.role is KVCacheGroupRole.HISPARSE_INDEXER and not indexer.host_resident
    assert source.layer_names == ("l0", "l1", "l2", "l3")
    # A source page (576 x 2 x 64 = 73728 B) exceeds the indexer page (4 x 128 x 2
    # x 64 = 65536 B): every leader's unit gets its own resident and hot group.
    residents, hots = rest[:4], rest[4:]
    assert [g.layer_names for g in residents] == [(f"l{i}.hisparse_resident",) for i in range(4)]
    assert [g.layer_names for g in hots] == [(f"l{i}.hisparse_hot",) for i in range(4)]
    # (1 query + 1) x top-128 rows = 256 rows = 4 blocks of 64.
    assert all(g.kv_cache_spec == HiSparseHotSpec(block_size=BS, page_size=73728,
                                                  blocks_per_request=4) for g in hots)
    assert not any(g.enable_kv_transfer for g in rest)
    assert source.enable_kv_transfer and indexer.enable_kv_transfer


def test_units_pack_up_to_the_indexer_page():
    # Two small source layers (head 64: 8192 B) per leader fit the indexer page
    # of 4 x 16384 B twice over: all four layers land in one hot group.
    specs = {}
    for i in range(4):
        specs[f"s{i}"] = _mla(64, leader=i % 2 == 0)
        specs[f"s{i}.indexer"] = _mla(128, role="indexer")
    groups = hl.hisparse_kv_cache_groups(specs, hl.HiSparsePlanning(index_topk=64), _no_rest)
    assert len(groups) == 4  # source, indexer, one resident, one hot
    assert groups[2].layer_names == tuple(f"s{i}.hisparse_resident" for i in range(4))


def test_refusals():
    planning = hl.HiSparsePlanning(index_topk=128)
    v4 = {"a": _mla(512, model_version="deepseek_v4")}
    with pytest.raises(ValueError, match="DeepSeek V4"):
        hl.hisparse_kv_cache_groups(v4, planning, _no_rest)
    with pytest.raises(ValueError, match="indexer"):
        hl.hisparse_kv_cache_groups({"a": _mla(576)}, planning, _no_rest)
    with pytest.raises(ValueError, match="cannot hold"):
        hl.HiSparsePlanning(index_topk=128, device_buffer_size=127).hot_rows()
    with pytest.raises(ValueError, match="int16"):
        hl.HiSparsePlanning(index_topk=128, device_buffer_size=(1 << 15) + 1).hot_rows()
    assert hl.hisparse_kv_cache_groups({"f": FullAttentionSpec(block_size=BS)}, planning,
                                       _no_rest) is None


@pytest.mark.parametrize("extra, ok", [(1, False), (2, True)])
def test_host_pool_holds_one_longest_request(extra, ok):
    groups = hl.hisparse_kv_cache_groups(_model(1), hl.HiSparsePlanning(index_topk=128),
                                         _no_rest)
    page = 73728
    # max_model_len 4 blocks: 4 pages + the null block + a copy-on-write tail.
    budget = (4 + extra) * page
    if ok:
        assert hl.plan_host_pool(groups, 4 * BS, budget, False).host_num_blocks == 6
    else:
        with pytest.raises(ValueError, match="host_pool_gib"):
            hl.plan_host_pool(groups, 4 * BS, budget, False)


def test_shared_host_pool_rounds_the_stride_to_os_pages():
    import mmap

    groups = hl.hisparse_kv_cache_groups(_model(1), hl.HiSparsePlanning(index_topk=128),
                                         _no_rest)
    pools = hl.plan_host_pool(groups, BS, 2**30, True)
    assert pools.host_block_stride % mmap.PAGESIZE == 0
    assert pools.host_block_stride >= 73728 > pools.host_block_stride - mmap.PAGESIZE
    assert pools.host_num_blocks == 2**30 // pools.host_block_stride


def _steady_state_config():
    attn = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype_size=2)
    page = attn.page_size_bytes
    return [
        KVCacheGroupSpec(("source",), attn, host_resident=True),
        KVCacheGroupSpec(("indexer",), attn),
        KVCacheGroupSpec(("resident",), HiSparseResidentSpec(block_size=16, page_size=page)),
        KVCacheGroupSpec(("hot",), HiSparseHotSpec(block_size=16, page_size=page,
                                                   blocks_per_request=4)),
    ]


def _pages(group):
    return isizing.pages_per_request(group, 160, max_in_flight_tokens=160)


def test_steady_state_concurrency_caps_resident_pages():
    groups = _steady_state_config()
    # Admission: indexer 10 + resident 10 + hot 4 = 24; steady: 10 + 2 + 4 = 16;
    # 1 + (64 - 24) / 16 = 3.5, under the host's 100 / 10.
    assert hl.steady_state_concurrency(groups, 64, 100, _pages) == 3.5
    # The worst case charges every resident page: 64 / 24.
    assert isizing.get_max_concurrency(groups, 64, 160, 100,
                                       max_in_flight_tokens=160) == pytest.approx(64 / 24)
    # Host pool the tighter bound: 20 / 10.
    assert hl.steady_state_concurrency(groups, 64, 20, _pages) == 2.0


def test_steady_state_negative_control(monkeypatch):
    """An uncapped resident window (the bug) must change the answer."""
    monkeypatch.setattr(hl, "ACTIVE_TAIL_PAGES", 10**6)
    assert hl.steady_state_concurrency(_steady_state_config(), 64, 100, _pages) != 3.5


def test_plan_puts_host_tensors_first_and_sizes_both_pools():
    planning = hl.HiSparsePlanning(index_topk=128, host_pool_bytes=2**30)
    groups = hl.hisparse_kv_cache_groups(_model(1), planning, _no_rest)
    plan = hl.plan_hisparse_config(groups, 2**30, BS, planning, "BLHNC",
                                   num_gpu_blocks_override=7)
    assert plan.num_blocks == 7
    assert plan.hisparse_host_num_blocks == 2**30 // 73728
    host = [t for t in plan.kv_cache_tensors if t.host_resident]
    assert plan.kv_cache_tensors[:len(host)] == host and host[0].layers == ["l0"]
    assert host[0].block_stride == 73728
    assert host[0].layer_stride == 73728 * plan.hisparse_host_num_blocks
    with pytest.raises(ValueError, match="outermost"):
        hl.plan_hisparse_config(groups, 2**30, BS, planning, "LBNHC")


def test_layer_views_and_slot_mapping():
    attn = FullAttentionSpec(block_size=16)
    assert attn.has_layer_views and attn.uses_slot_mapping
    assert not CircularBufferSpec(block_size=4).uses_slot_mapping
    assert not HiSparseResidentSpec(block_size=16, page_size=8).has_layer_views
    hot = HiSparseHotSpec(block_size=16, page_size=8, blocks_per_request=1)
    assert not hot.has_layer_views and not hot.uses_slot_mapping


def test_transfer_groups_and_selection():
    full = FullAttentionSpec(block_size=4)
    config = KVCacheConfig(num_blocks=1, kv_cache_groups=(
        KVCacheGroupSpec(("a",), full),
        KVCacheGroupSpec(("b",), CircularBufferSpec(block_size=4)),
        KVCacheGroupSpec(("c",), full, enable_kv_transfer=False),
    ))
    assert config.transfer_group_ids == (0, 1)
    assert config.prefix_cacheable_group_ids == (0,)
    first, second = [1], [2]
    selected = config.select_transfer_block_ids((first, second, [3]))
    assert selected == ([1], [2]) and selected[0] is first
    with pytest.raises(ValueError):
        config.select_transfer_block_ids(([1],))


def test_needs_kv_cache_zeroing():
    bf16 = FullAttentionSpec(block_size=4, dtype_size=2, dtype_label="bf16")
    fp16 = FullAttentionSpec(block_size=4, dtype_size=2, dtype_label="fp16")
    mamba = MambaSpec(block_size=4, shapes=((4, 1),), dtype_sizes=(4,))
    uniform = isizing.UniformTypeKVCacheSpecs(4, {"m": mamba})
    assert isizing.needs_kv_cache_zeroing([KVCacheGroupSpec(("m",), uniform)])
    assert not isizing.needs_kv_cache_zeroing([KVCacheGroupSpec(("a", "b"), bf16)])
    assert isizing.needs_kv_cache_zeroing([KVCacheGroupSpec(("a",), bf16),
                                           KVCacheGroupSpec(("b",), fp16)])
    # The host pool is never zeroed on the device: its precision does not count.
    assert not isizing.needs_kv_cache_zeroing([
        KVCacheGroupSpec(("a",), bf16, host_resident=True), KVCacheGroupSpec(("b",), fp16)])


# -- 0.30: groups derived when planned (profile hisparse_layout_stage) ---------------------

_AT_PLANNING = dict(layout_stage=HiSparseLayoutStage.PLANNING)


def _with_full_attention():
    specs = _model(1)
    specs["f"] = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=64, dtype_size=2)
    return specs


def _planner(**planning):
    return iplan.KVCachePlanningConfig(
        max_model_len=BS, kv_cache_layout="BLHNC",
        hisparse=hl.HiSparsePlanning(index_topk=128, host_pool_bytes=2**30, **planning))


def test_planning_stage_groups_only_the_mla_layers():
    mla, full = _planner(**_AT_PLANNING).groups(_with_full_attention())
    assert mla.layer_names == ("l0", "l0.indexer") and mla.role is None
    assert isinstance(mla.kv_cache_spec, isizing.UniformTypeKVCacheSpecs)
    assert full.layer_names == ("f",)
    # An MLA-only model is grouped as usual (into that one group).
    assert hl.hisparse_kv_cache_groups(_model(1), hl.HiSparsePlanning(128, **_AT_PLANNING),
                                       _no_rest) is None


def test_planning_stage_derives_the_groups_grouping_would():
    later = _planner(**_AT_PLANNING)
    now = _planner()
    specs = _with_full_attention()
    assert (later.plan(later.groups(dict(specs)), 2**30)
            == now.plan(now.groups(dict(specs)), 2**30))


def test_planning_stage_does_not_fit_the_host_pool_to_max_model_len():
    # The budget of test_host_pool_holds_one_longest_request that 0.31 refuses.
    cfg = _planner(**_AT_PLANNING)
    groups = cfg.groups(_with_full_attention())
    pools = hl.hisparse_layout(groups, 4 * BS, cfg.hisparse, 5 * 73728)
    assert pools.host_num_blocks == 5
    assert [g.role for g in pools.device_groups[:1]] == [KVCacheGroupRole.HISPARSE_INDEXER]


def test_planning_stage_device_need_is_indexer_and_other_groups():
    cfg = _planner(**_AT_PLANNING)
    groups = cfg.groups(_with_full_attention())
    # max_model_len of one block: the indexer's page (128 x 2 x 64 = 16384 B)
    # and the full layer's (2 x 64 x 2 x 64 = 16384 B); the source's 73728 B
    # live on the host.
    assert hl.planned_device_usage(groups, cfg.usage) == 16384 + 16384


def test_planning_stage_workers_plan_with_the_smallest_memory():
    cfg = _planner(**_AT_PLANNING)
    plans, _ = iplan.get_kv_cache_configs([_with_full_attention()] * 2, [2**30, 2**29], cfg)
    assert plans[0].num_blocks == plans[1].num_blocks
    assert [t.size for t in plans[0].kv_cache_tensors] == [
        t.size for t in plans[1].kv_cache_tensors]
