"""The error model (specs/ATTENTION.md, specs/attention_tolerances.yaml): its
allowances follow the values' scale, and they are tight enough to see one
wrong key among thousands in bf16, while impl's own outputs pass."""

import math

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.impl_call import impl_attention
from harness.attention.kernel_cases import AttentionCase, build_case
from harness.attention.kinds import AttentionKind
from harness.attention.reference import reference
from harness.attention.tolerances import allowed, impl_path, load_error_model
from impl.attention_batch import AttentionBatch


def test_the_spec_holds_the_formats_unit_roundoffs_and_every_path():
    model = load_error_model()
    assert model.unit_roundoff == {"float32": 2.0 ** -24, "float16": 2.0 ** -11,
                                   "bfloat16": 2.0 ** -8}
    assert set(model.paths) == {"impl_interpreted", "impl_compiled", "vllm_cpu",
                                "vllm_triton"}
    assert not model.paths["impl_interpreted"].rounds_p
    t1k, t32k = model.table(torch.bfloat16, 1024), model.table(torch.bfloat16, 32768)
    assert t1k["rtol"] == 2.0 ** -8 and t1k["per_mix"] < t32k["per_mix"]
    with pytest.raises(ValueError, match="no path"):
        model.allowed(None, torch.float32, "nowhere")


def test_error_stats_flag_the_worst_element_and_non_finite_values():
    expected = torch.tensor([[1.0, 2.0], [0.0, -4.0]])
    actual = expected.clone()
    actual[1, 1] = -4.1
    s = error_stats(actual, expected, torch.full_like(expected, 0.05))
    assert s.worst_index == (1, 1) and s.max_abs == pytest.approx(0.1)
    assert s.worst_ratio == pytest.approx(2.0) and not s.ok
    assert s.max_rel == pytest.approx(0.025) and s.max_value == 4.0
    actual[1, 1] = float("nan")
    s = error_stats(actual, expected, torch.ones_like(expected))
    assert s.nonfinite == 1 and not s.ok
    assert error_stats(expected, expected, torch.zeros_like(expected)).ok


def _decode(n, dtype, seed, value_scale=1.0):
    case = AttentionCase("k", (1,), (n + 1,), num_heads=8, num_kv_heads=2, head_size=64,
                         block_size=16, dtype=dtype)
    p = build_case(case, seed=seed)
    if value_scale != 1.0:
        p.cache.value.mul_(value_scale)
        p.mirror.value = p.cache.value.to(torch.float64)  # exactly what the cache holds
    out = torch.empty(1, 8, 64, dtype=dtype)
    impl_attention(p.query, p.cache, out, p.batch, case.scale, AttentionKind())
    return p, case, out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_extra_visible_key_among_4096_is_caught(dtype):
    """impl attends over 4,097 keys; the reference is told 4,096 (one key too
    many is what an off-by-one causal mask, window or tile bound does). The
    issue's bf16 tolerances caught this 5 times in 40 at 1,024 keys."""
    n = 4096
    for seed in range(3):
        p, case, out = _decode(n, dtype, seed)
        b = p.batch
        told_less = AttentionBatch(b.query_start_loc, b.seq_lens - 1, b.block_table,
                                   b.slot_mapping, 1, n)
        ref = reference(p.query, p.mirror, told_less, case.scale)
        wrong = error_stats(out, ref.out, allowed(ref, dtype, impl_path()))
        assert not wrong.ok, f"seed {seed}: missed ({wrong.worst_ratio:.2f}x)"
        right = reference(p.query, p.mirror, b, case.scale)
        clean = error_stats(out, right.out, allowed(right, dtype, impl_path()))
        assert clean.ok, clean


def test_allowances_follow_the_values_scale():
    """Values 1000 times smaller (the dummy loader's weights) get allowances
    1000 times smaller: an all-zero output no longer passes."""
    p, case, out = _decode(256, torch.bfloat16, 0, value_scale=1e-3)
    ref = reference(p.query, p.mirror, p.batch, case.scale)
    assert error_stats(out, ref.out, allowed(ref, torch.bfloat16, impl_path())).ok
    zeros = torch.zeros_like(out)
    assert not error_stats(zeros, ref.out, allowed(ref, torch.bfloat16, impl_path())).ok
    assert not error_stats(-out, ref.out, allowed(ref, torch.bfloat16, impl_path())).ok


def test_comparing_two_implementations_adds_their_allowances():
    p, case, out = _decode(64, torch.bfloat16, 0)
    ref = reference(p.query, p.mirror, p.batch, case.scale)
    one = allowed(ref, torch.bfloat16, "vllm_cpu")
    both = allowed(ref, torch.bfloat16, impl_path(), "vllm_cpu")
    assert torch.allclose(both, one + allowed(ref, torch.bfloat16, impl_path()))
    # Rounding probabilities to bf16 (vLLM's CPU kernels) costs more than fp32 sums.
    assert (one > allowed(ref, torch.bfloat16, "impl_interpreted")).all()
    assert math.isclose(load_error_model().sigmas, 8.0)
