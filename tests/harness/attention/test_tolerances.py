"""The tolerance spec (specs/attention_tolerances.yaml) and the error statistics."""

import pytest
import torch

from harness.attention.compare import error_stats
from harness.attention.tolerances import Tolerance, dtype_key, load_tolerances, tolerance


def test_every_dtype_has_both_tolerances_and_they_tighten_with_precision():
    table = load_tolerances()
    for against in ("reference", "vllm"):
        t = [table[against][k] for k in ("float32", "float16", "bfloat16")]
        assert t[0].atol < t[1].atol < t[2].atol
    assert tolerance(torch.bfloat16, "reference", "fp8") == table["reference"]["bfloat16+fp8_e4m3"]
    assert dtype_key(torch.float16, "fp8_e5m2") == "float16+fp8_e5m2"
    with pytest.raises(ValueError, match="no 'vllm' tolerance"):
        tolerance(torch.float32, "vllm", "fp8_e5m2")


def test_error_stats_flag_the_worst_element_and_non_finite_values():
    expected = torch.tensor([[1.0, 2.0], [0.0, -4.0]])
    actual = expected.clone()
    actual[1, 1] = -4.1
    s = error_stats(actual, expected, Tolerance(0.01, 0.01))
    assert s.worst_index == (1, 1) and s.max_abs == pytest.approx(0.1)
    assert s.max_rel == pytest.approx(0.025) and not s.ok
    actual[1, 1] = float("nan")
    s = error_stats(actual, expected, Tolerance(1.0, 1.0))
    assert s.nonfinite == 1 and not s.ok
    assert error_stats(expected, expected, Tolerance(0, 0)).ok
