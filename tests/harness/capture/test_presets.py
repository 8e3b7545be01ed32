"""Workload presets: every bundled one loads; bad ones are one line naming file:line."""

import pytest

from harness.capture.errors import PresetError
from harness.capture.presets import KINDS, load_preset, preset_names
from harness.capture.synth import SyntheticWorkload

from .conftest import capture_cli

# The list: one preset each.
EXPECTED = {"multi-turn-chat", "few-shot", "rag-shared-documents", "sharegpt-lengths",
            "tight-memory-preemption", "long-generations", "prefix-cache-reset",
            "lora-and-salts", "chunked-prefill-small-budget"}


def test_every_listed_workload_has_a_preset():
    assert EXPECTED <= set(preset_names())
    for name in preset_names():
        p = load_preset(name)
        assert p.kind in KINDS and p.description and p.requests.count > 0


def test_presets_shape_the_traffic_as_described():
    chat = SyntheticWorkload(load_preset("multi-turn-chat"))
    first = [r for step in range(20) for r in chat.arrivals(step)]
    system = chat.pieces["system"][0]
    assert first and all(r.prompt[: len(system)] == system for r in first)
    # A later turn resends the conversation, the answer included.
    turn = first[0]
    chat.finished(turn.req_id, turn.prompt + [7, 7, 7])
    later = [r for step in range(20, 200) for r in chat.arrivals(step)]
    assert any(r.prompt[: len(turn.prompt) + 3] == turn.prompt + [7, 7, 7] for r in later)

    lora = SyntheticWorkload(load_preset("lora-and-salts"))
    reqs = [r for step in range(200) for r in lora.arrivals(step)]
    assert {r.lora for r in reqs} > {None} and {r.cache_salt for r in reqs} > {None}
    assert load_preset("prefix-cache-reset").resets
    assert load_preset("chunked-prefill-small-budget").engine.max_num_batched_tokens <= 128


@pytest.mark.parametrize("text, where, message", [
    ("kind: chat\nengine:\n  block_sise: 16\n", ":3: engine.block_sise:", "unknown field"),
    ("kind: chat\nrequests:\n  count: many\n", ":3: requests.count:", "must be an integer"),
    ("kind: chat\nrequests:\n  output_tokens: [9, 2]\n", ":3: requests.output_tokens:",
     "is empty"),
    ("kind: poem\n", ":1: kind:", "must be one of"),
    ("kind: rag\nchat: {turns: 2}\n", ":2: chat:", "section for kind"),
    ("kind: chat\nengine: {hash_algo: md5}\n", ":2: engine.hash_algo:", "must be one of"),
    ("kind: chat\n  bad: [\n", ":2: (yaml):", ""),
])
def test_bad_preset_is_one_line_naming_file_line_and_field(tmp_path, text, where, message):
    path = tmp_path / "bad.workload"
    path.write_text(text)
    with pytest.raises(PresetError) as e:
        load_preset(str(path))
    assert str(e.value).startswith(f"{path}{where}") and message in str(e.value)


def test_bad_preset_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.workload"
    path.write_text("kind: chat\nseed: -1\n")
    assert capture_cli(["capture", "scheduler", "--preset", str(path),
                        "--out", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvconform: {path}:2: seed: must be in [0, {1 << 62}], not -1"]
    assert capture_cli(["capture", "scheduler", "--preset", "no-such-preset",
                        "--out", str(tmp_path / "t.jsonl")]) == 2
    assert "no such preset" in capsys.readouterr().err
