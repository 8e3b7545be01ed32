"""The vLLM releases kvconform follows: the last patch release of every minor
release from 0.17 on (specs/RELEASES.md reads each one's KV cache source).

Overlays, the vLLM adapter's API-shape table and `kvconform bisect` walk this
list; a minor release ("0.25") names its entry here ("0.25.1").
"""

from __future__ import annotations

import re

RELEASES: tuple[str, ...] = (
    "0.17.1", "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0",
    "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0",
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[+\-.].*)?$")


class UnknownRelease(ValueError):
    """Not a vLLM version, or one outside the followed releases."""


def release_key(version: str) -> tuple[int, int, int]:
    """'0.25.1' -> (0, 25, 1); local parts ('+cpu') are ignored."""
    m = _VERSION.match(version.strip())
    if not m:
        raise UnknownRelease(f"'{version}' is not a vLLM version (e.g. 0.25.1 or 0.25)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


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
