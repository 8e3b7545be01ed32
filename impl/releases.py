"""The vLLM releases kvconform follows, and the one parser of vLLM versions.

RELEASES is the only list of releases: the last patch release of every minor
release from 0.17 on, oldest first (specs/RELEASES.md reads each one's KV cache
source). The profiles (impl/profiles.py) derive which releases each was checked
against from it; the harness derives its overlays, the API-shape table's range,
`kvconform bisect`'s default and `kvconform matrix`'s rows from it. It lives in
impl because impl imports nothing from the harness, while the harness reads impl.

Adding a release with no new behaviour is one line here (specs/RELEASES.md,
"Adding a release").
"""

from __future__ import annotations

import re

RELEASES: tuple[str, ...] = (
    "0.17.1", "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0",
    "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0",
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[+\-.].*)?$")


class NotAVersion(ValueError):
    """A string that is not a vLLM version."""


def release_key(version: str,
                error: type[ValueError] = NotAVersion) -> tuple[int, int, int]:
    """'0.25.1' -> (0, 25, 1); 'v0.25' -> (0, 25, 0); local parts ('+cpu') and
    pre-release tags are ignored. A string that is no version raises `error`
    (callers choose theirs: no profile, or bad input)."""
    m = _VERSION.match(version.strip())
    if not m:
        raise error(f"'{version}' is not a vLLM version (e.g. 0.25.1 or 0.25)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def minor_of(version: str, error: type[ValueError] = NotAVersion) -> str:
    """'0.32.0', '0.32.0+cpu', 'v0.32' -> '0.32': the minor release."""
    major, minor, _ = release_key(version, error)
    return f"{major}.{minor}"


def newest() -> str:
    """The newest followed release (nothing else names it)."""
    return RELEASES[-1]
