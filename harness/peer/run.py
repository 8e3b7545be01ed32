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
           "--no-header", "-rN", "--tb=no"]
    if workers != "0":
        cmd += ["-n", workers]
    cmd += [*extra, *tests]
    print(f"peer: running {len(tests)} test files on {mode} ...", flush=True)
    return subprocess.call(cmd, cwd=root, env=env)


def load(records: Path) -> dict[str, dict]:
    out = {}
    with open(records) as f:
        for line in f:
            rec = json.loads(line)
            out[rec["nodeid"]] = rec
    return out


def main(out: Path = Path(".peer"), workers: str = "auto", rerun_vllm: bool = False,
         tests: list[str] | None = None, pytest_args: list[str] = ()) -> int:
    start = time.monotonic()
    try:
        version, root = fetch.fetch(out)
        root = root.resolve()
    except fetch.FetchError as e:
        print(f"kvconform peer: {e}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    env = hf_offline.build((out / "hf-home").resolve())
    tests = tests or selection.test_paths()
    # vLLM's results depend only on its version and the tests chosen: cached.
    key = hashlib.sha256("\n".join(sorted(tests)).encode()).hexdigest()[:12]
    vllm_records = out / f"vllm-{version}-{key}-records.jsonl"
    if rerun_vllm or not vllm_records.exists():
        run_pass("vllm", root, vllm_records, env, workers, tests, pytest_args)
    else:
        print(f"peer: vLLM results from {vllm_records} (--rerun-vllm to run them again)")
    impl_records = out / "impl-records.jsonl"
    run_pass("impl", root, impl_records, env, workers, tests, pytest_args)
    if not vllm_records.exists() or not impl_records.exists():
        print("kvconform peer: pytest wrote no results (see its output above)", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    verdicts = classify.classify(load(vllm_records), load(impl_records))
    seconds = time.monotonic() - start
    s = summary.write(out, version, verdicts, seconds)
    print(summary.markdown(s, verdicts, seconds).split("\n## Features")[0])
    print(f"peer: {out}/summary.json, summary.md, gaps.md, results.json")
    return ExitCode.DIVERGED if s["impl_failed"] else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
