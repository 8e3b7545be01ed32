"""The vLLM releases kvconform follows, as the harness uses them: the list and
the version parser are impl's (impl/releases.py, the one place a release is
listed); this module adds what only the harness needs, resolving a minor
release ("0.25") to its followed patch release ("0.25.1") and the ranges
`kvconform bisect` walks.
"""

from __future__ import annotations

import re

from impl import releases as _releases
from impl.releases import RELEASES, newest

__all__ = ["RELEASES", "UnknownRelease", "between", "newest", "release_key", "resolve"]


class UnknownRelease(ValueError):
    """Not a vLLM version, or one outside the followed releases."""


def release_key(version: str) -> tuple[int, int, int]:
    """'0.25.1' -> (0, 25, 1) (impl/releases.py's parser); a string that is no
    version is bad input here (UnknownRelease)."""
    return _releases.release_key(version, UnknownRelease)


def resolve(version: str) -> str:
    """A release as pip names it: a minor release ('0.25') resolves to the
    followed patch release ('0.25.1'); a full version is kept as given."""
    version = version.strip().lstrip("v")
    if re.fullmatch(r"\d+\.\d+", version):
        for r in RELEASES:
            if release_key(r)[:2] == release_key(version)[:2]:
                return r
        raise UnknownRelease(
            f"vLLM {version}: no followed release of that minor (give the full version)"
        )
    release_key(version)
    return version


def between(first: str, last: str) -> list[str]:
    """The followed releases from `first` to `last`, both included (each
    resolved); `first` and `last` themselves are included even when they are
    not the followed patch of their minor."""
    a, b = resolve(first), resolve(last)
    ka, kb = release_key(a), release_key(b)
    if ka >= kb:
        raise UnknownRelease(f"--from {first} must be older than --to {last}")
    inner = [r for r in RELEASES if ka < release_key(r) < kb]
    return [a, *inner, b]
