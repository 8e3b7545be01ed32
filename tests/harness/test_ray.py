"""kvconform fuzz --ray and gate --ray on a local Ray cluster (2 workers,
loopback only, stopped by its process id at the end): kind configs spread over
the workers, the same cases whatever the number of workers, findings streamed
back, de-duplicated by shrunk signature and written as regression traces, the
gate's cases run on the workers with the gate's table and JUnit. Bounded by
counts (--max-cases), not by time."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fuzz.distributed import kind_configs
from harness.fuzz.ray_cluster import local_head

pytestmark = [pytest.mark.ray, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "traces" / "scenarios" / "documented-example.yaml"
CASES = 240  # about 10 per kind config
FOREVER = "1000000"


@pytest.fixture(scope="module")
def head():
    with local_head(num_cpus=2) as h:
        yield h


def kvconform(*args: str, head=None) -> subprocess.CompletedProcess:
    """The CLI in its own process; with `head`, joined to it (its token)."""
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT,
                          env=head.client_env() if head else None)


def _totals(stdout: str) -> str:
    return re.search(r"(\d+ cases, \d+ differential ops)", stdout).group(1)


def test_fuzz_spreads_kind_configs_and_runs_the_same_cases_on_any_number_of_workers(
        head, tmp_path):
    two = kvconform("fuzz", "--ray", head.address, "--max-cases", str(CASES),
                    "--seconds", FOREVER, "--out", str(tmp_path), head=head)
    assert two.returncode == 0, two.stdout + two.stderr
    names = kind_configs()
    assert f"2 workers, {len(names)} configs, {CASES} cases" in two.stdout
    # Cases are dealt out in rounds over the configs: every one gets its share.
    shares = [int(re.search(rf"  {name}: (\d+) cases", two.stdout).group(1)) for name in names]
    assert sum(shares) == CASES and min(shares) >= CASES // len(names)
    assert "no divergence" in two.stdout and "not counted" in two.stderr
    one = kvconform("fuzz", "--ray", head.address, "--workers", "1", "--max-cases", str(CASES),
                    "--seconds", FOREVER, "--out", str(tmp_path), head=head)
    assert one.returncode == 0, one.stdout + one.stderr
    assert "1 workers" in one.stdout
    assert _totals(one.stdout) == _totals(two.stdout)
    assert list(tmp_path.iterdir()) == []


def test_findings_stream_back_deduplicated_as_regression_traces(head, tmp_path):
    out = tmp_path / "findings"
    p = kvconform("fuzz", "--ray", head.address, "--max-cases", str(CASES),
                  "--seconds", FOREVER, "--out", str(out), "--inject-fault", "touch-keeps-free",
                  head=head)
    assert p.returncode == 1, p.stdout + p.stderr
    m = re.search(r"(\d+) distinct findings \((\d+) duplicates by shrunk signature\)", p.stdout)
    distinct, duplicates = int(m.group(1)), int(m.group(2))
    written = sorted(out.glob("*.jsonl"))
    assert len(written) == distinct >= 1
    # The one fault shows in several kind configs: the same signature.
    assert duplicates >= 1
    for path in written:
        # Recorded with vLLM's answers: the real impl replays it cleanly, the
        # faulty one does not.
        assert kvconform("replay", "--check-invariants", str(path)).returncode == 0
        header = json.loads(path.read_text().split("\n", 1)[0])
        assert header["source"] == "fuzz" and "injected fault touch-keeps-free" in (
            header["description"])


def test_gate_runs_the_corpus_on_the_workers(head, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(EXAMPLE, corpus / "good.yaml")
    text = EXAMPLE.read_text()
    # A recorded expectation no vLLM gives: a divergence on the worker.
    bad = text.replace("expect: {hit_tokens: 0", "expect: {hit_tokens: 1", 1)
    assert bad != text
    (corpus / "bad.yaml").write_text(bad)
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    p = kvconform("gate", "--ray", head.address, str(corpus), "--fuzz-seconds", "0",
                  "--junit", str(junit), "--summary", str(summary), head=head)
    assert p.returncode == 1, p.stdout + p.stderr
    rows = {line.split()[0]: line for line in p.stdout.splitlines()
            if line.startswith((str(corpus), "workload-"))}
    assert rows[str(corpus / "good.yaml")].endswith("conformant")
    assert rows[str(corpus / "bad.yaml")].endswith("DIVERGED")
    from harness.gate.cases import WORKLOADS

    assert sum(k.startswith("workload-") for k in rows) == len(WORKLOADS) >= 11
    xml = junit.read_text()
    assert xml.count("<testcase ") == len(WORKLOADS) + 2 and 'failures="1"' in xml
    assert "bad.yaml" in summary.read_text()


def test_the_local_head_admits_its_own_token_only(head, tmp_path):
    """The head kvconform starts holds a token of its own: a client without
    it is refused (exit 3, the environment), and a stray ~/.ray token, which
    any local ray.init() may write, cannot stand in for it (CI failed so)."""
    env = {**head.client_env(), "RAY_AUTH_TOKEN": "not-the-heads-token"}
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "fuzz", "--ray", head.address,
                        "--max-cases", "1", "--seconds", FOREVER, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.splitlines()[-1].startswith(
        f"kvconform: cannot start or reach a Ray cluster at {head.address}")
