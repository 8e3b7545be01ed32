"""Per-worker KV cache planning (impl/kv_cache_planning.py): the null block kept
back, auto-fitted max_model_len, block overrides, pipeline-parallel shares,
the fewest blocks of any worker, TP replicas, the scheduler's config.

Expected values are derived by hand below, or (tests marked `vllm`) are
vLLM's own get_kv_cache_configs for the same inputs.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from harness.backends.vllm_backend import vllm_sizing
from impl.kv_cache_planning import (
    KVCachePlanningConfig,
    check_enough_kv_cache_memory,
    estimate_max_model_len,
    generate_scheduler_kv_cache_config,
    get_kv_cache_configs,
    kv_cache_groups_tp_replicas,
    project_kv_cache_groups_to_worker,
)
from impl.kv_cache_sizing import UniformTypeKVCacheSpecs, get_kv_cache_groups
from impl.kv_cache_spec import (
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

F32 = 4


def full(bs=16, heads=2, head=64, **kw):
    return FullAttentionSpec(bs, num_kv_heads=heads, head_size=head, dtype_size=F32, **kw)


def window(bs=16, heads=2, head=64, w=1, **kw):
    return SlidingWindowSpec(bs, num_kv_heads=heads, head_size=head, dtype_size=F32,
                             sliding_window=w, **kw)


PAGE = full().page_size_bytes  # 16 x 2 x 128 x 4 = 16,384 bytes


def cfg(max_model_len=512, **kw) -> KVCachePlanningConfig:
    return KVCachePlanningConfig(max_model_len=max_model_len, **kw)


# -- hand-derived -------------------------------------------------------------------------


def test_one_request_of_max_model_len_must_fit_beside_the_null_block():
    """512 tokens take 32 blocks of 16; a pool of 32 keeps one as the null
    block, so only 31 are usable: refused; 33 fit."""
    specs = {"l": full()}
    with pytest.raises(ValueError, match="max seq len"):
        get_kv_cache_configs([specs], [32 * PAGE], cfg())
    (plan,), length = get_kv_cache_configs([specs], [33 * PAGE], cfg())
    assert (plan.num_blocks, length) == (33, 512)
    with pytest.raises(ValueError, match="max seq len"):
        check_enough_kv_cache_memory(specs, 32 * PAGE, cfg())
    check_enough_kv_cache_memory(specs, 33 * PAGE, cfg())
    with pytest.raises(ValueError, match="no memory"):
        check_enough_kv_cache_memory(specs, PAGE, cfg())


def test_the_override_is_the_pool_that_is_checked():
    """32 blocks whatever the memory: 31 usable, below the 32 a 512-token
    request needs."""
    with pytest.raises(ValueError, match="max seq len"):
        get_kv_cache_configs([{"l": full()}], [1024 * PAGE], cfg(num_gpu_blocks_override=32))


def test_auto_fit_shrinks_max_model_len_to_the_usable_blocks():
    """Memory for exactly 64 blocks of 16: 63 usable, so 1008 tokens."""
    plans, length = get_kv_cache_configs([{"l": full()}], [64 * PAGE],
                                         cfg(1024, auto_fit_max_model_len=True))
    assert length == 63 * 16 and plans[0].num_blocks == 64
    # Enough memory: the length stays; an override of 32 blocks: 31 x 16.
    assert get_kv_cache_configs([{"l": full()}], [1024 * PAGE],
                                cfg(1024, auto_fit_max_model_len=True))[1] == 1024
    assert get_kv_cache_configs([{"l": full()}], [1024 * PAGE], cfg(
        16384, auto_fit_max_model_len=True, num_gpu_blocks_override=32))[1] == 31 * 16
    with pytest.raises(ValueError, match="cannot be fitted"):
        get_kv_cache_configs([{"l": full()}], [PAGE], cfg(1024, auto_fit_max_model_len=True))


def test_estimate_is_the_longest_request_the_layers_hold():
    """32 layers of 16,384-byte pages: 512 KiB a block; 8 MiB hold 16 blocks,
    256 tokens (a longer max_model_len is the search's only bound)."""
    specs = {f"l{i}": full() for i in range(32)}
    assert estimate_max_model_len(specs, 16 * 32 * PAGE, cfg(4096)) == 256
    assert estimate_max_model_len(specs, 16 * 32 * PAGE, cfg(100)) == 100
    assert estimate_max_model_len(specs, PAGE, cfg(4096)) == 0


def test_pipeline_stages_plan_their_own_layers_with_the_fewest_blocks():
    """Stage 0 holds layer 1, stage 1 layers 2 and 3 (one full-attention
    group): each plans its share; both end with the blocks the tighter one
    affords (10), its tensors re-planned for exactly those."""
    specs = [{"l1": full()}, {"l2": full(), "l3": full()}]
    plans, _ = get_kv_cache_configs(specs, [20 * PAGE, 20 * PAGE], cfg(16))
    assert [p.num_blocks for p in plans] == [10, 10]
    assert [g.layer_names for p in plans for g in p.kv_cache_groups] == [("l1",), ("l2", "l3")]
    assert plans[0].kv_cache_tensors[0].size == 10 * PAGE
    # One layer, two specs on two workers: refused.
    with pytest.raises(AssertionError, match="different"):
        get_kv_cache_configs([{"l1": full()}, {"l1": window()}], [20 * PAGE] * 2, cfg(16))


def test_a_worker_may_hold_no_layer_of_a_group():
    groups = get_kv_cache_groups({"a": full(), "b": window()})
    mine = project_kv_cache_groups_to_worker(groups, {"b": window()})
    assert [g.layer_names for g in mine] == [(), ("b",)]
    assert mine[1] is groups[1]  # held wholly: the very same group
    uniform = KVCacheGroupSpec(("a", "c"), UniformTypeKVCacheSpecs(
        16, {"a": full(), "c": full(head=128)}))
    (part,) = project_kv_cache_groups_to_worker([uniform], {"c": full(head=128)})
    assert list(part.kv_cache_spec.kv_cache_specs) == ["c"]


@pytest.mark.parametrize("specs,tp,dcp,expected", [
    ([MLAAttentionSpec(16, head_size=576, max_tp_shards=1)], 8, 1, 8),
    ([MLAAttentionSpec(16, head_size=576, max_tp_shards=1)], 8, 2, 1),  # DCP shards it
    ([full(heads=8, max_tp_shards=2)], 8, 1, 4),
    ([full(heads=8, max_tp_shards=8)], 4, 1, 1),
    ([MLAAttentionSpec(16, head_size=576, max_tp_shards=1),
      window(heads=8, w=128, max_tp_shards=4)], 8, 1, 2),  # gcd(8, 2)
    ([full(heads=8)], 8, 1, 1),  # shards unknown: no copies
    ([HiddenStateCacheSpec(16, head_size=64)], 8, 1, 1),
])
def test_tp_replicas_are_the_gcd_over_layers(specs, tp, dcp, expected):
    groups = [KVCacheGroupSpec((f"l{i}",), s) for i, s in enumerate(specs)]
    assert kv_cache_groups_tp_replicas(groups, tp, dcp) == expected
    assert kv_cache_groups_tp_replicas([], tp, dcp) == 1


def test_scheduler_config_manages_a_uniform_group_as_its_first_layer():
    specs = {"a": full(), "b": full(head=128)}
    plans, _ = get_kv_cache_configs([specs], [3 * 32 * PAGE], cfg(16))
    assert isinstance(plans[0].kv_cache_groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)
    scheduler = generate_scheduler_kv_cache_config(plans)
    assert scheduler.kv_cache_groups[0].kv_cache_spec == full()
    assert plans[0].kv_cache_groups[0].kv_cache_spec.first_spec == full()  # plans untouched
    other = dataclasses.replace(plans[0], num_blocks=plans[0].num_blocks + 1)
    with pytest.raises(AssertionError, match="different numbers of blocks"):
        generate_scheduler_kv_cache_config([plans[0], other])


def test_windows_retain_the_drafts_prefilled_again():
    """Speculative decoding that prefills 3 tokens ahead keeps 2 tokens below
    each window (its admission cap grows with them)."""
    plans, _ = get_kv_cache_configs([{"a": full(), "w": window(w=64)}], [64 * PAGE],
                                    cfg(256, num_prefill_lookahead_tokens=3))
    (w,) = [g.kv_cache_spec for p in plans for g in p.kv_cache_groups
            if isinstance(g.kv_cache_spec, SlidingWindowSpec)]
    assert w.extra_retained_tokens == 2


def test_the_layout_is_needed_only_to_plan_tensors():
    assert get_kv_cache_configs([{}], [0], cfg(16, kv_cache_layout=None))[0][0].num_blocks == 1
    with pytest.raises(ValueError, match="not resolved"):
        get_kv_cache_configs([{"l": full()}], [64 * PAGE], cfg(16, kv_cache_layout=None))


# -- live: vLLM's own get_kv_cache_configs --------------------------------------------------


def _vllm_spec(spec):
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    if isinstance(spec, MambaSpec):
        return kvi.MambaSpec(block_size=spec.block_size, shapes=spec.shapes,
                             dtypes=tuple(torch.float32 for _ in spec.dtype_sizes),
                             num_speculative_blocks=spec.num_speculative_blocks,
                             mamba_cache_mode=spec.mamba_cache_mode)
    kw = dict(block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
              head_size=spec.head_size, dtype=torch.float32, max_tp_shards=spec.max_tp_shards)
    if isinstance(spec, SlidingWindowSpec):
        kw["sliding_window"] = spec.sliding_window
    return getattr(kvi, type(spec).__name__)(**kw)


def _vllm_config(c: KVCachePlanningConfig):
    from vllm.v1.kv_cache_layout import KVCacheLayout

    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=c.max_model_len,
                                     original_max_model_len=-1 if c.auto_fit_max_model_len
                                     else c.max_model_len),
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: KVCacheLayout[c.kv_cache_layout],
            num_gpu_blocks_override=c.num_gpu_blocks_override,
            prefix_cache_retention_interval=None, mamba_cache_mode="none"),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                         max_num_encoder_input_tokens=0),
        parallel_config=SimpleNamespace(tensor_parallel_size=c.tensor_parallel_size,
                                        decode_context_parallel_size=1),
        attention_config=SimpleNamespace(hisparse_config=None),
        device_config=SimpleNamespace(device_type="cpu"),
        speculative_config=None, num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=c.max_model_len,
    )


_MLA = MLAAttentionSpec(16, num_kv_heads=1, head_size=576, dtype_size=F32, max_tp_shards=1)
CASES = {
    # (per-worker specs, per-worker memory in pages, config)
    "tp-equal": ([{"a": full(), "b": full()}] * 2, [40, 60], cfg(64)),
    "pp-hybrid": ([{"a": full(), "w1": window()}, {"b": full(), "w2": window(), "w3": window()}],
                  [30, 30], cfg(64)),
    "auto-fit": ([{"a": full(), "b": full()}], [2 * 50], cfg(4096, auto_fit_max_model_len=True)),
    "auto-fit-pp": ([{"a": full()}, {"b": full(), "c": full()}], [70, 70],
                    cfg(4096, auto_fit_max_model_len=True)),
    "override": ([{"a": full(), "b": window()}], [500], cfg(64, num_gpu_blocks_override=9)),
    "mamba": ([{"m": MambaSpec(16, shapes=((2, 512), (3, 32, 32)), dtype_sizes=(4, 4),
                               num_speculative_blocks=2), "a": full()}], [70],
              cfg(1024, auto_fit_max_model_len=True)),
    "tp-replicas": ([{"l0": _MLA, "l1": _MLA, "w": window(heads=8, w=128, max_tp_shards=4)}],
                    [400], cfg(64, tensor_parallel_size=8)),
    "too-small": ([{"a": full(), "b": full()}], [2 * 4], cfg(64)),
}


@pytest.mark.vllm
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_configs_agree_with_vllm(case, layout):
    worker_specs, pages, config = CASES[case]
    config = dataclasses.replace(config, kv_cache_layout=layout)
    memory = [n * PAGE for n in pages]
    vllm_config = _vllm_config(config)
    vllm_specs = [{n: _vllm_spec(s) for n, s in w.items()} for w in worker_specs]
    try:
        theirs = vllm_sizing().get_kv_cache_configs(vllm_config, vllm_specs, memory)
    except ValueError:
        with pytest.raises(ValueError):
            get_kv_cache_configs(worker_specs, memory, config)
        return
    mine, length = get_kv_cache_configs(worker_specs, memory, config)
    assert length == vllm_config.model_config.max_model_len
    assert len(mine) == len(theirs)
    for p, v in zip(mine, theirs):
        assert p.num_blocks == v.num_blocks
        assert p.kv_tp_replicas == v.kv_tp_replicas
        assert [(list(g.layer_names), g.kv_cache_spec.page_size_bytes)
                for g in p.kv_cache_groups] == [
            (g.layer_names, g.kv_cache_spec.page_size_bytes) for g in v.kv_cache_groups]
        assert [(t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
                for t in p.kv_cache_tensors] == [
            (t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
            for t in v.kv_cache_tensors]
