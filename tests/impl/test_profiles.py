import pytest

from impl.profiles import PROFILES, FreeOrder, UnsupportedVersion, get_profile, profile_key


@pytest.mark.parametrize("version,key", [
    ("0.32.0", "0.32"), ("0.32.0+cpu", "0.32"), ("v0.17.1", "0.17"), ("0.17", "0.17"),
])
def test_versions_map_to_their_minor_profile(version, key):
    assert profile_key(version) == key
    assert get_profile(version).name == key


def test_unknown_version_lists_the_supported_ones():
    with pytest.raises(UnsupportedVersion,
                       match=r"vLLM 0.9.2 has no profile \(supported: 0.17-0.33\)"):
        get_profile("0.9.2")
    with pytest.raises(UnsupportedVersion, match="not a vLLM version"):
        get_profile("latest")


def test_profiles_differ_where_vllm_differs():
    old, new = PROFILES["0.17"], PROFILES["0.32"]
    assert old.free_order is FreeOrder.APPEND_ALL
    assert new.free_order is FreeOrder.UNHASHED_FIRST
    assert (old.tagged_extra_keys, new.tagged_extra_keys) == (False, True)
    assert (old.get_computed_blocks_arity, new.get_computed_blocks_arity) == (2, 3)
