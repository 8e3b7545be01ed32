"""The gate's fuzz slices: every kind config the release has the groups of,
with two seeds each, the budget shared equally."""

from __future__ import annotations

from harness.fuzz.slices import SEEDS_PER_KIND, fuzz_slices, kind_names
from impl.profiles import get_profile


def _kinds(slices) -> set[str]:
    return {kind for kind, _seed, _seconds in slices}


def test_every_kind_config_is_sliced_for_the_newest_release():
    slices = fuzz_slices(46.0, 7, get_profile("0.33"))
    assert _kinds(slices) == set(kind_names())
    assert len(slices) == SEEDS_PER_KIND * len(kind_names())
    assert {seed for _, seed, _ in slices} == {7, 8}
    assert abs(sum(s for _, _, s in slices) - 46.0) < 1e-9


def test_a_release_without_a_feature_gets_no_slice_of_its_kind_configs():
    old = _kinds(fuzz_slices(10.0, 0, get_profile("0.17")))
    # 0.17 has none of these groups or knobs: fuzzing them could only fail
    # on the first call.
    for lacking in ("eagle", "hybrid_eagle", "circular_buffer", "rswa", "sparse_mla",
                    "hisparse", "retention", "mamba_checkpoints"):
        assert lacking not in old
    assert {"full_attention", "sliding_window", "hybrid_mamba"} <= old
    # Negative control: without a profile nothing is left out.
    assert _kinds(fuzz_slices(10.0, 0)) == set(kind_names())
    # 0.30 has circular buffers, sparse MLA and the Mamba checkpoint blocks
    # the retention cases reserve; not HiSparse (another API then).
    mid = _kinds(fuzz_slices(10.0, 0, get_profile("0.30")))
    assert {"circular_buffer", "sparse_mla", "retention", "mamba_checkpoints"} <= mid
    assert "hisparse" not in mid
