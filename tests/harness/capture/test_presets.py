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
    first = [r for _ in range(20) for r in chat.arrivals()]
    system = chat.pieces["system"][0]
    assert first and all(r.prompt[: len(system)] == system for r in first)
    # A later turn resends the conversation, the answer included.
    turn = first[0]
    chat.finished(turn.req_id, turn.prompt + [7, 7, 7])
    later = [r for _ in range(20, 200) for r in chat.arrivals()]
    assert any(r.prompt[: len(turn.prompt) + 3] == turn.prompt + [7, 7, 7] for r in later)

    lora = SyntheticWorkload(load_preset("lora-and-salts"))
    reqs = [r for _ in range(200) for r in lora.arrivals()]
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
    ("seed: 1\n", ":1: kind:", "missing"),
    ("kind: chat\nnope: 1\n", ":2: nope:", "unknown field (known: admin, chat,"),
    ("kind: chat\nrequests:\n  output_tokens: many\n", ":3: requests.output_tokens:",
     "a length is an int, [lo, hi] or {lognormal"),
    ("kind: chat\nrequests:\n  output_tokens: [1, 2, 3]\n", ":3: requests.output_tokens:",
     "a range is [lo, hi]"),
    ("kind: chat\nrequests:\n  output_tokens: {lognormal: [1], min: 2}\n",
     ":3: requests.output_tokens.lognormal:", "must be [mu, sigma]"),
    ("kind: chat\nrequests:\n  output_tokens: {lognormal: [1, 2], min: 9, max: 3}\n",
     ":3: requests.output_tokens.max:", "must be in [9, 16777216], not 3"),
    ("kind: chat\nrequests:\n  output_tokens: 0\n", ":3: requests.output_tokens:",
     "must be in [1, 16777216], not 0"),
    ("kind: rag\nrag:\n  documents: 0\n", ":3: rag.documents:", "must be in [1, 65536], not 0"),
    ("kind: chat\nrequests:\n  lora: {fraction: 0.5, values: []}\n",
     ":3: requests.lora.values:", "must be a non-empty list"),
    ("kind: chat\nrequests:\n  abort_probability: 2\n", ":3: requests.abort_probability:",
     "must be in [0.0, 1.0], not 2"),
    ("kind: chat\nengine:\n  kv_events: 1\n", ":3: engine.kv_events:",
     "must be true or false, not 1"),
    ("kind: chat\nengine: 5\n", ":2: engine:", "must be a mapping"),
    ("kind: chat\nadmin:\n  reset_prefix_cache:\n    - {step: 3, when: now}\n",
     ":4: admin.reset_prefix_cache[0].when:", "unknown field"),
    ("kind: chat\nengine: {block_size: 64, max_model_len: 32}\n", ":2: engine.block_size:",
     "must not exceed max_model_len"),
    # The first problem in the file's order is the one reported.
    ("kind: chat\nseed: -1\nrequests:\n  count: many\n", ":2: seed:", "must be in"),
])
def test_bad_preset_is_one_line_naming_file_line_and_field(tmp_path, text, where, message):
    path = tmp_path / "bad.workload"
    path.write_text(text)
    with pytest.raises(PresetError) as e:
        load_preset(str(path))
    assert str(e.value).startswith(f"{path}{where}") and message in str(e.value)


def test_a_length_floor_of_zero_admits_zero(tmp_path):
    path = tmp_path / "zero.workload"
    path.write_text("kind: rag\nrag:\n  docs_per_request: 0\n  system_prompt_tokens: [0, 4]\n")
    p = load_preset(str(path))
    assert (p.shape.docs_per_request.lo, p.shape.system_prompt_tokens.hi) == (0, 4)


def test_the_schema_names_exactly_the_dataclass_fields():
    """specs/workload.schema.json and the dataclasses holding the defaults
    cannot drift apart."""
    import dataclasses
    import json

    from harness.capture.presets import (
        _SHAPES,
        SCHEMA_PATH,
        EngineSpec,
        Preset,
        RequestsSpec,
        ResetAt,
    )
    from impl.block_hash import HASH_FUNCTIONS

    schema = json.loads(SCHEMA_PATH.read_text())
    props = schema["properties"]

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    sections = {"engine": EngineSpec, "requests": RequestsSpec, **_SHAPES}
    for section, cls in sections.items():
        assert set(props[section]["properties"]) == names(cls), section
    reset = props["admin"]["properties"]["reset_prefix_cache"]["items"]["properties"]
    assert set(reset) == names(ResetAt)
    top = set(props) - set(sections) - {"admin"}
    assert top <= names(Preset)
    assert props["kind"]["enum"] == list(KINDS)
    assert props["engine"]["properties"]["hash_algo"]["enum"] == list(HASH_FUNCTIONS)


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
