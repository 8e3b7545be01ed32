"""The reader's fast path (harness/trace/typed_schema.py, struct_events.py) and
the schema agree: every line jsonschema (the reference validator) accepts, the
fast path accepts and turns into the very event, answer, expectation and note
that the plain path (codec.event_from_dict) gives; every line jsonschema
rejects, the fast path rejects too (the plain path then names the field). Checked
on every bundled trace line, on every sample and bad-input case of the trace
tests, and on mutations of each op's valid lines; and a compiler that drops a
constraint is caught (negative control)."""

import copy
import json
from pathlib import Path

import jsonschema
import msgspec
import pytest
import yaml

from harness.trace.codec import event_from_dict
from harness.trace.schema import load_schema
from harness.trace.struct_events import fast_events
from harness.trace.typed_schema import compile_event_structs

from . import test_reader, test_schema

TRACES = Path(__file__).resolve().parents[3] / "traces"


def _reference():
    schema = load_schema()
    return jsonschema.Draft7Validator({"$ref": "#/definitions/event",
                                       "definitions": schema["definitions"]})


def fast_accepts(raw: bytes, fast=None) -> bool:
    fast = fast or fast_events()
    try:
        s = fast.decoder.decode(raw)
        _, check, convert = fast.table[s.__class__]
        if check is not None and not check(s):
            return False
        convert(s)
    except (msgspec.MsgspecError, KeyError, ValueError, TypeError, RecursionError):
        return False
    return True


def bundled_events() -> list[dict]:
    out = []
    for path in sorted(TRACES.rglob("*")):
        if path.suffix == ".jsonl":
            lines = path.read_text().splitlines()[1:]
            out += [json.loads(line) for line in lines if line.strip()]
        elif path.suffix in (".yaml", ".yml"):
            doc = yaml.safe_load(path.read_text())
            if isinstance(doc, dict) and "events" in doc:
                out += doc["events"] or []
    return out


def _mutations(obj: dict) -> list[dict]:
    """Each field replaced by values of the wrong type, out of range, or
    missing; an unknown field; the answer's fields the same way."""
    wrong = [None, True, -1, 2**31, 2**64, 1.5, "x", "", [], [-1], ["x"], {}, {"a": 1}, [[]],
             [[-1]], [[2**40]]]
    out = []
    for key in obj:
        if key == "op":
            continue
        missing = dict(obj)
        del missing[key]
        out.append(missing)
        for w in wrong:
            out.append({**obj, key: w})
    out.append({**obj, "unknown_field": 1})
    answer = obj.get("answer")
    if isinstance(answer, dict):
        for key in answer:
            for w in wrong:
                out.append({**obj, "answer": {**answer, key: w}})
        out.append({**obj, "answer": {**answer, "bogus": 1}})
    return out


def _shapes_of_each_op() -> list[dict]:
    """A bundled line of each shape (its keys and its answer's keys) of each op."""
    seen = {}
    for e in bundled_events():
        answer = e.get("answer")
        shape = (e["op"], tuple(sorted(e)),
                 tuple(sorted(answer)) if isinstance(answer, dict) else None)
        seen.setdefault(shape, e)
    return list(seen.values())


def event_literals_in_tests() -> list[dict]:
    """Every dict literal with an "op" key written anywhere under tests/ (the
    bad-input cases of every test file among them)."""
    import ast

    out = []
    for path in sorted((TRACES.parent / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value == "op" for k in node.keys):
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue  # built from names: not a literal
                if isinstance(value.get("op"), str):
                    out.append(value)
    return out


def corpus() -> list[dict]:
    objs = list(test_schema.SAMPLES) + event_literals_in_tests()
    for spec, *_ in test_reader.CASES.values():
        if isinstance(spec, tuple):
            objs += [o for o in spec if isinstance(o, dict) and "format" not in o]
    for e in _shapes_of_each_op():
        objs += _mutations(e)
    return objs


def test_every_op_of_the_schema_has_a_struct_and_a_converter():
    compiled = compile_event_structs()
    assert compiled.unsupported == {}
    ops = load_schema()["definitions"]["event"]["properties"]["op"]["enum"]
    assert sorted(op for op, _, _ in fast_events().table.values()) == sorted(ops)


def test_bundled_lines_read_the_same_both_ways():
    fast = fast_events()
    events = bundled_events()
    assert len(events) > 500
    for obj in events:
        raw = json.dumps(obj).encode()
        s = fast.decoder.decode(raw)
        _, check, convert = fast.table[s.__class__]
        assert check is None or check(s), obj
        assert convert(s) == event_from_dict(obj), obj
        answer = None if s.answer is msgspec.UNSET else msgspec.to_builtins(s.answer)
        assert answer == obj.get("answer"), obj
        assert (None if s.expect is msgspec.UNSET else s.expect) == obj.get("expect")
        assert (None if s.note is msgspec.UNSET else s.note) == obj.get("note")


def test_the_corpus_holds_the_bad_input_cases_of_every_test_file():
    literals = event_literals_in_tests()
    assert {"op": "teleport", "req": "r"} in literals  # test_reader's unknown op
    assert {"op": "take_block_copies", "answer": {"copies": [[3]]}} in literals  # kinds
    assert len(literals) > 30


def test_fast_path_and_jsonschema_agree_on_every_case():
    reference = _reference()
    objs = corpus()
    assert len(objs) > 2000
    disagree = []
    for obj in objs:
        raw = json.dumps(obj).encode()
        if fast_accepts(raw) != reference.is_valid(obj):
            disagree.append(obj)
    assert not disagree, disagree[:5]


def test_fast_path_never_accepts_what_the_schema_rejects_in_the_pathological_cases():
    reference = _reference()
    lines = [b'{"op":"step","answer":{}}', b'{"op":"step","answer":{"x":1}}',
             b'{"op":"allocate","req":"r","num_new_tokens":1,"answer":{}}',
             b'{"op":"allocate","req":"r","num_new_tokens":1.0}',
             b'{"op":"checkpoint","fields":["usage","usage"]}',
             b'{"op":"checkpoint","answer":{"events":[{"type":"BlockStored"},{}]}}',
             b'{"op":"checkpoint","answer":{"free_queue_digest":"0123456789abcdeg"}}',
             b'{"op":"add_request","req":"r","prompt":[1],"answer":{"block_hashes":["ab\\n"]}}',
             b'{"op":"add_request","req":"r","prompt":[1],"answer":{"block_hashes":[""]}}',
             b'{"op":"add_request","req":"r","prompt":[1],"answer":{"block_hashes":["AB"]}}',
             b'{"op":"lookup","req":"' + b"r" * 257 + b'"}']
    for raw in lines:
        if fast_accepts(raw):
            assert reference.is_valid(json.loads(raw)), raw


def test_a_dropped_constraint_is_caught(monkeypatch):
    """Negative control: a compiler that forgets integer bounds accepts what
    the schema rejects, and the agreement check says so."""
    import harness.trace.typed_schema as ts

    real = ts._scalar

    def no_bounds(kind, s):
        return int if kind == "integer" else real(kind, s)

    monkeypatch.setattr(ts, "_scalar", no_bounds)
    loose = fast_events.__wrapped__()
    reference = _reference()
    assert any(fast_accepts(json.dumps(o).encode(), loose) != reference.is_valid(o)
               for o in corpus())


@pytest.mark.parametrize("mutate", ["drop_maxlength", "allow_unknown"])
def test_other_loosened_compilers_are_caught(monkeypatch, mutate):
    import harness.trace.typed_schema as ts

    schema = copy.deepcopy(load_schema())
    if mutate == "drop_maxlength":
        for d in schema["definitions"].values():
            for p in d.get("properties", {}).values():
                p.pop("maxLength", None)
    else:
        for d in schema["definitions"].values():
            d.pop("additionalProperties", None)
    monkeypatch.setattr(ts, "load_schema", lambda: schema)
    loose = fast_events.__wrapped__()
    reference = _reference()
    if mutate == "allow_unknown":
        # Objects that admit unknown keys cannot be structs: those ops take
        # the validator's path, which stays exact.
        assert loose.decoder is None or len(loose.table) < len(fast_events().table)
        return
    objs = corpus() + [{"op": "lookup", "req": "r" * 257}]
    assert any(fast_accepts(json.dumps(o).encode(), loose) != reference.is_valid(o)
               for o in objs)
