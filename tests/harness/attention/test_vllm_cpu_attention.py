"""Live: impl's cache writes and paged attention against vLLM's own CPU ops
(cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache, vLLM's chunked-local
virtual batches, mla_decode_kvcache), for every attention kind vLLM serves on
CPU, fed the same keys, values, slot mappings and block tables; both also
against the float64 reference, within the error model's allowances."""

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.impl_call import impl_attention, impl_write
from harness.attention.kernel_cases import AttentionCase, build_case
from harness.attention.kinds import KINDS, AttentionKind
from harness.attention.reference import MirrorCache, quantize, reference
from harness.attention.tolerances import allowed, impl_path
from harness.backends.vllm_cpu_attention import (
    MLA_BLOCK_SIZE,
    MLA_HEAD_SIZE,
    ProcessorUnsupported,
    VllmCpuAttention,
    VllmUnavailable,
    unsupported_reason,
)
from harness.backends.vllm_cpu_attn_layout import pack
from impl.kv_cache_tensors import KVCacheLayout

pytestmark = pytest.mark.vllm

MIXED = dict(query_lens=(1, 40, 17, 1), seq_lens=(75, 40, 64, 33))
CROSS = dict(query_lens=(3, 9, 1), seq_lens=(13, 40, 50))
MLA_DECODE = dict(query_lens=(1, 1, 1), seq_lens=(33, 9, 50))


def _case(kind_name: str, dtype, kv_cache_dtype="auto") -> AttentionCase:
    kind = KINDS[kind_name]
    if kind.is_mla:
        return AttentionCase(kind_name, num_heads=4, num_kv_heads=1, head_size=MLA_HEAD_SIZE,
                             block_size=MLA_BLOCK_SIZE, dtype=dtype, kind=kind, **MLA_DECODE)
    shape = CROSS if not kind.causal else MIXED
    return AttentionCase(kind_name, num_heads=8, num_kv_heads=2, head_size=64, block_size=32,
                         dtype=dtype, layout=KVCacheLayout.CPU_ATTN, kind=kind,
                         kv_cache_dtype=kv_cache_dtype, **shape)


def _both(case: AttentionCase):
    """impl and vLLM, each writing every row of the case with its own ops."""
    p = build_case(case, write_new=False)
    kind = case.attention
    try:
        vllm = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads,
                                case.num_kv_heads, case.head_size, case.dtype, case.scale,
                                kind, case.kv_cache_dtype, float(p.k_scale), float(p.v_scale))
    except ProcessorUnsupported as e:  # the machine, not a result
        pytest.skip(str(e))
    slots, k, v = p.all_rows
    impl_write(k, v, p.cache, slots, kind, case.kv_cache_dtype, p.k_scale, p.v_scale)
    vllm.write(k, v, slots)
    mine = torch.full((p.query.shape[0], case.num_heads, case.head_size_v), float("nan"),
                      dtype=case.dtype)
    impl_attention(p.query, p.cache, mine, p.batch, case.scale, kind, case.kv_cache_dtype,
                   p.k_scale, p.v_scale)
    theirs = vllm.forward(p.query, p.batch)
    return p, vllm, slots, mine, theirs


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kind_matches_vllm(kind, dtype):
    case = _case(kind, dtype)
    p, vllm, slots, mine, theirs = _both(case)
    # The cache writes agree element for element (vLLM's layout converted).
    their_k, their_v = vllm.unpacked_slots(slots)
    mine_k = p.cache.key[slots // case.block_size, slots % case.block_size]
    assert torch.equal(mine_k, their_k)
    if their_v is not None:
        assert torch.equal(p.cache.value[slots // case.block_size, slots % case.block_size],
                           their_v)
    ref = reference(p.query, p.mirror, p.batch, case.scale, case.attention)
    assert error_stats(mine, ref.out, allowed(ref, dtype, impl_path())).ok
    assert error_stats(theirs, ref.out, allowed(ref, dtype, "vllm_cpu")).ok
    vs_vllm = error_stats(mine, theirs, allowed(ref, dtype, impl_path(), "vllm_cpu"))
    assert vs_vllm.ok, vs_vllm


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_with_per_tensor_scales(dtype, kv_cache_dtype):
    """vLLM's CPU fp8 cache keeps the leading mantissa bits of x / scale
    (rounds toward zero) where impl, torch and CUDA round to nearest: each
    cache is checked against its own rounding, each output against the
    reference over its own cache."""
    case = _case("full", dtype, kv_cache_dtype)
    p, vllm, slots, mine, theirs = _both(case)
    _, k, v = p.all_rows
    their_k, their_v = vllm.unpacked_slots(slots)
    assert torch.equal(their_k, quantize(k, kv_cache_dtype, float(p.k_scale), "toward_zero"))
    assert torch.equal(their_v, quantize(v, kv_cache_dtype, float(p.v_scale), "toward_zero"))
    mine_k = p.cache.key[slots // case.block_size, slots % case.block_size]
    assert torch.equal(mine_k.double() * float(p.k_scale), quantize(k, kv_cache_dtype,
                                                                      float(p.k_scale)))
    assert not torch.equal(their_k, mine_k.double() * float(p.k_scale))  # the roundings differ
    ref = reference(p.query, p.mirror, p.batch, case.scale, case.attention)
    assert error_stats(mine, ref.out, allowed(ref, dtype, impl_path(),
                                              kv_cache_dtype=kv_cache_dtype)).ok
    theirs_mirror = MirrorCache(case.num_blocks, case.block_size, case.num_kv_heads,
                                case.head_size)
    theirs_mirror.key, theirs_mirror.value = vllm.unpacked_cache()
    their_ref = reference(p.query, theirs_mirror, p.batch, case.scale, case.attention)
    s = error_stats(theirs, their_ref.out, allowed(their_ref, dtype, "vllm_cpu",
                                                   kv_cache_dtype=kv_cache_dtype))
    assert s.ok, s


def test_float16_too():
    case = _case("full", torch.float16)
    p, vllm, slots, mine, theirs = _both(case)
    ref = reference(p.query, p.mirror, p.batch, case.scale, case.attention)
    assert error_stats(mine, theirs, allowed(ref, torch.float16, impl_path(), "vllm_cpu")).ok


def test_vllm_reads_impl_cache_converted_as_its_own():
    case = _case("full", torch.bfloat16)
    p, vllm, _, _, theirs = _both(case)
    converted = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads,
                                 case.num_kv_heads, case.head_size, case.dtype, case.scale,
                                 AttentionKind())
    converted.cache.copy_(pack(p.cache.key.nan_to_num(0.0), p.cache.value.nan_to_num(0.0),
                               converted.isa))
    assert torch.equal(converted.forward(p.query, p.batch), theirs)


def test_what_vllm_does_not_serve_is_declared_not_probed():
    full, mla = AttentionKind(), KINDS["mla"]
    assert "head sizes" in unsupported_reason(full, 40, 32, torch.bfloat16)
    assert "multiples of 16" in unsupported_reason(full, 64, 8, torch.float32)
    assert "512 + 64" in unsupported_reason(mla, 80, 16, torch.float32)
    assert "no fp8" in unsupported_reason(mla, MLA_HEAD_SIZE, 16, torch.float32, "fp8")
    assert unsupported_reason(full, 64, 32, torch.bfloat16) is None
    with pytest.raises(ValueError, match="head sizes"):
        VllmCpuAttention(8, 32, 4, 2, 40, torch.bfloat16, 40 ** -0.5, full)


def test_a_failing_probe_is_an_environment_problem(monkeypatch):
    """A layer vLLM declares it serves but whose op fails is VllmUnavailable
    (exit code 3 in the differential), never a quiet 'not compared'."""
    from vllm import _custom_ops

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(_custom_ops, "cpu_attention_with_kv_cache", broken)
    with pytest.raises(VllmUnavailable, match="simulated kernel failure"):
        VllmCpuAttention(8, 32, 4, 2, 64, torch.bfloat16, 0.125, AttentionKind())


def test_mla_prefill_has_no_paged_vllm_op():
    case = _case("mla", torch.float32)
    vllm = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads, 1,
                            case.head_size, case.dtype, case.scale, case.kind)
    p = build_case(AttentionCase("p", (5,), (9,), num_heads=4, num_kv_heads=1,
                                 head_size=MLA_HEAD_SIZE, block_size=16, kind=case.kind))
    assert "decode batches only" in vllm.serves(p.batch)


def test_an_fp8_cache_takes_the_avx512_kernels_where_vllm_picks_amx(monkeypatch):
    """On an AMX machine vLLM picks amx for a bf16 model whatever the cache
    dtype; an fp8 cache runs vLLM's AVX-512 kernels instead (its amx byte order
    is not converted), so the fp8 results are the same on every AVX-512 CPU.
    CI's processor has AMX and this one may not: the pick is forced here."""
    import harness.backends.vllm_cpu_attention as module

    ops, _, envs, backend = module._ops()
    monkeypatch.setattr(module, "_ops", lambda: (ops, lambda *a: "amx", envs, backend))
    case = _case("full", torch.bfloat16, "fp8")
    layer = VllmCpuAttention(case.num_blocks, case.block_size, case.num_heads,
                             case.num_kv_heads, case.head_size, case.dtype, case.scale,
                             case.attention, "fp8", 0.5, 0.5)
    assert layer.isa == "vec"
    with pytest.raises(ValueError, match="2-byte elements only"):
        from harness.backends.vllm_cpu_attn_layout import region_index
        region_index("amx", 32, 64, 1)


def _hide_avx512_and_amx(monkeypatch):
    """vLLM's ISA pick asks torch what the CPU has: answering 'neither' makes
    this machine the AVX2-only EPYC a fresh clone may land on."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)


def test_an_fp8_cache_without_avx512_is_the_environment(monkeypatch):
    _hide_avx512_and_amx(monkeypatch)
    with pytest.raises(ProcessorUnsupported, match="AVX-512"):
        VllmCpuAttention(8, 32, 4, 2, 64, torch.bfloat16, 0.125, AttentionKind(), "fp8")
    # The same layer with a bf16 cache runs on vLLM's AVX2 kernels: only what
    # the CPU lacks is the environment.
    assert VllmCpuAttention(8, 32, 4, 2, 64, torch.bfloat16, 0.125, AttentionKind()).isa \
        in ("vec", "vec16")
    # Where head sizes rule fp8 out the backend declares it: not the processor.
    assert "multiples of 32" in unsupported_reason(AttentionKind(), 80, 32, torch.bfloat16,
                                                    "fp8")
