"""KV cache sizing: pages, groups, block sizes, num_blocks, tensor plan, capacity.

Expected values are either derived by hand (the worked figures below) or, in the
tests marked `vllm`, computed by vLLM's own planning functions for the same
model shapes.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from harness.backends.vllm_backend import vllm_sizing
from impl.kv_cache_sizing import (
    KVCacheTensor,
    UniformTypeKVCacheSpecs,
    bytes_per_block,
    get_kv_cache_capacity,
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
    get_max_concurrency,
    layer_kv_cache_shape,
    layer_view_shape_bytes,
    resolve_kv_cache_block_sizes,
)
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from impl.profiles import BlockSizesRule, KVCacheTensorPlan

BF16 = 2
GiB = 1 << 30


def full(bs=16, heads=8, head=128, dtype=BF16, **kw):
    return FullAttentionSpec(bs, num_kv_heads=heads, head_size=head, dtype_size=dtype, **kw)


# -- model shapes (per layer, after tensor parallelism split the KV heads) -----------


def qwen2_0_5b():
    return {f"model.layers.{i}.self_attn.attn": full(16, 2, 64) for i in range(24)}


def llama3(num_layers: int, tp: int):
    # 8 KV heads split across TP ranks (one head a rank at most).
    return {f"model.layers.{i}.self_attn.attn": full(16, max(8 // tp, 1), 128)
            for i in range(num_layers)}


def gemma3_27b(tp: int = 1):
    # 62 layers; every 6th is global (full) attention, the rest a 1024 window.
    specs = {}
    for i in range(62):
        if (i + 1) % 6 == 0:
            specs[f"model.layers.{i}.self_attn.attn"] = full(16, 16 // tp, 128)
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = SlidingWindowSpec(
                16, num_kv_heads=16 // tp, head_size=128, dtype_size=BF16, sliding_window=1024)
    return specs


def jamba_like(attention_block_size: int = 16):
    # 32 layers, attention at layer 4 of every 8, Mamba elsewhere: conv state
    # (8192, 3) and SSM state (8192, 16), bf16.
    specs = {}
    for i in range(32):
        if i % 8 == 4:
            specs[f"model.layers.{i}.attn"] = full(attention_block_size, 8, 128)
        else:
            specs[f"model.layers.{i}.mamba"] = MambaSpec(
                16, shapes=((8192, 3), (8192, 16)), dtype_sizes=(BF16, BF16),
                mamba_cache_mode="align")
    return specs


def deepseek_v3():
    # 61 layers of MLA latents: 512 (kv_lora_rank) + 64 (rope) = 576, bf16, blocks of 64.
    return {f"model.layers.{i}.self_attn.attn": MLAAttentionSpec(
        64, num_kv_heads=1, head_size=576, dtype_size=BF16) for i in range(61)}


MODELS = {
    "qwen2-0.5b": qwen2_0_5b,
    "llama-3-8b": lambda: llama3(32, 1),
    "llama-3-8b-tp2": lambda: llama3(32, 2),
    "llama-3-8b-tp8": lambda: llama3(32, 8),
    "llama-3-70b": lambda: llama3(80, 1),
    "llama-3-70b-tp4": lambda: llama3(80, 4),
    "llama-3-70b-tp8": lambda: llama3(80, 8),
    "gemma-3-27b": gemma3_27b,
    "gemma-3-27b-tp2": lambda: gemma3_27b(2),
    "jamba-like": jamba_like,
    "jamba-like-aligned": lambda: jamba_like(80),
    "deepseek-v3": deepseek_v3,
    # One kind, two head counts: one group of per-layer pages.
    "mixed-heads": lambda: {f"l{i}": full(16, 8 if i % 2 else 4, 128) for i in range(6)},
}


# -- hand-derived ---------------------------------------------------------------------


def test_qwen2_0_5b_worked_figure():
    """2 KV heads x 16 tokens x (64 + 64) x 2 bytes = 8,192 bytes a layer; 24
    layers take 196,608 bytes a block; 25,938,100,224 / 196,608 = 131,928."""
    groups = get_kv_cache_groups(qwen2_0_5b())
    assert len(groups) == 1 and len(groups[0].layer_names) == 24
    assert groups[0].kv_cache_spec.page_size_bytes == 8192
    assert bytes_per_block(groups) == 196_608
    plan = get_kv_cache_config_from_groups(groups, 25_938_100_224)
    assert plan.num_blocks == 131_928
    # One allocation, each layer a region of 131,928 pages (layers outermost).
    (t,) = plan.kv_cache_tensors
    assert (t.size, t.layer_stride, t.block_stride, t.offset) == (
        25_938_100_224, 8192 * 131_928, 8192, 0)


def test_page_sizes_by_kind():
    assert full(16, 8, 128).page_size_bytes == 8 * 16 * 256 * 2 == 65_536
    # MLA: one 576-wide latent a token, no V.
    assert deepseek_v3()["model.layers.0.self_attn.attn"].page_size_bytes == 64 * 576 * 2
    # Mamba: its state, whatever the block size.
    m = jamba_like()["model.layers.0.mamba"]
    assert m.page_size_bytes == 8192 * 3 * 2 + 8192 * 16 * 2 == 311_296
    assert MambaSpec(4096, shapes=m.shapes, dtype_sizes=m.dtype_sizes).page_size_bytes == 311_296
    assert full(16, 8, 128, page_size_padded=70_000).page_size_bytes == 70_000


def test_tensor_parallelism_splits_the_heads_and_grows_the_pool():
    """Llama-3-70B: 80 layers x 8 heads x 16 x 256 x 2 = 5 MiB a block; TP 8
    leaves 1 head a rank: 8x the blocks from the same memory."""
    one = get_kv_cache_config_from_groups(get_kv_cache_groups(llama3(80, 1)), 40 * GiB)
    tp8 = get_kv_cache_config_from_groups(get_kv_cache_groups(llama3(80, 8)), 40 * GiB)
    assert bytes_per_block(get_kv_cache_groups(llama3(80, 1))) == 80 * 65_536
    assert one.num_blocks == 40 * GiB // (80 * 65_536) == 8192
    assert tp8.num_blocks == 8 * one.num_blocks


def test_gemma3_groups_by_the_smallest_kind():
    """52 window layers and 10 full ones: groups of 10 layers; the window
    layers fill cdiv(52, 10) = 6 groups (the last padded to 10 with 8)."""
    groups = get_kv_cache_groups(gemma3_27b())
    sizes = [len(g.layer_names) for g in groups]
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    assert kinds == ["SlidingWindowSpec"] * 6 + ["FullAttentionSpec"]
    assert sizes == [9, 9, 9, 9, 8, 8, 10]
    # Strided split: the first window group takes every 6th window layer.
    assert groups[0].layer_names[:2] == ("model.layers.0.self_attn.attn",
                                         "model.layers.7.self_attn.attn")
    # A block costs the widest group's pages: 10 layers x 128 KiB.
    assert bytes_per_block(groups) == 10 * 16 * 16 * 256 * 2


def test_jamba_pages_are_unified_by_padding():
    """Attention pages (65,536) do not divide the Mamba page (311,296): the
    attention page is padded up to it; 4 attention layers, so 7 Mamba groups of 4."""
    groups = get_kv_cache_groups(jamba_like())
    assert {g.kv_cache_spec.page_size_bytes for g in groups} == {311_296}
    assert [len(g.layer_names) for g in groups] == [4] * 8
    # Groups in the order kinds first appear: layer 0 is Mamba.
    assert [type(g.kv_cache_spec).__name__ for g in groups] == ["MambaSpec"] * 7 + [
        "FullAttentionSpec"]
    assert groups[-1].kv_cache_spec.page_size_padded == 311_296
    # Blocks of 80 attention tokens make the larger page (327,680): Mamba is padded.
    aligned = get_kv_cache_groups(jamba_like(80))
    assert {g.kv_cache_spec.page_size_bytes for g in aligned} == {327_680}


def test_a_smaller_page_grows_its_block_size_when_it_divides():
    specs = {"a": full(16, 8, 128), "b": SlidingWindowSpec(
        16, num_kv_heads=4, head_size=128, dtype_size=BF16, sliding_window=64)}
    groups = get_kv_cache_groups(specs)
    assert [g.kv_cache_spec.block_size for g in groups] == [16, 32]


def test_one_kind_with_different_heads_is_one_uniform_type_group():
    specs = {"a": full(16, 8, 128), "b": full(16, 4, 128)}
    (group,) = get_kv_cache_groups(specs)
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert group.kv_cache_spec.page_size_bytes == 65_536 + 32_768


def test_block_sizes_of_hybrid_models():
    w = SlidingWindowSpec(32, sliding_window=8)
    assert resolve_kv_cache_block_sizes([full(16)], True) == (16, 16)
    assert resolve_kv_cache_block_sizes([full(16)], True, dcp_world_size=4) == (64, 64)
    assert resolve_kv_cache_block_sizes([full(16), w], True) == (32, 16)
    assert resolve_kv_cache_block_sizes([full(16), w], False) == (32, 32)
    assert resolve_kv_cache_block_sizes([full(32), w], True, prefix_match_unit=8) == (32, 8)
    # Mamba in "none" mode cannot use hashes finer than the scheduler block.
    none = MambaSpec(64, shapes=((4,),), dtype_sizes=(4,), mamba_cache_mode="none")
    assert resolve_kv_cache_block_sizes([full(16), none], True) == (64, 64)
    # Mamba state is not sharded by DCP: only attention blocks scale.
    align = MambaSpec(64, shapes=((4,),), dtype_sizes=(4,), mamba_cache_mode="align")
    assert resolve_kv_cache_block_sizes([full(16), align], True, dcp_world_size=2) == (64, 32)
    with pytest.raises(ValueError, match="prefix_match_unit"):
        resolve_kv_cache_block_sizes([full(16), w], True, prefix_match_unit=12)
    # 0.17: the cache block size times dcp * pcp, for any number of groups.
    rule = BlockSizesRule.CACHE_BLOCK_SIZE
    assert resolve_kv_cache_block_sizes([full(16), w], True, rule=rule) == (32, 16)
    assert resolve_kv_cache_block_sizes([full(16)], True, 2, rule=rule, pcp_world_size=2) == (
        64, 64)


def test_decode_context_parallelism_capacity():
    """DCP 4 shards the token positions: a request of 8,192 tokens needs
    cdiv(8192 / 4, 16) = 128 blocks instead of 512, so 4x the concurrency."""
    groups = get_kv_cache_groups(llama3(32, 8))
    tokens, conc = get_kv_cache_capacity(groups, 10_000, 8192)
    tokens4, conc4 = get_kv_cache_capacity(groups, 10_000, 8192, dcp_world_size=4)
    assert conc == 10_000 / 512 and conc4 == 10_000 / 128
    assert (tokens, tokens4) == (int(conc * 8192), int(conc4 * 8192))


def test_recycling_kinds_cap_what_a_request_holds():
    """A window of 1024 holds cdiv(1023 + in-flight, 16) + 1 blocks whatever
    the request's length; full attention holds every block."""
    groups = get_kv_cache_groups(gemma3_27b())
    per_request = 6 * (-(-(1023 + 2048) // 16) + 1) + 1 * (32768 // 16)
    assert get_max_concurrency(groups, 100_000, 32768, max_in_flight_tokens=2048) == (
        100_000 / per_request)


def test_shared_by_plan_of_0_17():
    """0.17: each layer slot is one tensor shared by one layer of every group;
    num_blocks = memory // page // layers per group."""
    groups = get_kv_cache_groups(gemma3_27b())
    plan = get_kv_cache_config_from_groups(groups, 40 * GiB, KVCacheTensorPlan.SHARED_BY)
    page = 16 * 16 * 256 * 2
    assert plan.num_blocks == 40 * GiB // page // 10
    assert len(plan.kv_cache_tensors) == 10
    assert plan.kv_cache_tensors[0] == KVCacheTensor(
        page * plan.num_blocks, [g.layer_names[0] for g in groups])
    # Groups of 9 and 8 layers (padded) leave the last slots to fewer layers.
    assert [len(t.layers) for t in plan.kv_cache_tensors[8:]] == [5, 1]
    spec = groups[-1].kv_cache_spec
    assert layer_kv_cache_shape(spec, 7) == (2, 7, 16, 16, 128)
    assert layer_kv_cache_shape(deepseek_v3()["model.layers.0.self_attn.attn"], 7) == (
        7, 64, 576)


# -- live: vLLM's own planning functions ------------------------------------------------


_TORCH_DTYPES = {1: "uint8", 2: "bfloat16", 4: "float32"}


def _vllm_spec(spec):
    """impl's spec as vLLM's: the same fields, only those set away from
    impl's defaults (so that a release without a field still builds it)."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    cls = getattr(kvi, type(spec).__name__)
    default = type(spec)(spec.block_size)
    kw = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
          if f.init and getattr(spec, f.name) != getattr(default, f.name)}
    kw["block_size"] = spec.block_size
    if isinstance(spec, MambaSpec):
        kw["dtypes"] = tuple(getattr(torch, _TORCH_DTYPES[d]) for d in kw.pop("dtype_sizes"))
        return cls(**kw)
    kw["dtype"] = getattr(torch, _TORCH_DTYPES[spec.dtype_size])
    kw.pop("dtype_size", None)
    kw.setdefault("num_kv_heads", spec.num_kv_heads)
    kw.setdefault("head_size", spec.head_size)
    if "kv_quant_mode" in kw:
        kw["kv_quant_mode"] = kvi.KVQuantMode(kw["kv_quant_mode"])
    if "cache_role" in kw:
        kw["cache_role"] = kvi.SparseCacheRole(kw["cache_role"])
    if isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec)):
        kw.pop("page_size_padded", None)  # vLLM pads to the alignment itself
    return cls(**kw)


def _vllm_config(layout="LBNHC", max_model_len=8192, dcp=1, caching=True,
                 prefix_match_unit=None, block_size=16, in_flight=8192):
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:  # 0.17 has no layouts
        KVCacheLayout = None  # noqa: N806

    cache = SimpleNamespace(
        get_resolved_kv_cache_layout=lambda: KVCacheLayout[layout],
        num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
        mamba_cache_mode="align", block_size=block_size,
        prefix_match_unit=prefix_match_unit, enable_prefix_caching=caching,
    )
    return SimpleNamespace(
        cache_config=cache,
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                         max_num_encoder_input_tokens=1500),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp,
                                        tensor_parallel_size=1),
        kv_transfer_config=None,
        max_in_flight_tokens=in_flight,
    )


def _as_impl_groups(vllm_groups):
    """vLLM's groups as (layer names, spec class name, block size, page size)."""
    return [(tuple(g.layer_names), type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
             g.kv_cache_spec.page_size_bytes) for g in vllm_groups]


@pytest.mark.vllm
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_groups_blocks_and_tensors_agree_with_vllm(model, layout):
    # Capacity stays in kv_cache_utils in 0.33 too; planning moved (vllm_sizing).
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes

    sizing = vllm_sizing()
    specs = MODELS[model]()
    config = _vllm_config(layout)
    vllm_specs = {name: _vllm_spec(s) for name, s in specs.items()}
    for name, s in specs.items():
        assert s.page_size_bytes == vllm_specs[name].page_size_bytes, name
        assert layer_view_shape_bytes(s, 1000) == (
            compute_layer_kv_cache_shape_bytes(vllm_specs[name], 1000)), name
    vllm_groups = sizing.get_kv_cache_groups(config, dict(vllm_specs))
    groups = get_kv_cache_groups(specs)
    assert [(g.layer_names, type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
             g.kv_cache_spec.page_size_bytes) for g in groups] == _as_impl_groups(vllm_groups)
    for memory in (40 * GiB, 25_938_100_224, 3 * GiB + 12345):
        vllm_plan = sizing.get_kv_cache_config_from_groups(config, vllm_groups, memory)
        plan = get_kv_cache_config_from_groups(groups, memory, layout=layout)
        assert plan.num_blocks == vllm_plan.num_blocks
        assert [(t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
                for t in plan.kv_cache_tensors] == [
            (t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
            for t in vllm_plan.kv_cache_tensors]
        for dcp in (1, 2):
            cfg = _vllm_config(layout, dcp=dcp)
            if dcp > 1 and any(isinstance(s, SlidingWindowSpec) for s in specs.values()):
                continue  # vLLM: "DCP not support sliding window."
            assert get_max_concurrency(
                groups, plan.num_blocks, 8192, dcp_world_size=dcp, max_in_flight_tokens=8192
            ) == pytest.approx(ku.get_max_concurrency_for_kv_cache_config(cfg, vllm_plan))
            assert get_kv_cache_capacity(
                groups, plan.num_blocks, 8192, dcp_world_size=dcp, max_in_flight_tokens=8192
            )[0] == ku.get_kv_cache_capacity(cfg, vllm_plan)[0]


@pytest.mark.vllm
def test_qwen2_worked_figure_is_vllms():
    sizing = vllm_sizing()
    config = _vllm_config()
    specs = {n: _vllm_spec(s) for n, s in qwen2_0_5b().items()}
    groups = sizing.get_kv_cache_groups(config, specs)
    assert sizing.get_kv_cache_config_from_groups(config, groups,
                                                  25_938_100_224).num_blocks == 131_928


@pytest.mark.vllm
@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC", "LHBNC", "BHLNC"])
def test_other_layouts_agree_with_vllm(layout):
    sizing = vllm_sizing()
    for specs in (qwen2_0_5b(), llama3(32, 2), deepseek_v3(), gemma3_27b()):
        config = _vllm_config(layout)
        vllm_groups = sizing.get_kv_cache_groups(config,
                                                 {n: _vllm_spec(s) for n, s in specs.items()})
        groups = get_kv_cache_groups(specs, layout=layout)
        vllm_plan = sizing.get_kv_cache_config_from_groups(config, vllm_groups, 7 * GiB)
        plan = get_kv_cache_config_from_groups(groups, 7 * GiB, layout=layout)
        assert plan.num_blocks == vllm_plan.num_blocks
        assert [(t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
                for t in plan.kv_cache_tensors] == [
            (t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
            for t in vllm_plan.kv_cache_tensors]


@pytest.mark.vllm
@pytest.mark.parametrize("case", [
    ([full(16)], {}),
    ([full(16)], {"dcp": 4}),
    ([full(16), SlidingWindowSpec(32, sliding_window=8)], {}),
    ([full(16), SlidingWindowSpec(32, sliding_window=8)], {"caching": False}),
    ([full(32), SlidingWindowSpec(32, sliding_window=8)], {"prefix_match_unit": 8}),
    ([full(16), MambaSpec(64, shapes=((4,),), dtype_sizes=(4,), mamba_cache_mode="align")],
     {"dcp": 2}),
    ([full(16), MambaSpec(64, shapes=((4,),), dtype_sizes=(4,), mamba_cache_mode="none")], {}),
    ([full(16), ChunkedLocalAttentionSpec(16, attention_chunk_size=64), full(48)], {}),
])
def test_block_sizes_agree_with_vllm(case):
    # Block sizes stay in kv_cache_utils in 0.33 too.
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    specs, kw = case
    config = _vllm_config(dcp=kw.get("dcp", 1), caching=kw.get("caching", True),
                          prefix_match_unit=kw.get("prefix_match_unit"),
                          block_size=specs[0].block_size)
    kv = KVCacheConfig(num_blocks=10, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"l{i}"], _vllm_spec(s)) for i, s in enumerate(specs)])
    assert resolve_kv_cache_block_sizes(
        specs, kw.get("caching", True), kw.get("dcp", 1), kw.get("prefix_match_unit")
    ) == ku.resolve_kv_cache_block_sizes(kv, config)


@pytest.mark.vllm017
@pytest.mark.parametrize("model", ["qwen2-0.5b", "llama-3-70b-tp4", "gemma-3-27b", "jamba-like",
                                   "jamba-like-aligned", "deepseek-v3", "mixed-heads"])
def test_shared_by_plan_agrees_with_vllm_0_17(model):
    specs = MODELS[model]()
    config = _vllm_config()
    vllm_specs = {n: _vllm_spec(s) for n, s in specs.items()}
    if model.startswith("jamba"):
        # 0.17 pads no page when unifying: pages that do not divide are refused
        # (its model config pads the Mamba page beforehand).
        with pytest.raises(NotImplementedError):
            vllm_sizing().get_kv_cache_groups(config, vllm_specs)
        with pytest.raises(NotImplementedError):
            get_kv_cache_groups(specs, pad_pages=False)
        return
    vllm_groups = vllm_sizing().get_kv_cache_groups(config, vllm_specs)
    groups = get_kv_cache_groups(specs, pad_pages=False)
    assert [(g.layer_names, type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
             g.kv_cache_spec.page_size_bytes) for g in groups] == _as_impl_groups(vllm_groups)
    vllm_plan = vllm_sizing().get_kv_cache_config_from_groups(config, vllm_groups, 40 * GiB)
    plan = get_kv_cache_config_from_groups(groups, 40 * GiB, KVCacheTensorPlan.SHARED_BY)
    assert plan.num_blocks == vllm_plan.num_blocks
    assert [(t.size, t.layers) for t in plan.kv_cache_tensors] == [
        (t.size, t.shared_by) for t in vllm_plan.kv_cache_tensors]


# -- sparse MLA, packed groups, hidden states, fallbacks: hand-derived -------------------


def deepseek_v4_like(layers: int = 4, with_tail: bool = True):
    """Per layer: the MLA latent cache (fp8 packed rows of 656 bytes, blocks
    stride-aligned to whole rows), its indexer's keys, a window over MLA
    latents, and a K-pool tail ring."""
    specs = {}
    for i in range(layers):
        specs[f"l.{i}.attn"] = MLAAttentionSpec(
            64, num_kv_heads=1, head_size=576, dtype_size=1, state_content_bytes=656,
            block_stride_alignment=656, cache_dtype_str="fp8_ds_mla",
            is_index_group_leader=True)
        specs[f"l.{i}.indexer"] = MLAAttentionSpec(
            64, num_kv_heads=1, head_size=132, dtype_size=1, cache_role="indexer")
        specs[f"l.{i}.swa"] = SlidingWindowMLASpec(
            64, num_kv_heads=1, head_size=576, dtype_size=1, sliding_window=128,
            state_content_bytes=656, cache_dtype_str="fp8_ds_mla")
        if with_tail:
            specs[f"l.{i}.tail"] = CircularBufferSpec(
                4, num_kv_heads=2, head_size=128, head_size_v=0, dtype_size=2)
    return specs


def glm5_like():
    """vLLM's own GLM-5-like hybrid: 11 x (MLA, a 4-token-per-state indexer, a
    K-pool tail) and 34 Mamba (KDA) layers, blocks of 1024."""
    specs = {}
    for i in range(11):
        specs[f"layers.{i}.attn"] = MLAAttentionSpec(
            1024, num_kv_heads=1, head_size=576, dtype_size=2,
            block_stride_alignment=32 * 576 * 2)
        specs[f"layers.{i}.indexer"] = MLAAttentionSpec(
            1024, num_kv_heads=1, head_size=132, dtype_size=1, tokens_per_state=4,
            block_stride_alignment=64 * 132)
        specs[f"layers.{i}.tail"] = CircularBufferSpec(4, num_kv_heads=2, head_size=128,
                                                       head_size_v=0, dtype_size=2)
    for i in range(34):
        specs[f"layers.{i}.kda"] = MambaSpec(1024, shapes=((3, 6144), (16, 128, 128)),
                                             dtype_sizes=(2, 4))
    return specs


def with_hidden_states():
    """Full attention and Mamba of one page, and a hidden-state cache layer."""
    return {
        "model.full_attn": full(544, 1, 512),
        "model.mamba": MambaSpec(544, shapes=((557056,),), dtype_sizes=(2,),
                                 mamba_cache_mode="align"),
        "cache_only_layers.0": HiddenStateCacheSpec(544, num_kv_heads=3, head_size=1024,
                                                    dtype_size=2),
    }


def mla_with_a_window_draft():
    """MLA pages (sparse: never padded) next to a sliding-window draft whose
    page neither divides nor can be padded into them."""
    return {
        "target.0.attn": MLAAttentionSpec(64, num_kv_heads=1, head_size=576),
        "target.0.indexer": MLAAttentionSpec(64, num_kv_heads=1, head_size=132, dtype_size=1),
        "draft.0": SlidingWindowSpec(16, num_kv_heads=2, head_size=64, sliding_window=1),
    }


NEW_MODELS = {
    "deepseek-v4-like": deepseek_v4_like,
    "deepseek-v4-like-no-tail": lambda: deepseek_v4_like(3, with_tail=False),
    "glm5-like": glm5_like,
    "hidden-states": with_hidden_states,
    "mla-with-window-draft": mla_with_a_window_draft,
    "rswa-hybrid": lambda: {**{f"g.{i}": full(16, 2, 64) for i in range(2)},
                            **{f"r.{i}": RSWASpec(16, num_kv_heads=2, head_size=64,
                                                  dtype_size=BF16, rswa_window=256)
                               for i in range(4)}},
    "kv-quant": lambda: {f"l.{i}": full(16, 8, 128, 1, kv_quant_mode=3,
                                        state_content_bytes=2 * 128 + 8) for i in range(4)},
}


def test_page_geometry_of_packed_and_compressed_caches():
    v4 = deepseek_v4_like(1)
    # MLA: 1 head x 64 states x 656 packed bytes; the indexer 64 x 132; the
    # ring 2 heads x 4 tokens x 128 (no V) x 2 bytes.
    assert v4["l.0.attn"].page_size_bytes == 64 * 656
    assert v4["l.0.indexer"].page_size_bytes == 64 * 132
    assert v4["l.0.tail"].page_size_bytes == 2 * 4 * 128 * 2
    # 4 tokens a state: a 1024-token block holds 256 indexer states.
    assert glm5_like()["layers.0.indexer"].page_size_bytes == 256 * 132
    # An MLA alignment pads the page up to its next multiple.
    assert MLAAttentionSpec(16, head_size=576, alignment=1000).page_size_bytes == 37_000


def test_block_outermost_layouts_pack_mixed_pages():
    """GLM-5-like, blocks outermost: the 11 MLA and 11 indexer layers are one
    balanced pattern (one of each page a repeat) kept whole: one group of 22;
    the 11 rings one group; the 34 Mamba states split so a group's states fit
    in the block the attention group needs: 11 x (1.18 MB + 34 KB) hold 12
    of the 2.36 MB KDA states, so 3 groups."""
    groups = get_kv_cache_groups(glm5_like(), layout="BLHNC")
    sizes = sorted(len(g.layer_names) for g in groups)
    assert sizes == [11, 11, 11, 12, 22]
    assert all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)
    plan = get_kv_cache_config_from_groups(groups, 2 * GiB, layout="BLHNC")
    (stride,) = {t.block_stride for t in plan.kv_cache_tensors}
    # Blocks start a whole number of 32-row MLA pages and 64-state indexer pages apart.
    assert stride % (32 * 576 * 2) == 0 and stride % (64 * 132) == 0
    # The same model cannot be packed with layers outermost.
    with pytest.raises(ValueError, match="cannot hold pages"):
        get_kv_cache_config_from_groups(groups, 2 * GiB, layout="LBNHC")


def test_hidden_state_layers_get_a_table_of_their_own():
    """The common page is 544 x 1024 x 2 x 2 = 1,114,112 bytes; a token's
    hidden states take 3 x 1024 x 2 = 6,144, so 181 tokens fit a page, and the
    block is the largest divisor of 544 up to that: 136."""
    groups = get_kv_cache_groups(with_hidden_states())
    hidden = groups[-1]
    assert hidden.layer_names == ("cache_only_layers.0",)
    assert hidden.kv_cache_spec.block_size == 136
    assert hidden.kv_cache_spec.page_size_bytes == 1_114_112
    assert resolve_kv_cache_block_sizes([g.kv_cache_spec for g in groups], True) == (544, 136)


def test_mla_and_an_unpaddable_window_fall_back_to_one_full_allocation_group():
    (group,) = get_kv_cache_groups(mla_with_a_window_draft())
    spec = group.kv_cache_spec
    assert isinstance(spec, UniformTypeKVCacheSpecs) and spec.block_size == 64
    draft = spec.kv_cache_specs["draft.0"]
    # Allocated as full attention at the MLA block size; its window kept.
    assert type(draft) is FullAttentionSpec and draft.block_size == 64
    assert draft.sliding_window == 1


@pytest.mark.vllm
@pytest.mark.parametrize("model", sorted(NEW_MODELS))
@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC", "BLNHC", "BHLNC"])
def test_sparse_packed_and_fallback_models_agree_with_vllm(model, layout):
    """Groups (their layers, kind, block size, page) and the tensor plan of
    each model and layout as vLLM plans them, errors included."""
    sizing = vllm_sizing()
    specs = NEW_MODELS[model]()
    vllm_specs = {n: _vllm_spec(s) for n, s in specs.items()}
    for name, spec in specs.items():
        assert spec.page_size_bytes == vllm_specs[name].page_size_bytes, name
    config = _vllm_config(layout)
    try:
        vllm_groups = sizing.get_kv_cache_groups(config, dict(vllm_specs))
    except (ValueError, NotImplementedError) as e:
        with pytest.raises(type(e)):
            get_kv_cache_groups(specs, layout=layout)
        return
    groups = get_kv_cache_groups(specs, layout=layout)
    assert [(g.layer_names, type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
             g.kv_cache_spec.page_size_bytes) for g in groups] == _as_impl_groups(vllm_groups)
    for memory in (3 * GiB + 12345, 64 * GiB):
        try:
            vllm_plan = sizing.get_kv_cache_config_from_groups(config, vllm_groups, memory)
        except (ValueError, AssertionError) as e:
            with pytest.raises(type(e)):
                get_kv_cache_config_from_groups(groups, memory, layout=layout)
            continue
        plan = get_kv_cache_config_from_groups(groups, memory, layout=layout)
        assert plan.num_blocks == vllm_plan.num_blocks
        assert [(t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
                for t in plan.kv_cache_tensors] == [
            (t.size, t.layers, t.layer_stride, t.block_stride, t.offset)
            for t in vllm_plan.kv_cache_tensors]
