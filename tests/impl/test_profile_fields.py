"""The profile fields the releases 0.17-0.33 differ in, one by one in impl:
each flips a behaviour the way specs/PROFILES.md says (live against every
release: the per-release tests and `make matrix`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest as Add
from harness.core.events import Allocate, Checkpoint, Free, Lookup
from harness.trace import open_trace
from impl.block_pool import BlockPool
from impl.profiles import PROFILES, PromptTailBoundary, get_profile

REGRESSIONS = Path(__file__).resolve().parents[2] / "traces" / "regressions"


def _pool(profile: str, caching: bool = True) -> BlockPool:
    return BlockPool(8, caching, 4, profile=PROFILES[profile])


def _queue_after_freeing(pool: BlockPool, skipped: bool) -> list[int]:
    """Blocks 1-4 handed out, 2 and 4 keyed, then freed (1 first)."""
    blocks = pool.get_new_blocks(4)
    for b in (blocks[1], blocks[3]):
        b.block_hash = bytes([b.block_id]) * 4
    pool.free_blocks(blocks, skipped=skipped)
    return pool.free_block_queue.block_ids()


def test_free_order_of_each_release():
    rest = [5, 6, 7]
    # 0.17-0.22: everything appended, in eviction order.
    assert _queue_after_freeing(_pool("0.22"), False) == rest + [1, 2, 3, 4]
    # 0.24+: unkeyed ones to the head (first given first), keyed to the tail.
    assert _queue_after_freeing(_pool("0.24"), False) == [1, 3] + rest + [2, 4]
    # 0.23: only blocks leaving a window are split so.
    assert _queue_after_freeing(_pool("0.23"), False) == rest + [1, 2, 3, 4]
    assert _queue_after_freeing(_pool("0.23"), True) == [1, 3] + rest + [2, 4]
    # Caching off: 0.27 appends, 0.26 and 0.28 reuse first.
    assert _queue_after_freeing(_pool("0.27", False), False) == rest + [1, 2, 3, 4]
    for name in ("0.26", "0.28"):
        assert _queue_after_freeing(_pool(name, False), False) == [1, 2, 3, 4] + rest


def _events(profile: str, config: CacheConfig) -> list[dict]:
    b = ImplBackend(config, get_profile(profile), check=True)
    b.run(Add("r", list(range(8)), session_id="s"))
    b.run(Lookup("r"))
    b.run(Allocate("r", 8))
    return b.run(Checkpoint(("events",)))["events"]


def test_kv_event_fields_grow_release_by_release():
    one = CacheConfig(num_blocks=8, groups=(GroupConfig(4),))
    keys = {p: set(_events(p, one)[0]) for p in ("0.19", "0.20", "0.22", "0.30", "0.33")}
    assert "group_idx" not in keys["0.19"] and "group_idx" in keys["0.20"]
    assert "kv_cache_spec_kind" not in keys["0.20"] and "kv_cache_spec_kind" in keys["0.22"]
    assert "session_id" not in keys["0.22"] and "session_id" in keys["0.30"]
    lookahead = replace(one, num_hash_lookahead_tokens=1)
    assert _events("0.33", lookahead)[0]["lookahead_token_ids"] == [[4]]


def test_a_lone_sliding_window_1_group_keys_its_blocks_only_before_023():
    config = CacheConfig(num_blocks=8, groups=(GroupConfig(4, "sliding_window",
                                                           sliding_window=1),))
    stored = {p: _events(p, config)[0]["block_hashes"] for p in ("0.22", "0.23")}
    assert len(stored["0.22"]) == 2 and stored["0.23"] == []


@pytest.mark.parametrize("profile,refused", [("0.22", False), ("0.23", True),
                                             ("0.25", True), ("0.26", False)])
def test_sink_groups_cannot_be_built_by_023_to_025(profile, refused):
    config = CacheConfig(num_blocks=8, groups=(GroupConfig(4, "sink_full_attention",
                                                           sink_len=4),))
    if refused:
        with pytest.raises(TypeError):
            ImplBackend(config, get_profile(profile))
    else:
        ImplBackend(config, get_profile(profile))


def test_a_hybrid_of_one_spec_is_refused_before_029():
    config = CacheConfig(num_blocks=8, groups=(GroupConfig(2, "mamba"), GroupConfig(2, "mamba")))
    with pytest.raises(AssertionError):
        ImplBackend(config, get_profile("0.28"))
    ImplBackend(config, get_profile("0.29"))


def test_mamba_none_mode_with_caching_is_refused_by_033():
    config = CacheConfig(num_blocks=8, groups=(GroupConfig(4),
                                               GroupConfig(4, "mamba", mamba_cache_mode="none")))
    ImplBackend(config, get_profile("0.32"))
    with pytest.raises(AssertionError):
        ImplBackend(config, get_profile("0.33"))


def test_033_leaves_the_null_blocks_count_alone():
    config = CacheConfig(num_blocks=16, groups=(GroupConfig(2, "mamba"),))
    counts = {}
    for name in ("0.32", "0.33"):
        b = ImplBackend(config, get_profile(name))
        b.run(Add("r", [0] * 9))
        b.run(Lookup("r"))
        b.run(Allocate("r", 8))  # a state block behind null entries
        b.run(Free("r"))
        counts[name] = b.manager.block_pool.null_block.ref_cnt
    assert counts["0.32"] < 0 and counts["0.33"] == 0


def test_knobs_only_033_has_are_refused_by_older_profiles():
    lookahead = CacheConfig(num_blocks=8, groups=(GroupConfig(4),), num_hash_lookahead_tokens=1)
    with pytest.raises(TypeError):
        ImplBackend(lookahead, get_profile("0.32"))
    b = ImplBackend(CacheConfig(num_blocks=8), get_profile("0.32"))
    b.run(Add("r", list(range(20))))
    with pytest.raises(TypeError):
        b.run(Lookup("r", max_cache_hit_length=4))


def test_prompt_tail_boundaries():
    assert PromptTailBoundary.PROMPT_END.position(17, 4) == 16
    assert PromptTailBoundary.BEFORE_LAST_TOKEN.position(17, 4) == 16
    assert PromptTailBoundary.PROMPT_END.position(16, 4) == 16
    assert PromptTailBoundary.BEFORE_LAST_TOKEN.position(16, 4) == 12
    assert PromptTailBoundary.BEFORE_LAST_TOKEN.position(0, 4) == 0


def _diverges(path: Path, profile) -> bool:
    trace = open_trace(str(path))
    b = ImplBackend(trace.header.cache, profile)
    for record in trace.records:
        try:
            answer = b.run(record.event)
        except Exception:  # noqa: BLE001 - refusing a call the release answered
            return True
        if record.answer is not None and answer != record.answer:
            return True
    return False


# Fuzz findings recorded from each release (its own answers): conformant on
# its profile, and diverging with the one field that found them flipped.
@pytest.mark.parametrize("name,field,flipped", [
    ("v0.23-mamba-skip-stops-at-null.jsonl", "mamba_skip_steps_over_nulls", True),
    ("v0.26-full-attention-prompt-tail.jsonl", "prompt_tail_boundary",
     PromptTailBoundary.BEFORE_LAST_TOKEN),
    ("v0.26-mamba-prompt-tail.jsonl", "prompt_tail_boundary",
     PromptTailBoundary.BEFORE_LAST_TOKEN),
    ("v0.30-mamba-blocks-exact.jsonl", "mamba_blocks_capped", True),
])
def test_recorded_findings_pin_their_field(name, field, flipped):
    path = REGRESSIONS / name
    own = get_profile(json.loads(path.read_text().splitlines()[0])["vllm_version"])
    assert getattr(own, field) != flipped
    assert not _diverges(path, own)
    assert _diverges(path, replace(own, **{field: flipped}))
