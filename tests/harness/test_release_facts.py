"""A release is listed once (impl/releases.py) and derived everywhere else:
the profiles, the API-shape table, the test overlays, the CI and Makefile
defaults, and the tables of specs/RELEASES.md and specs/PROFILES.md. The check
names each place that disagrees; the negative controls put a release into one
place only and expect it named."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from harness.backends.vllm_api import SHAPES
from impl.profiles import PROFILES
from impl.releases import RELEASES, release_key

from .make_vars import make_words

ROOT = Path(__file__).resolve().parents[2]

# Files that must not write the newest release down: they derive it (a range
# from the oldest release to some other, or a version as an argparse default,
# is the newest written by hand).
DERIVING = ("Makefile", ".ci/run", "ci/github/conformance.yml", "ci/github/matrix.yml",
            "ci/github/peer-matrix.yml", "harness/peer/matrix.py",
            "README.md", "harness/releases/bisect.py", "harness/cli/matrix.py",
            "ci/vllm-source-history")
DOCS = ("specs/RELEASES.md", "specs/PROFILES.md")
_RANGE = re.compile(r"\b0\.17(?:\.1)?\s*(?:to|-)\s*0\.\d+")
_DEFAULT = re.compile(r"""default=["']\d+\.\d+\.\d+["']""")
_ROW = re.compile(r"^\|\s*(\d+\.\d+(?:\.\d+)?)\s*\|([^|]*)\|", re.M)


def _texts() -> dict[str, str]:
    return {p: (ROOT / p).read_text() for p in (*DERIVING, *DOCS)}


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def release_fact_problems(releases, profiles, shapes, texts) -> list[str]:
    """Every disagreement between the list of releases and a place that should
    derive from it, one line each naming the place and the release."""
    problems: list[str] = []
    keys = [release_key(r) for r in releases]
    if keys != sorted(set(keys)) or len({k[:2] for k in keys}) != len(keys):
        problems.append("impl/releases.py: RELEASES is not one release per minor, oldest first")
    followed = set(releases)
    minors = {k[:2] for k in keys}

    checked = {r: p.name for p in profiles for r in p.checked_against}
    for r in releases:
        if r not in checked:
            problems.append(f"impl/profiles.py: no profile is checked against {r}")
    for r, name in checked.items():
        if r not in followed:
            problems.append(f"impl/profiles.py: profile {name} names {r}, not a followed release")
    names = [release_key(p.name) for p in profiles]
    if names != sorted(set(names)):
        problems.append("impl/profiles.py: the profiles are not in release order")

    since = [release_key(s.since) for s in shapes]
    if since != sorted(set(since)):
        problems.append("harness/backends/vllm_api.py: the API rows are not in release order")
    if shapes and releases and since[0] > keys[0]:
        problems.append(f"harness/backends/vllm_api.py: no API row for {releases[0]}")
    for s, k in zip(shapes, since):
        if k[:2] not in minors:
            problems.append(f"harness/backends/vllm_api.py: API row since {s.since}, "
                            "no followed release of that minor")

    for r in make_words("TEST_OVERLAYS", texts["Makefile"]):
        if r not in followed:
            problems.append(f"Makefile: TEST_OVERLAYS names {r}, not a followed release")
    for path in DERIVING:
        for m in (*_RANGE.finditer(texts[path]), *_DEFAULT.finditer(texts[path])):
            problems.append(f"{path}: '{m.group(0)}' writes a release the list derives")

    rows = {m.group(1) for m in _ROW.finditer(_section(texts["specs/RELEASES.md"],
                                                       "The releases"))}
    for r in sorted(followed - rows, key=release_key):
        problems.append(f"specs/RELEASES.md: no row for {r} in 'The releases'")
    for r in sorted(rows - followed, key=release_key):
        problems.append(f"specs/RELEASES.md: a row for {r}, not a followed release")

    table = {m.group(1): m.group(2).strip()
             for m in _ROW.finditer(_section(texts["specs/PROFILES.md"], "The profiles"))}
    for p in profiles:
        on = ", ".join(p.checked_against)
        if table.get(p.name) != on:
            problems.append(f"specs/PROFILES.md: profile {p.name} is checked on {on}, "
                            f"the table says {table.get(p.name)!r}")
    for name in sorted(set(table) - {p.name for p in profiles}, key=release_key):
        problems.append(f"specs/PROFILES.md: a row for profile {name}, which does not exist")
    return problems


def test_every_place_derives_the_same_releases():
    assert release_fact_problems(RELEASES, list(PROFILES.values()), SHAPES, _texts()) == []


def _released(place: str):
    """The real places, with release 0.99.0 (or profile 0.99) put into `place` only."""
    releases, profiles, shapes, texts = RELEASES, list(PROFILES.values()), SHAPES, _texts()
    if place == "list":
        releases = (*RELEASES, "0.99.0")
    elif place == "profile":
        profiles = [*profiles[:-1], dataclasses.replace(
            profiles[-1], checked_against=(*profiles[-1].checked_against, "0.99.0"))]
    elif place == "api":
        shapes = (*SHAPES, dataclasses.replace(SHAPES[-1], since="0.99.0"))
    elif place == "Makefile":
        texts["Makefile"] = texts["Makefile"].replace(
            "TEST_OVERLAYS := ", "TEST_OVERLAYS := 0.99.0 ")
    elif place == "README.md":
        texts["README.md"] += "\nEvery release from 0.17 to 0.99 has a profile.\n"
    elif place == "harness/releases/bisect.py":
        texts[place] += '\np.add_argument("--to", default="0.99.0")\n'
    elif place == "specs/RELEASES.md":
        texts[place] = texts[place].replace("\n| 0.17.1 |", "\n| 0.99.0 | - |\n| 0.17.1 |", 1)
    elif place == "specs/PROFILES.md":
        texts[place] = texts[place].replace("\n| 0.17 |", "\n| 0.99 | 0.99.0 | x |\n| 0.17 |", 1)
    return releases, profiles, shapes, texts


@pytest.mark.parametrize("place", ["list", "profile", "api", "Makefile", "README.md",
                                   "harness/releases/bisect.py", "specs/RELEASES.md",
                                   "specs/PROFILES.md"])
def test_a_release_in_one_place_only_is_named(place):
    # Negative control: each place is checked (the 0.99 release, or the range
    # or default naming it, is reported with the place that disagrees).
    problems = release_fact_problems(*_released(place))
    assert problems and all("0.99" in p for p in problems), problems
    if place not in ("list", "profile", "api"):
        assert all(p.startswith(place) for p in problems), problems


def test_a_profile_with_no_followed_release_is_refused():
    # The profiles derive their releases from the list: a profile the list
    # gives no release is an error when the profiles are built, not a silent gap.
    from impl import profiles as mod

    first, nxt = PROFILES["0.33"], None
    with pytest.raises(AssertionError, match="profile 0.99: no followed release"):
        mod._checked_against(dataclasses.replace(first, name="0.99"), nxt)
