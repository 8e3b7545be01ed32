"""EAGLE / MTP draft groups and 0.32's scheduler-facing knobs, live against
vLLM: seeded fuzz campaigns of the EAGLE kind configs (bounded by cases, so a
loaded machine does the same work), knobs a release cannot take refused by
name, and the 0.17 profile refusing EAGLE in a trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.backends.base import BackendError
from harness.backends.vllm_api import api_for
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.exit_codes import ExitCode
from harness.fuzz.campaign import fuzz
from harness.fuzz.generate import FuzzConfig
from harness.report.text import format_failure
from harness.sources.replay import check_trace
from impl.profiles import get_profile

P = get_profile("0.32")
KIND_CONFIGS = Path(__file__).resolve().parents[2] / "harness" / "fuzz" / "kind_configs"


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["eagle", "hybrid_eagle", "context_parallel_draft"])
def test_eagle_kinds_fuzz_clean_against_vllm(tmp_path, kind):
    fc = FuzzConfig.from_dict(yaml.safe_load((KIND_CONFIGS / f"{kind}.yaml").read_text()))
    result = fuzz(P, float("inf"), seed=7, out_dir=str(tmp_path), fuzz_config=fc,
                  max_cases=120)
    assert result.finding is None, result.finding and format_failure(result.finding.failure)
    assert result.cases == 120 and result.ops > 1000


def test_the_draws_cover_the_knobs():
    import random

    from harness.fuzz.configs import draw_cache_config

    seen = set()
    for kind in ("eagle", "hybrid_eagle", "context_parallel_draft"):
        for i in range(200):
            c = draw_cache_config(kind, random.Random(i), 4, 20, "sha256", "0", True, 1 << 14)
            seen |= {("use_eagle", c.use_eagle), ("lookahead", c.num_prefill_lookahead > 0)}
            seen |= {("draft", g.is_eagle_group) for g in c.groups}
            seen |= {("replicated", not g.dcp_sharded) for g in c.groups}
            # Valid as vLLM takes it: the scheduler block holds the lookahead.
            assert c.num_prefill_lookahead <= c.scheduler_block_size
    assert seen >= {("use_eagle", True), ("use_eagle", False), ("lookahead", True),
                    ("draft", True), ("draft", False), ("replicated", True)}


def test_a_release_without_a_knob_refuses_it_by_name():
    from harness.backends.vllm_backend import _check_api_has

    draft = CacheConfig(num_blocks=8, groups=(GroupConfig(4), GroupConfig(4, is_eagle_group=True)))
    with pytest.raises(BackendError) as e:
        _check_api_has(api_for("0.19.1"), draft, "0.19.1")
    assert e.value.field == "cache.groups.is_eagle_group"
    _check_api_has(api_for("0.20.2"), draft, "0.20.2")
    replicated = CacheConfig(num_blocks=8, groups=(GroupConfig(4, dcp_sharded=False),),
                             dcp_world_size=2)
    with pytest.raises(BackendError, match="dcp_sharded"):
        _check_api_has(api_for("0.30.0"), replicated, "0.30.0")
    lookahead = CacheConfig(num_blocks=8, num_prefill_lookahead=2)
    with pytest.raises(BackendError, match="num_prefill_lookahead"):
        _check_api_has(api_for("0.27.1"), lookahead, "0.27.1")
    _check_api_has(api_for("0.32.0"), lookahead, "0.32.0")


def test_a_0_17_hybrid_trace_with_eagle_is_refused_in_one_line(tmp_path):
    # (A single group's EAGLE drop is every release's: only hybrids are refused.)
    trace = tmp_path / "eagle-v0.17.yaml"
    trace.write_text(yaml.safe_dump({
        "header": {"format": "kvconform-trace/1", "vllm_version": "0.17.1", "source": "hand",
                   "cache": {"num_blocks": 8, "groups": [
                       {"block_size": 4},
                       {"block_size": 4, "kind": "sliding_window", "sliding_window": 8}],
                             "use_eagle": True}},
        "events": [{"op": "add_request", "req": "a", "prompt": [1, 2, 3, 4, 5]}]}))
    outcome = check_trace(str(trace), ["impl"])
    assert outcome.exit_code == ExitCode.BAD_INPUT
    assert "0.17" in str(outcome.error) and "EAGLE" in str(outcome.error)


def test_a_mamba_group_cannot_be_replicated():
    with pytest.raises(ValueError, match="dcp_sharded does not apply"):
        GroupConfig(4, "mamba", dcp_sharded=False)
