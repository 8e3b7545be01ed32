"""Overlays: one vLLM release's pure-Python KV cache code, importable on top of
this project's venv (`.vllm-VERSION/`, put first on the module path).

Every vLLM release's KV cache manager is pure Python, so any release runs here
at block level on the venv's torch, whatever torch or CUDA its own wheel wants
(no compiled ops, no engine). An overlay is built from the release's wheel
(`pip install --no-deps --target`, through pip's cache, or from the wheels in
$KVCONFORM_WHEELS) and trimmed to its Python code: ~50 MB instead of the
wheel's ~0.9 GB. Its KV cache code is imported once built
(harness/releases/vllm_overlay_probe.py), which also finds the third-party modules it
needs that this venv lacks (added to the overlay).

Why all of vllm's Python rather than only the modules the KV cache code
imports (~18 MB): the scheduler and capture paths import models and configs
lazily, inside functions, so an import-closure trim breaks them at run time.

    ci/vllm-overlay.sh VERSION              # build (once; cached)
    kvconform --vllm VERSION VERB ...       # or KVCONFORM_VLLM=VERSION: any verb on it
    PYTHONPATH=.vllm-VERSION python ...     # by hand
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.vllm_releases import resolve
from harness.releases.vllm_overlay_probe import MARKER

# Written last into a finished overlay: its presence means the overlay is whole.
STAMP = "KVCONFORM_OVERLAY.json"
# What an overlay keeps of the wheel's vllm/: Python and the data files it
# reads. Not kept: compiled ops and executables (a CUDA build's, unusable
# here), C/CUDA sources and headers, web assets: about 94% of the wheel.
_KEPT_SUFFIXES = (".py", ".pyi", ".json", ".jinja", ".yaml", ".yml", ".txt", ".toml",
                  "py.typed")
# Third-party modules the KV code may import that this venv lacks, and the
# distribution that provides each (when the names differ).
_DISTRIBUTIONS = {"yaml": "pyyaml", "zmq": "pyzmq"}
_MAX_MISSING_ROUNDS = 4


class OverlayError(RuntimeError):
    """The overlay cannot be built or used (an environment problem: exit 3)."""


@dataclass(frozen=True, slots=True)
class OverlayInfo:
    version: str
    path: Path
    files: int
    bytes: int
    wheel_bytes: int  # the untrimmed install
    build_seconds: float


def overlays_dir() -> Path:
    """Where overlays live: $KVCONFORM_OVERLAYS, else the project root."""
    env = os.environ.get("KVCONFORM_OVERLAYS")
    return Path(env) if env else Path(__file__).resolve().parents[2]


def overlay_path(version: str) -> Path:
    return overlays_dir() / f".vllm-{resolve(version)}"


def read_info(path: Path) -> OverlayInfo | None:
    try:
        data = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return OverlayInfo(data["version"], path, data["files"], data["bytes"],
                       data["wheel_bytes"], data["build_seconds"])


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"kvconform: {message}", file=sys.stderr, flush=True)


def _tree_bytes(root: Path) -> tuple[int, int]:
    files = size = 0
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            files += 1
            size += p.stat().st_size
    return files, size


def _pip(args: list[str], progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
           "--no-deps", "--only-binary", ":all:"]
    wheels = os.environ.get("KVCONFORM_WHEELS")
    if wheels:
        cmd += ["--find-links", wheels]
    if not (progress and sys.stderr.isatty()):
        cmd.append("-q")
    done = subprocess.run(cmd + args, stdout=sys.stderr if progress else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()
                and not line.startswith("WARNING")]
        raise OverlayError(f"pip install {' '.join(args[-1:])} failed: "
                           f"{last[-1] if last else 'exit ' + str(done.returncode)}")


def _probe(roots: list[Path]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(r) for r in roots),
               KVCONFORM_VLLM="")
    done = subprocess.run([sys.executable, "-m", "harness.releases.vllm_overlay_probe"],
                          capture_output=True, text=True, env=env, cwd=roots[0])
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise OverlayError(f"probing the vLLM release failed: {tail}")


def _kept(full: Path) -> list[Path]:
    """The release's Python code and the data files it reads, and its
    dist-info (importlib.metadata finds the version there)."""
    keep = []
    for p in full.rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        top = p.relative_to(full).parts[0]
        if top == "vllm" and p.name.endswith(_KEPT_SUFFIXES) and not _is_elf(p):
            keep.append(p)
        elif top.startswith("vllm-") and top.endswith(".dist-info") and p.name != "RECORD":
            keep.append(p)
    return keep


def _is_elf(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"\x7fELF"


def build(version: str, progress: bool = True, force: bool = False) -> OverlayInfo:
    """Build the overlay of `version` (a release, or a minor: '0.25'), unless a
    whole one exists. Safe against concurrent builds of the same release."""
    version = resolve(version)
    target = overlay_path(version)
    # Locks and half-built overlays live apart, so a crash leaves no
    # .vllm-VERSION/ that looks whole.
    scratch = target.parent / ".vllm-build"
    scratch.mkdir(parents=True, exist_ok=True)
    with open(scratch / f"{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = read_info(target)
        if info is not None and not force:
            return info
        t0 = time.perf_counter()
        work = scratch / f"{version}.partial-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            info = _build_into(version, work, target, progress, t0)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return info


def _build_into(version: str, work: Path, target: Path, progress: bool, t0: float) -> OverlayInfo:
    full, extra, out = work / "full", work / "extra", work / "overlay"
    _say(progress, f"vLLM {version} overlay: installing the wheel (pip, --no-deps)")
    _pip(["--target", str(full), f"vllm=={version}"], progress)
    _, wheel_bytes = _tree_bytes(full)
    _say(progress, f"vLLM {version} overlay: {wheel_bytes / 1e6:,.0f} MB installed; "
         "importing its KV cache code")
    report = _probe([full])
    installed: set[str] = set()
    for _ in range(_MAX_MISSING_ROUNDS):
        new = [m for m in report["missing"] if m not in installed]
        if not new:
            break
        dists = [_DISTRIBUTIONS.get(m, m) for m in new]
        _say(progress, f"vLLM {version} overlay: adding {', '.join(dists)} (not in this venv)")
        _pip(["--target", str(extra), *dists], progress)
        installed.update(new)
        report = _probe([full, extra])
    if report["version"] != version:
        raise OverlayError(f"the wheel of vLLM {version} imports as {report['version']}")
    if report["required_failed"]:
        name = report["required_failed"][0]
        raise OverlayError(f"vLLM {version}: {name} does not import on this venv: "
                           f"{report['failed'][name]}")
    for p in _kept(full):
        dest = out / p.relative_to(full)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
    if extra.exists():
        shutil.copytree(extra, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("bin"))
    check = _probe([out])
    if check["required_failed"]:
        name = check["required_failed"][0]
        raise OverlayError(f"vLLM {version}: the trimmed overlay lost {name}: "
                           f"{check['failed'][name]}")
    files, size = _tree_bytes(out)
    seconds = time.perf_counter() - t0
    (out / STAMP).write_text(json.dumps({
        "version": version, "files": files, "bytes": size, "wheel_bytes": wheel_bytes,
        "build_seconds": round(seconds, 1), "extra": sorted(installed),
        "optional_unavailable": sorted(check["failed"]),
    }, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    out.rename(target)
    _say(progress, f"vLLM {version} overlay ready in {target} ({size / 1e6:,.1f} MB, "
         f"{files} files, from {wheel_bytes / 1e6:,.0f} MB; {seconds:.0f} s)")
    return OverlayInfo(version, target, files, size, wheel_bytes, seconds)


def ensure(version: str, progress: bool = True) -> OverlayInfo:
    """The overlay of `version`, built first if missing."""
    info = read_info(overlay_path(version))
    return info if info is not None else build(version, progress)


def activate(version: str, progress: bool = True) -> OverlayInfo:
    """Make `version` the vLLM this process (and every process it starts)
    imports: the overlay goes first on sys.path and PYTHONPATH. Must run before
    anything imports vllm."""
    if "vllm" in sys.modules:
        raise OverlayError("vllm is already imported; choose the release before anything "
                           "imports it")
    info = ensure(version, progress)
    path = str(info.path)
    sys.path.insert(0, path)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path if not old else path + os.pathsep + old
    return info


def refuse(e: Exception, where: str = "") -> int:
    """One line for a release that cannot be used (an unknown one is bad
    input, one whose overlay cannot be built is the environment's); returns
    the exit code."""
    from harness.core.exit_codes import ExitCode
    from harness.core.vllm_releases import UnknownRelease

    print(f"kvconform: {where}{e}", file=sys.stderr)
    return ExitCode.BAD_INPUT if isinstance(e, UnknownRelease) else ExitCode.ENVIRONMENT


def activate_for_cli(version: str) -> int:
    """`kvconform --vllm VERSION` / KVCONFORM_VLLM: activate, or say in one
    line why not; returns the exit code to stop with (0: go on)."""
    from harness.core.vllm_releases import UnknownRelease

    try:
        activate(version)
    except (UnknownRelease, OverlayError) as e:
        return refuse(e, "--vllm: ")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.releases.vllm_overlay VERSION [--force]` (ci/vllm-overlay.sh)."""
    import argparse

    from harness.core.vllm_releases import UnknownRelease

    parser = argparse.ArgumentParser(prog="ci/vllm-overlay.sh",
                                     description="build a vLLM release's KV cache overlay")
    parser.add_argument("version", metavar="VERSION", help="e.g. 0.25.1, or 0.25")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    try:
        info = build(args.version, progress=True, force=args.force)
    except (UnknownRelease, OverlayError) as e:
        return refuse(e)
    print(info.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
