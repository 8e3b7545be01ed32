"""The sizing differential (harness/backends/sizing.py) and its gate cases:
the corpus reads and conforms, a sizing bug planted in impl or in vLLM fails
the case naming the shape and the field, bad corpus input is one line, and
the fuzz slice compares shapes. Against the installed vLLM (fails loudly
without it). About 15 s, most of it vLLM's import.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.core.exit_codes import ExitCode
from harness.core.trace_error import TraceError
from harness.gate.cases import WORKLOADS, run_sizing, run_sizing_fuzz, workload_sizing_shape
from harness.sources.sizing_corpus import read_sizing_corpus

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "traces" / "sizing").glob("*.yaml"))


def _shape(file: str, name: str):
    return next(s for s in read_sizing_corpus(str(ROOT / "traces" / "sizing" / file))
                if s.name == name)


def test_the_corpus_covers_what_the_issue_asks():
    shapes = [s for p in CORPUS for s in read_sizing_corpus(str(p))]
    kinds = {layer.kind for s in shapes for _, layer in s.layers}
    assert {"full_attention", "sliding_window", "mla_attention", "mamba",
            "chunked_local_attention"} <= kinds
    assert any(len(s.workers) > 1 and len({w.memory for w in s.workers}) > 1 for s in shapes)
    assert any(layer.dtype.startswith("fp8") for s in shapes for _, layer in s.layers)
    assert any(s.kv_cache_layout.startswith("B") for s in shapes)  # packed pages
    assert any(s.auto_fit for s in shapes) and any(s.num_gpu_blocks_override for s in shapes)
    assert any(w.memory_blocks == 1 for s in shapes for w in s.workers)
    assert any(w.memory_extra == -1 for s in shapes for w in s.workers)
    assert len(shapes) >= 40


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_every_corpus_shape_conforms(path):
    for shape in read_sizing_corpus(str(path)):
        case = run_sizing(shape.name, shape)
        assert case.exit_code == ExitCode.OK, case.report
        assert case.kind == "sizing" and case.events > 0


def test_workload_configs_size_to_their_pools():
    for w in WORKLOADS:
        case = run_sizing(f"{w.name}[sizing]", workload_sizing_shape(w))
        assert case.exit_code == ExitCode.OK, case.report
        assert case.mode.endswith(f"{w.config.num_blocks} blocks"), case.mode


def test_a_trace_with_a_model_header_is_sized():
    from harness.gate.cases import trace_sizing_shape

    path = ROOT / "traces/golden/v0.32/engine-hybrid-sliding-window.jsonl"
    shape = trace_sizing_shape(str(path))
    assert len(shape.layers) == 4 and shape.expect == (("scheduler.num_blocks", 33),)
    case = run_sizing("trace", shape)
    assert case.exit_code == ExitCode.OK, case.report


# -- negative controls ---------------------------------------------------------------------


def test_an_off_by_one_in_impls_num_blocks_fails_the_case(monkeypatch):
    """A bug planted in impl's num_blocks (one block more than the memory
    holds) fails the shape's case: exit 1, naming the shape and the field."""
    import impl.kv_cache_planning as iplan

    plan = iplan.get_kv_cache_config_from_groups

    def one_more(*args, **kwargs):
        out = plan(*args, **kwargs)
        out.num_blocks += 1
        return out

    monkeypatch.setattr(iplan, "get_kv_cache_config_from_groups", one_more)
    shape = _shape("dense.yaml", "qwen2-0.5b")
    case = run_sizing("qwen2-0.5b", shape)
    assert case.exit_code == ExitCode.DIVERGED
    assert "sizing shape qwen2-0.5b" in case.report
    assert "field workers[0].num_blocks" in case.report
    assert "vllm: 131928" in case.report and "impl: 131929" in case.report


def test_a_bug_in_vllms_num_blocks_fails_the_case(monkeypatch):
    """The same bug planted in the installed vLLM (its get_kv_cache_configs
    calls its module's get_kv_cache_config_from_groups) fails the case too."""
    from harness.backends.vllm_backend import vllm_sizing

    sizing = vllm_sizing()
    plan = sizing.get_kv_cache_config_from_groups

    def one_less(*args, **kwargs):
        out = plan(*args, **kwargs)
        out.num_blocks -= 1
        return out

    monkeypatch.setattr(sizing, "get_kv_cache_config_from_groups", one_less)
    case = run_sizing("gemma-3-27b", _shape("hybrid.yaml", "gemma-3-27b"))
    assert case.exit_code == ExitCode.DIVERGED
    assert "sizing shape gemma-3-27b" in case.report
    assert "field workers[0].num_blocks" in case.report


def test_a_wrong_tensor_plan_and_fitted_length_are_named(monkeypatch):
    """Bugs that leave num_blocks alone: a tensor offset, the fitted length."""
    import impl.kv_cache_planning as iplan

    plan = iplan.get_kv_cache_config_from_groups

    def shifted(*args, **kwargs):
        out = plan(*args, **kwargs)
        out.kv_cache_tensors[-1].offset += 1
        return out

    with monkeypatch.context() as m:
        m.setattr(iplan, "get_kv_cache_config_from_groups", shifted)
        case = run_sizing("packed", _shape("packed.yaml", "packed-full-and-window"))
    assert case.exit_code == ExitCode.DIVERGED and ".offset" in case.message
    fit = iplan._largest_fitting_length
    monkeypatch.setattr(iplan, "_largest_fitting_length", lambda *a: fit(*a) - 1)
    case = run_sizing("fit", _shape("edges.yaml", "auto-fit-shrinks-the-length"))
    assert case.exit_code == ExitCode.DIVERGED and "field max_model_len" in case.report


def test_the_gate_fails_on_the_planted_bug(monkeypatch, tmp_path):
    """End to end: `kvconform gate` over one corpus file, impl's num_blocks
    off by one: exit 1, the table row and JUnit name the shape."""
    import impl.kv_cache_planning as iplan
    from harness.gate.run import run_gate

    plan = iplan.get_kv_cache_config_from_groups

    def one_more(*args, **kwargs):
        out = plan(*args, **kwargs)
        out.num_blocks += 1
        return out

    monkeypatch.setattr(iplan, "get_kv_cache_config_from_groups", one_more)
    junit = tmp_path / "junit.xml"
    code = run_gate([str(ROOT / "traces/sizing/workers.yaml")], 0.0, 0, str(tmp_path / "f"),
                    str(junit), None, "1", workloads=False, attention=False)
    assert code == ExitCode.DIVERGED
    text = junit.read_text()
    assert 'classname="kvconform.sizing"' in text and "pp2-uneven-layers" in text
    assert "workers[0].num_blocks" in text


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("body,where", [
    ("shapes:\n  - name: a\n    layers: {kinds: {x: {kind: full_attention, block_size: 16,"
     "\n        sink_len: 4}}}\n", ":5: shapes[0].layers.kinds.x.sink_len: "),
    ("shapes:\n  - name: a\n    layers: {kinds: {x: {kind: nope, block_size: 16}}}\n",
     ":4: shapes[0].layers.kinds.x.kind: unknown attention kind"),
    ("shapes:\n  - name: a\n    layers: {kinds: {x: {block_size: 16, dtype: fp4}}}\n",
     ":4: shapes[0].layers.kinds.x.dtype: unknown dtype"),
    ("shapes:\n  - name: a\n    layers: {kinds: {x: {block_size: 16}}}\n"
     "    workers: [{memory: 1GiB, memory_blocks: 3}]\n", ":5: shapes[0].workers[0]: "),
    ("shapes:\n  - name: a\n    layers: {kinds: {x: {block_size: 16}}}\n"
     "    engine: {max_model_len: big}\n", ":5: shapes[0].engine.max_model_len: "),
])
def test_bad_input_is_one_line_naming_file_line_and_field(tmp_path, body, where):
    path = tmp_path / "bad.yaml"
    path.write_text("format: kvconform-sizing/1\n" + body)
    with pytest.raises(TraceError) as e:
        read_sizing_corpus(str(path))
    assert str(e.value).startswith(str(path) + where), str(e.value)
    assert e.value.exit_code == ExitCode.BAD_INPUT and "\n" not in str(e.value)


# -- the fuzz slice --------------------------------------------------------------------------


def test_the_sizing_fuzz_slice_compares_shapes_and_catches_a_bug(monkeypatch, tmp_path):
    from harness.fuzz.sizing import SizingFuzzConfig, fuzz_sizing
    from harness.fuzz.slices import load_kind_config

    fc = load_kind_config("model_shapes")
    assert isinstance(fc, SizingFuzzConfig)
    clean = fuzz_sizing(1e9, 5, fc, str(tmp_path), max_cases=150)
    assert clean.cases == 150 and clean.finding is None
    case = run_sizing_fuzz("fuzz[model_shapes,seed=5]", 0.0, 5, str(tmp_path), fc,
                           min_cases=20)
    assert case.exit_code == ExitCode.OK and case.mode.startswith("20 shapes")
    assert clean.refused < clean.cases  # most shapes get a plan to compare
    import impl.kv_cache_sizing as isizing

    bpb = isizing.bytes_per_block
    monkeypatch.setattr(isizing, "bytes_per_block", lambda *a: bpb(*a) + 1)
    import impl.kv_cache_planning as iplan

    monkeypatch.setattr(iplan, "bytes_per_block", lambda *a: bpb(*a) + 1)
    found = fuzz_sizing(1e9, 5, fc, str(tmp_path), max_cases=300)
    assert found.finding is not None and found.finding.exit_code == ExitCode.DIVERGED
    (written,) = tmp_path.glob("sizing-*.yaml")
    assert str(written) == found.path
    (shape,) = read_sizing_corpus(str(written))
    assert run_sizing("again", shape).exit_code == ExitCode.DIVERGED
    monkeypatch.undo()
    assert run_sizing("fixed", dataclasses.replace(shape)).exit_code == ExitCode.OK
