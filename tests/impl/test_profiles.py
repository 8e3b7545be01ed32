from dataclasses import fields

import pytest

from impl.profiles import (
    PROFILES,
    FreeOrder,
    UnsupportedVersion,
    get_profile,
    profile_key,
    supported_versions,
)
from impl.releases import RELEASES, newest


@pytest.mark.parametrize("version,key", [
    ("0.32.0", "0.32"), ("0.32.0+cpu", "0.32"), ("v0.17.1", "0.17"), ("0.17", "0.17"),
])
def test_versions_map_to_their_minor_profile(version, key):
    assert profile_key(version) == key
    assert get_profile(version).name == key


# The newest minor release, derived (impl/releases.py): a new release edits no test.
_NEWEST = profile_key(newest())


def test_unknown_version_lists_the_supported_ones():
    with pytest.raises(UnsupportedVersion,
                       match=rf"vLLM 0.9.2 has no profile \(supported: 0.17-{_NEWEST}\)"):
        get_profile("0.9.2")
    with pytest.raises(UnsupportedVersion, match="not a vLLM version"):
        get_profile("latest")


def test_profiles_differ_where_vllm_differs():
    old, new = PROFILES["0.17"], PROFILES["0.32"]
    assert old.free_order is FreeOrder.APPEND_ALL
    assert new.free_order is FreeOrder.UNHASHED_FIRST
    assert (old.tagged_extra_keys, new.tagged_extra_keys) == (False, True)
    assert (old.partial_block_hits, new.partial_block_hits) == (False, True)


def test_every_followed_release_has_exactly_one_profile_that_was_checked_on_it():
    seen = {}
    for profile in PROFILES.values():
        for release in profile.checked_against:
            assert release in RELEASES, f"{profile.name}: {release} is not followed"
            assert release not in seen
            seen[release] = profile.name
    assert sorted(seen) == sorted(RELEASES)
    for release in RELEASES:
        assert get_profile(release).name == seen[release]
        # Any patch release of the minor uses it too.
        assert get_profile(profile_key(release) + ".9").name == seen[release]
    # 0.25 shared 0.24's profile until its get_block_ids_for_computed_tokens
    # was modelled.
    assert get_profile("0.25.1").name == "0.25" and PROFILES["0.24"].releases == "0.24.0"
    assert not PROFILES["0.24"].block_ids_for_computed_tokens
    assert supported_versions() == f"0.17-{_NEWEST}"


def _differences(a, b) -> set[str]:
    skip = {"name", "checked_against"}
    return {f.name for f in fields(a) if f.name not in skip
            and getattr(a, f.name) != getattr(b, f.name)}


def test_consecutive_profiles_differ_else_they_would_be_one():
    ordered = list(PROFILES.values())
    for older, newer in zip(ordered, ordered[1:]):
        assert _differences(older, newer), f"{older.name} and {newer.name} are the same profile"


def test_the_033_profile_is_032_plus_its_changes():
    # (EAGLE's rule, eagle_drop_groups, is the eagle helper's field.)
    assert _differences(PROFILES["0.32"], PROFILES["0.33"]) >= {
        "mamba_partial_tail_rekey", "mamba_none_with_caching", "null_block_refcount",
        "hash_lookahead_tokens", "max_cache_hit_length", "kv_event_fields"}
