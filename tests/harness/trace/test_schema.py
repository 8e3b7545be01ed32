"""specs/trace.schema.json is a valid JSON Schema, the bundled traces satisfy it
(checked with jsonschema itself, the reference validator), and the compiled
per-event validators the reader uses agree with jsonschema."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from harness.trace.schema import SchemaViolation, load_schema, validate_event

TRACES = Path(__file__).resolve().parents[3] / "traces"


def test_schema_is_valid_draft7():
    jsonschema.Draft7Validator.check_schema(load_schema())


# (traces/sizing/ holds sizing corpora, no traces: specs/SIZING.md)
@pytest.mark.parametrize("path", sorted(p for p in TRACES.rglob("*.yaml")
                                        if p.parent.name != "sizing"), ids=lambda p: p.name)
def test_bundled_yaml_traces_validate(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), load_schema())


def _event_validator():
    schema = load_schema()
    return jsonschema.Draft7Validator({"$ref": "#/definitions/event",
                                       "definitions": schema["definitions"]})


SAMPLES = [
    {"op": "step"},
    {"op": "step", "req": "x"},
    {"op": "lookup"},
    {"op": "lookup", "req": "r", "answer": {"hit_tokens": -1, "block_ids": [[]]}},
    {"op": "allocate", "req": "r", "num_new_tokens": 3, "answer": {"refused": True}},
    {"op": "allocate", "req": "r", "num_new_tokens": 3, "answer": {"refused": False}},
    {"op": "allocate", "req": "r", "num_new_tokens": 3, "answer": {"block_ids": [[1]],
                                                                  "refused": True}},
    {"op": "add_request", "req": "r", "prompt": []},
    {"op": "add_request", "req": "r", "prompt": [1], "lora": {"name": "a", "int_id": 0}},
    {"op": "add_request", "req": "r", "prompt": [1], "mm": [{"identifier": "i", "offset": 0,
                                                            "length": 1}]},
    {"op": "checkpoint", "fields": ["free_queue", "usage"]},
    {"op": "checkpoint", "fields": ["bogus"]},
    {"op": "checkpoint", "answer": {"usage": 1.5}},
    {"op": "evict_blocks", "block_ids": []},
    {"op": "append_tokens", "req": "r", "tokens": [2**31]},
    {"op": "reset_prefix_cache", "answer": {"ok": True}, "note": "n"},
]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: json.dumps(o)[:60])
def test_compiled_validator_agrees_with_jsonschema(obj):
    reference_ok = _event_validator().is_valid(obj)
    try:
        validate_event(obj)
        ours_ok = True
    except SchemaViolation:
        ours_ok = False
    assert ours_ok == reference_ok
