"""The followed vLLM releases: names, order, ranges."""

import pytest

from harness.core.vllm_releases import (
    RELEASES,
    UnknownRelease,
    between,
    newest,
    release_key,
    resolve,
)


def test_one_release_per_minor_from_017_on_in_order():
    # (The newest is not written here: it is the list's last.)
    minors = [release_key(r)[1] for r in RELEASES]
    assert minors == list(range(17, 17 + len(RELEASES)))
    assert newest() == RELEASES[-1]
    assert [release_key(r) for r in RELEASES] == sorted(release_key(r) for r in RELEASES)


def test_a_minor_resolves_to_its_followed_patch_and_a_full_version_stays():
    assert resolve("0.25") == "0.25.1"
    assert resolve("v0.33") == "0.33.0"
    assert resolve("0.25.0") == "0.25.0"
    assert release_key("0.32.0+cpu") == (0, 32, 0)


@pytest.mark.parametrize("bad", ["latest", "0.99", "1"])
def test_bad_versions_are_refused(bad):
    with pytest.raises(UnknownRelease):
        resolve(bad)


def test_between_includes_both_ends_and_every_followed_release_inside():
    assert between("0.31", "0.33") == ["0.31.0", "0.32.0", "0.33.0"]
    assert between("0.17.0", "0.18.1") == ["0.17.0", "0.17.1", "0.18.1"]
    assert len(between("0.17.1", newest())) == len(RELEASES)
    with pytest.raises(UnknownRelease):
        between("0.33.0", "0.32.0")
