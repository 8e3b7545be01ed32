"""`kvconform peer`: fetch, run vLLM's KV-cache tests on vLLM then on impl,
classify, write the summary. Exit 0 when every test that passes on vLLM
passes on impl or is not applicable, 1 when some fail on impl, 3 when the
sdist or vLLM cannot be had."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.core.exit_codes import ExitCode
from harness.peer import classify, fetch, hf_offline, selection, summary


def run_pass(mode: str, root: Path, records: Path, env: dict[str, str], workers: str,
             tests: list[str], extra: list[str] = ()) -> int:
    """One pytest run of vLLM's tests (mode 'vllm' or 'impl'); records land
    in `records` (JSON lines)."""
    env = dict(os.environ, **env, KVCONFORM_PEER_MODE=mode,
               KVCONFORM_PEER_RECORDS=str(records.resolve()))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:kvconform",
           "-p", "harness.peer.plugin", "--rootdir", str(root), "-W", "ignore",
           "--no-header", "-rN", "--tb=no", "--continue-on-collection-errors"]
    if workers != "0":
        cmd += ["-n", workers]
    cmd += [*extra, *tests]
    print(f"peer: running {len(tests)} test files on {mode} ...", flush=True)
    return subprocess.call(cmd, cwd=root, env=env)


def uncollectable(records: Path) -> set[str]:
    """The test files a pass could not import (one collection record each)."""
    if not records.exists():
        return set()
    return {nodeid for nodeid, rec in load(records).items() if rec.get("phase") == "collect"}


def run_collectable(mode: str, root: Path, records: Path, env: dict[str, str], workers: str,
                    tests: list[str], extra: list[str] = ()) -> list[str]:
    """`run_pass`, made whole where a file does not import: under xdist one
    such file stops every test of the run (an older release's worker tests
    on this overlay), so the pass runs again without it; its collection
    record is kept. Answers the tests that were run."""
    run_pass(mode, root, records, env, workers, tests, extra)
    broken = uncollectable(records)
    kept = [t for t in tests if t.split("::", 1)[0] not in broken]
    if workers == "0" or not broken or not kept or len(load(records)) > len(broken):
        return kept
    first = records.read_text()
    print(f"peer: {len(broken)} file(s) do not import on {mode}; the others again",
          flush=True)
    run_pass(mode, root, records, env, workers, kept, extra)
    with open(records, "a") as f:
        f.write(first)
    return kept


def load(records: Path) -> dict[str, dict]:
    out = {}
    with open(records) as f:
        for line in f:
            rec = json.loads(line)
            out[rec["nodeid"]] = rec
    return out


def present(root: Path, tests: list[str]) -> tuple[list[str], list[str]]:
    """(the test paths this sdist has, those it lacks): an older release
    may not have a file yet (its tests are then not in that row)."""
    have, lack = [], []
    for t in tests:
        (have if (root / t.split("::", 1)[0]).exists() else lack).append(t)
    return have, lack


def main(out: Path = Path(".peer"), workers: str = "auto", rerun_vllm: bool = False,
         tests: list[str] | None = None, pytest_args: list[str] = (),
         release: str | None = None) -> int:
    """`release`: the release whose overlay this process imports (`kvconform
    --vllm V peer`); its results go to out/V/, its sdist is cached in out/."""
    from impl.profiles import UnsupportedVersion, get_profile

    start = time.monotonic()
    try:
        version, root = fetch.fetch(out, release)
        root = root.resolve()
    except fetch.FetchError as e:
        print(f"kvconform peer: {e}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    try:
        get_profile(version)
    except UnsupportedVersion as e:
        print(f"kvconform peer: {e}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    results = out / version if release else out
    results.mkdir(parents=True, exist_ok=True)
    env = hf_offline.build((out / "hf-home").resolve())
    env[fetch.PROFILE_ENV] = version
    tests, lacking = present(root, tests or selection.test_paths())
    if not tests:
        print(f"kvconform peer: vLLM {version}'s sdist has none of the test files",
              file=sys.stderr)
        return ExitCode.ENVIRONMENT
    # vLLM's results depend only on its version and the tests chosen: cached.
    key = hashlib.sha256("\n".join(sorted(tests)).encode()).hexdigest()[:12]
    vllm_records = results / f"vllm-{version}-{key}-records.jsonl"
    vllm_seconds = impl_seconds = 0.0
    if rerun_vllm or not vllm_records.exists():
        t0 = time.monotonic()
        run_collectable("vllm", root, vllm_records, env, workers, tests, pytest_args)
        vllm_seconds = time.monotonic() - t0
    else:
        print(f"peer: vLLM results from {vllm_records} (--rerun-vllm to run them again)")
    # What does not import on vLLM is not runnable there, so never run on impl.
    broken = uncollectable(vllm_records)
    tests = [t for t in tests if t.split("::", 1)[0] not in broken]
    impl_records = results / "impl-records.jsonl"
    impl_records.unlink(missing_ok=True)
    t0 = time.monotonic()
    if tests:
        run_collectable("impl", root, impl_records, env, workers, tests, pytest_args)
    else:
        impl_records.write_text("")
    impl_seconds = time.monotonic() - t0
    if not vllm_records.exists() or not impl_records.exists():
        print("kvconform peer: pytest wrote no results (see its output above)", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    vrecs = load(vllm_records)
    verdicts = classify.classify(vrecs, load(impl_records))
    seconds = time.monotonic() - start
    timing = {"seconds": round(seconds, 1), "vllm_seconds": round(vllm_seconds, 1),
              "impl_seconds": round(impl_seconds, 1)}
    s = summary.write(results, version, verdicts, seconds,
                      not_runnable=summary.not_runnable(vrecs), lacking_files=lacking,
                      timing=timing)
    print(summary.markdown(s, verdicts, seconds).split("\n## Features")[0])
    print(f"peer: {results}/summary.json, summary.md, gaps.md, results.json")
    if s["impl_failed"]:
        return ExitCode.DIVERGED
    if not s["vllm_passed"]:
        # Nothing to measure impl by: not a pass.
        print(f"kvconform peer: no test passed on vLLM {version}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
