"""The gate: exit codes, JUnit, summary; parallel results equal serial ones."""

import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from harness.core.exit_codes import ExitCode
from harness.gate.run import run_gate
from impl.profiles import supported_versions

pytestmark = pytest.mark.vllm
SCENARIOS = Path(__file__).resolve().parents[2] / "traces" / "scenarios"


def _copy(tmp_path, *names):
    d = tmp_path / "traces"
    d.mkdir()
    for n in names:
        shutil.copy(SCENARIOS / n, d / n)
    return d


def _edit_answer(path: Path) -> int:
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.strip() == "answer: {block_ids: [[6, 7]]}")
    lines[i] = lines[i].replace("[[6, 7]]", "[[6, 9]]")
    path.write_text("".join(lines))
    return i + 1


def test_gate_fails_on_an_edited_answer_and_names_it(tmp_path, capsys):
    d = _copy(tmp_path, "documented-example.yaml", "salted-requests.yaml")
    line = _edit_answer(d / "documented-example.yaml")
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    code = run_gate([str(d)], fuzz_seconds=3, fuzz_seed=0, fuzz_out=str(tmp_path / "f"),
                    junit=str(junit), summary=str(summary), jobs="1")
    out = capsys.readouterr().out
    assert code == 1
    where = f"{d / 'documented-example.yaml'}:{line}"
    assert where in out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert "documented-example.yaml" in cases and "salted-requests.yaml" in cases
    assert any(n.startswith("fuzz[") for n in cases)
    assert len([n for n in cases if n.startswith("workload-")]) >= 5
    failure = cases["documented-example.yaml"].find("failure")
    assert failure is not None and where in (failure.text or "") + failure.get("message", "")
    assert cases["salted-requests.yaml"].find("failure") is None
    text = summary.read_text()
    assert "1 of" in text and "DIVERGED" in text and where in text
    # The fuzz slices' reach into vLLM's KV core, in the summary.
    reached = re.search(r"vLLM KV core branch coverage .*: ([\d,]+) of ([\d,]+) branches", text)
    assert reached and 0 < int(reached[1].replace(",", "")) < int(reached[2].replace(",", ""))


def test_parallel_gate_equals_serial(tmp_path, capsys):
    d = _copy(tmp_path, "documented-example.yaml", "extra-keys.yaml", "lookahead-tokens.yaml",
              "documented-example-v0.17.yaml")

    def rows(jobs):
        s = tmp_path / f"summary-{jobs}.md"
        assert run_gate([str(d)], 0, 0, str(tmp_path / "f"), None, str(s), jobs) == 0
        table = [r for r in s.read_text().splitlines() if r.startswith("| `")]
        # Drop the timing column; everything else must match.
        return [r.split("|")[1:5] + r.split("|")[6:] for r in table]

    assert rows("1") == rows("2")


def test_gate_on_missing_path_is_usage_error(tmp_path):
    assert run_gate([str(tmp_path / "nope")], 0, 0, str(tmp_path), None, None, "1") == 2


def test_a_vllm_without_a_profile_is_one_line_before_any_case(tmp_path, capsys, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.9.0")
    assert run_gate([str(SCENARIOS)], 0, 0, str(tmp_path), None, None, "1") == 3
    out, err = capsys.readouterr()
    assert out == ""  # pytest never started
    assert err.strip().splitlines() == [
        f"kvconform: installed vLLM 0.9.0 has no profile (supported: {supported_versions()})"]


ENGINE_TRACE = SCENARIOS.parent / "golden" / "v0.32" / "engine-multi-turn-chat.jsonl"


def _attention_gate(tmp_path, capsys):
    junit = tmp_path / "junit.xml"
    code = run_gate([str(ENGINE_TRACE)], 0, 0, str(tmp_path / "f"), str(junit), None, "1",
                    workloads=False)
    out = capsys.readouterr().out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    return code, out, cases


def test_a_trace_with_a_model_header_is_also_an_attention_case(tmp_path, capsys):
    code, out, cases = _attention_gate(tmp_path, capsys)
    assert code == 0, out
    # ... and a sizing case (its model's KV cache sized by impl and vLLM).
    assert set(cases) == {"engine-multi-turn-chat.jsonl",
                          "engine-multi-turn-chat.jsonl[attention]",
                          "engine-multi-turn-chat.jsonl[sizing]",
                          "engine-multi-turn-chat.jsonl[worker]"}
    assert cases["engine-multi-turn-chat.jsonl[sizing]"].get("classname") == "kvconform.sizing"
    row = next(r for r in out.splitlines() if " attention " in r)
    assert row.split()[-1] == "conformant" and int(row.split()[-3]) > 0  # query tokens


def test_a_swapped_block_table_fails_the_attention_case(tmp_path, capsys, monkeypatch):
    # Negative control (issue 14): impl's block table swaps each row's first
    # two entries; the block-level answers are untouched.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kvconform_test_mutants", Path(__file__).parent / "attention" / "mutants.py")
    mutants = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mutants)
    spec.loader.exec_module(mutants)
    mutants.MUTANTS["block-table-swap"].apply(monkeypatch, tmp_path)
    code, out, cases = _attention_gate(tmp_path, capsys)
    assert code == 1, out
    failure = cases["engine-multi-turn-chat.jsonl[attention]"].find("failure")
    assert failure is not None and "block table" in failure.get("message")
    assert "attention " in failure.text  # the summary lines
    assert cases["engine-multi-turn-chat.jsonl"].find("failure") is None


FP8_TRACE = SCENARIOS / "fp8-kv-cache-attention.yaml"


def _fp8_gate(tmp_path, capsys):
    d = _copy(tmp_path, FP8_TRACE.name)
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    code = run_gate([str(d)], 0, 0, str(tmp_path / "f"), str(junit), str(summary), "1",
                    workloads=False)
    out = capsys.readouterr().out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    return code, out, cases, summary.read_text()


def test_the_fp8_attention_case_runs_where_vllm_keeps_an_fp8_cache(tmp_path, capsys):
    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        pytest.skip("this CPU has neither AVX-512 nor AMX: vLLM keeps no fp8 cache here "
                    "(the next test shows the gate's answer)")
    code, out, cases, _ = _fp8_gate(tmp_path, capsys)
    assert code == 0, out
    row = next(r for r in out.splitlines() if " attention " in r)
    assert row.split()[-1] == "conformant", row


def test_without_avx512_the_fp8_attention_case_is_the_machines_and_decides_nothing(
        tmp_path, capsys, monkeypatch):
    """Where vLLM's CPU attention keeps no fp8 cache (hidden from its ISA
    pick: this machine as the AVX2-only EPYC a fresh clone may land on), the
    case is reported with what the machine lacks, a JUnit <skipped>, and the
    gate's exit code is that of the cases the machine could run; the verb on
    that trace alone is exit 3."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    code, out, cases, summary = _fp8_gate(tmp_path, capsys)
    assert code == 0, out
    row = next(r for r in out.splitlines() if " attention " in r)
    assert row.endswith("SKIPPED (this machine)"), row
    skipped = cases["fp8-kv-cache-attention.yaml[attention]"].find("skipped")
    assert skipped is not None and "AVX-512" in skipped.get("message")
    assert cases["fp8-kv-cache-attention.yaml"].find("failure") is None
    assert "1 not run on this machine" in out and "AVX-512" in summary
    from harness.cli.main import main

    assert main(["diff", str(FP8_TRACE)]) == 3
    assert "AVX-512" in capsys.readouterr().out


def test_a_case_not_run_here_never_hides_a_failure():
    """Negative control of the rule above: a skipped case beside a divergence
    leaves exit 1, and a run whose every case was skipped checked nothing
    (the environment's exit 3, never a pass)."""
    from harness.gate.cases import Case, gate_exit_code

    skipped = Case("a", "trace", "attention", 0, 0.0, ExitCode.ENVIRONMENT, "x",
                   not_run_here="needs AVX-512")
    diverged = Case("b", "trace", "diff", 1, 0.0, ExitCode.DIVERGED, "y")
    ok = Case("c", "trace", "diff", 1, 0.0, ExitCode.OK)
    assert gate_exit_code([skipped, diverged]) == ExitCode.DIVERGED
    assert gate_exit_code([skipped, ok]) == ExitCode.OK
    assert gate_exit_code([skipped]) == ExitCode.ENVIRONMENT
    assert gate_exit_code([ok, Case("d", "trace", "attention", 0, 0.0,
                                    ExitCode.ENVIRONMENT, "no vLLM")]) == ExitCode.ENVIRONMENT


def test_an_unknown_assumed_profile_is_one_line_exit_2(capsys):
    from harness.cli.main import main

    assert main(["--assume-profile", "0.9", "gate", str(SCENARIOS)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kvconform: --assume-profile: vLLM 0.9 has no profile "
                   f"(supported: {supported_versions()})")


def _raised_in(filename: str) -> Exception:
    try:
        exec(compile("raise AttributeError('no such op')", filename, "exec"))
    except AttributeError as e:
        return e


def test_an_exception_escaping_a_case_is_one_line_never_a_traceback():
    from harness.gate.cases import crashed_case

    inside = crashed_case("t", "trace", _raised_in("/o/vllm/_custom_ops.py"))
    adapter = crashed_case("t", "trace", _raised_in("/r/harness/backends/vllm_cpu_attention.py"))
    ours = crashed_case("t", "trace", _raised_in("/r/harness/sources/replay.py"))
    assert inside.exit_code == adapter.exit_code == ExitCode.ENVIRONMENT
    assert ours.exit_code == ExitCode.BAD_INPUT
    assert inside.report == ("t: vLLM cannot run this case: AttributeError: no such op "
                             "(at _custom_ops.py:1)")
    assert "\n" not in ours.report
