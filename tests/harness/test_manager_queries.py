"""The scheduler's queries of the manager as trace ops (estimate_cached_tokens,
get_block_ids_for_computed_tokens): answered where the release has them,
refused (on every backend alike) where it has not, and the groups
estimate_cached_tokens reads are the release's (profile.estimate_cached_tokens)."""

from __future__ import annotations

import pytest

from harness.backends.base import BackendError
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import (
    AddRequest,
    Allocate,
    EstimateCachedTokens,
    GetBlockIdsForComputedTokens,
    GetNumCommonPrefixBlocks,
    Lookup,
)
from impl.profiles import get_profile

RING = CacheConfig(40, (GroupConfig(4), GroupConfig(4, "circular_buffer")))
PROMPT = list(range(10))  # two full blocks, keyed once computed


def _admitted(config: CacheConfig, release: str) -> ImplBackend:
    b = ImplBackend(config, get_profile(release))
    for ev in (AddRequest("a", PROMPT), Lookup("a"), Allocate("a", len(PROMPT))):
        b.run(ev)
    return b


def test_a_ring_group_makes_the_estimate_zero_before_0_30_only():
    # 0.29 counts every non-encoder group, the never-cached ring too (its
    # blocks have no keys); 0.30 on skip groups that are not prefix cacheable.
    assert _admitted(RING, "0.29").run(EstimateCachedTokens("a")) == {"num_tokens": 0}
    assert _admitted(RING, "0.30").run(EstimateCachedTokens("a")) == {"num_tokens": 8}
    plain = CacheConfig(40, (GroupConfig(4),))
    assert _admitted(plain, "0.29").run(EstimateCachedTokens("a")) == {"num_tokens": 8}


def test_computed_token_ids_cut_token_groups_only():
    ids = _admitted(RING, "0.32").run(GetBlockIdsForComputedTokens("a", 5))["block_ids"]
    full, ring = ids
    assert len(full) == 2  # 5 tokens occupy two 4-token blocks
    assert len(ring) == 1  # the ring's one block is never cut


@pytest.mark.parametrize("release, event, since", [
    ("0.25", EstimateCachedTokens("a"), "0.26+"),
    ("0.24", GetBlockIdsForComputedTokens("a", 4), "0.25+"),
])
def test_a_release_without_the_query_refuses_it(release, event, since):
    plain = CacheConfig(40, (GroupConfig(4),))
    with pytest.raises(BackendError, match=since):
        _admitted(plain, release).run(event)


def test_the_common_prefix_is_counted_until_cascade_attention_went():
    plain = CacheConfig(40, (GroupConfig(4),))
    answers = {}
    for release in ("0.31", "0.32"):
        b = _admitted(plain, release)
        for ev in (AddRequest("b", PROMPT[:8] + [99]), Lookup("b"), Allocate("b", 1)):
            b.run(ev)
        answers[release] = b.run(GetNumCommonPrefixBlocks("a"))["blocks"]
    # a and b hold the same two full blocks (b hit them).
    assert answers == {"0.31": [2], "0.32": [0]}
