"""`kvconform bisect`: the first release whose answers to a trace differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.releases.bisect import ReleaseRun, changed_files, compare
from harness.releases.release_answers import _adapter_failure

REPO = Path(__file__).resolve().parents[2]
MAMBA_FINDING = REPO / "tests" / "harness" / "data" / "mamba-hybrid-allocate.jsonl"
EXAMPLE = REPO / "traces" / "scenarios" / "documented-example.yaml"


def _run(version: str, *results: dict) -> ReleaseRun:
    return ReleaseRun(version, None, list(results), 0.0)


def _answer(line: int, op: str, answer: dict) -> dict:
    return {"line": line, "op": op, "answer": answer}


def test_equal_answers_compare_equal_even_when_refusal_messages_name_the_release():
    a = _run("0.17.1", _answer(2, "lookup", {"hit_tokens": 0}),
             {"line": 3, "op": "record_stats", "error": "BackendError",
              "message": "vLLM 0.17.1 has no record_prefix_cache_stats"})
    b = _run("0.18.1", _answer(2, "lookup", {"hit_tokens": 0}),
             {"line": 3, "op": "record_stats", "error": "BackendError",
              "message": "vLLM 0.18.1 has no record_prefix_cache_stats"})
    assert compare(a, b) is None


def test_the_first_differing_event_and_field_are_named():
    a = _run("0.32.0", _answer(2, "allocate", {"block_ids": [[1, 2]]}),
             _answer(3, "allocate", {"block_ids": [[3]]}))
    b = _run("0.33.0", _answer(2, "allocate", {"block_ids": [[1, 2]]}),
             _answer(3, "allocate", {"block_ids": [[4]]}))
    d = compare(a, b)
    assert (d.index, d.line, d.op, d.field) == (1, 3, "allocate", "block_ids[0][0]")


def test_an_event_one_release_refuses_and_another_executes_is_a_difference():
    a = _run("0.26.0", {"line": 5, "op": "record_stats", "error": "BackendError", "message": ""})
    b = _run("0.27.1", _answer(5, "record_stats", {}))
    assert compare(a, b).field == "(executes vs refuses)"


def test_a_release_refusing_the_config_is_named_at_the_header():
    a = _run("0.32.0", _answer(2, "add_request", {"block_hashes": []}))
    b = _run("0.33.0", {"line": 1, "op": "header", "error": "AssertionError", "message": "no"})
    d = compare(a, b)
    assert (d.line, d.op, d.field) == (1, "header", "(executes vs refuses)")


def _raised(exc: str, filename: str) -> BaseException:
    try:
        exec(compile(f"raise {exc}('x')", filename, "exec"))
    except BaseException as e:  # noqa: BLE001
        return e


def test_errors_the_adapter_raises_stop_the_run_and_vllms_own_are_answers():
    # The adapter calling vLLM wrongly fails in harness code: exit 3, no answer.
    assert _adapter_failure(_raised("TypeError", "/repo/harness/backends/vllm_backend.py"))
    # vLLM 0.23-0.25 raise TypeError building a sink group themselves: an answer.
    assert not _adapter_failure(_raised("TypeError", "/o/vllm/v1/core/kv_cache_coordinator.py"))
    assert not _adapter_failure(_raised("ValueError", "/repo/harness/x.py"))
    assert _adapter_failure(_raised("ModuleNotFoundError", "/o/vllm/v1/core/x.py"))


def test_changed_files_are_the_kv_sources_that_differ(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for root, pool, extra in ((old, "a\nb\n", None), (new, "a\nc\nd\n", "x\n")):
        (root / "vllm/v1/core").mkdir(parents=True)
        (root / "vllm/v1/core/block_pool.py").write_text(pool)
        (root / "vllm/v1/request.py").write_text("same\n")
        (root / "vllm/entrypoints").mkdir(parents=True)
        (root / "vllm/entrypoints/api.py").write_text(pool)  # not KV code
        if extra:
            (root / "vllm/v1/core/kv_cache_planning.py").write_text(extra)
    found = [(f.path, f.added, f.removed) for f in changed_files(old, new)]
    assert found == [("vllm/v1/core/block_pool.py", 2, 1),
                     ("vllm/v1/core/kv_cache_planning.py", 1, 0)]


def _bisect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", "bisect", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1800, env=dict(os.environ))


def test_the_mamba_hybrid_allocate_change_is_named_033():
    done = _bisect(str(MAMBA_FINDING), "--from", "0.32.0", "--to", "0.33.0", "--json")
    assert done.returncode == 1, done.stderr[-800:]
    r = json.loads(done.stdout)
    assert (r["changed_in"], r["last_same"]) == ("0.33.0", "0.32.0")
    d = r["difference"]
    assert (d["op"], d["field"], d["line"]) == ("allocate", "refused", 10)
    assert d["before"]["answer"] == {"refused": True}
    assert d["after"]["answer"] == {"block_ids": [[4], [3]]}
    assert "vllm/v1/core/single_type_kv_cache_manager.py" in {
        f["path"] for f in r["changed_files"]}


def test_negative_control_a_trace_no_release_changes_names_none():
    done = _bisect(str(EXAMPLE), "--from", "0.32.0", "--to", "0.33.0")
    assert done.returncode == 0, done.stderr[-800:]
    assert "no release changes these answers" in done.stdout
    assert "bisect [2/2] vLLM 0.33.0" in done.stderr


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": '
                   '"hand", "cache": {"num_blocks": 4, "groups": [{"block_size": 4}]}}\n'
                   '{"op": "lookup"}\n')
    done = _bisect(str(bad), "--from", "0.32.0", "--to", "0.33.0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"{bad}:2: ")
    done = _bisect(str(EXAMPLE), "--from", "0.33", "--to", "0.32")
    assert (done.returncode, done.stderr.strip()) == (
        2, "kvconform: --from 0.33 must be older than --to 0.32")
    assert _bisect(str(tmp_path / "none.jsonl")).returncode == 2
