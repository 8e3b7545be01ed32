"""Negative controls of the attention differential (issue 14 item 3): every
mutant of impl's attention path (mutants.py) must be reported as a divergence
by check_attention, what `kvconform diff` runs, on a trace recorded from the
real engine with its tensors sidecar (engine-multi-turn-chat; the window
mutant on engine-hybrid-sliding-window, the recorded trace with a sliding
window) and on a seeded 4k-context trace (seeded_traces.py); and with no
mutant the traces are conformant. A mutant names the checks allowed to
catch it, so a catch by accident (say, a crash) does not count.

The differential runs without vLLM here (impl's bugs show against the
reference and the ledger; vLLM's ops add nothing to these catches) and stops
at the first divergence; the CLI's default of 16 batches bounds each run.
"""

from pathlib import Path

import pytest

from harness.attention.differential import AttentionOptions, check_attention

from .mutants import MUTANTS
from .seeded_traces import write_long_context_trace

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "traces/golden/v0.32"
# Recorded engine traces (16 steps of recorded tensors each): the multi-turn
# chat reaches contexts of several KV tiles; the hybrid one is the recorded
# trace with a sliding-window group (its contexts stay within one tile).
RECORDED = GOLDEN / "engine-multi-turn-chat.jsonl"
RECORDED_WINDOW = GOLDEN / "engine-hybrid-sliding-window.jsonl"
OPTIONS = AttentionOptions(vllm=False, max_batches=16)

OUTPUTS = {"impl~reference", "impl~recorded"}
CAUGHT_BY = {
    "block-table-swap": {"block table"},
    "causal-off-by-one": OUTPUTS,
    "window-off-by-one": OUTPUTS | {"block content"},
    "reshape-wrong-slot": {"cache write", "block content"},
    "gqa-head-mapping": OUTPUTS,
    "tile-last-dropped": OUTPUTS,
    "tile-no-rescale": OUTPUTS,
}


@pytest.fixture(scope="module")
def seeded_trace(tmp_path_factory):
    return write_long_context_trace(str(tmp_path_factory.mktemp("long") / "long.jsonl"))


def _trace(which, seeded_trace, mutant=None):
    if which == "seeded":
        return seeded_trace
    if which == "recorded-window" or mutant == "window-off-by-one":
        return str(RECORDED_WINDOW)
    return str(RECORDED)


def test_every_mutant_has_its_catching_checks():
    assert set(CAUGHT_BY) == set(MUTANTS)


@pytest.mark.parametrize("which", ["recorded", "recorded-window", "seeded"])
def test_without_a_mutant_the_traces_are_conformant(which, seeded_trace):
    o = check_attention(_trace(which, seeded_trace), OPTIONS)
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    if which.startswith("recorded"):
        assert o.recorded_batches == o.num_batches == 16


@pytest.mark.parametrize("which", ["recorded", "seeded"])
@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_mutant_is_caught(name, which, seeded_trace, monkeypatch, tmp_path):
    MUTANTS[name].apply(monkeypatch, tmp_path)
    o = check_attention(_trace(which, seeded_trace, name), OPTIONS)
    assert o.exit_code == 1, f"{name} missed on the {which} trace:\n" + \
        "\n".join(o.summary_lines())
    assert o.divergence.check in CAUGHT_BY[name], o.divergence.describe(o.path)


@pytest.mark.vllm
def test_kvconform_diff_reports_the_block_table_swap(monkeypatch, tmp_path, capsys):
    """The issue's case end to end: with impl's block table swapping two
    entries, `kvconform diff` on the recorded engine trace exited 0; now 1."""
    from harness.cli.main import main

    MUTANTS["block-table-swap"].apply(monkeypatch, tmp_path)
    code = main(["diff", str(RECORDED)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "block table: request" in out and "the trace's answers give block" in out
