"""specs/trace.schema.json, compiled once for checking every line of a trace.

The schema file is the specification. Events are checked with validators
compiled from it (fastjsonschema, one per op: a trace of millions of events
must not pay an interpreted validator per line); the header, checked once, goes
through jsonschema for its detailed error paths.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema

from harness.core import kinds

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "specs" / "trace.schema.json"
FORMAT = "kvconform-trace/1"


class SchemaViolation(ValueError):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def load_schema() -> dict:
    """The schema file with its kinds as the kinds table has them now (a
    kind registered at run time included)."""
    return _schema_at(kinds.version())


@cache
def _schema_at(table_version: int) -> dict:
    with open(SCHEMA_PATH) as f:
        return derived(json.load(f))


def derived(schema: dict) -> dict:
    """The facts the schema file repeats from elsewhere, filled in: the kinds
    (the kinds table) and what each op's `expect` may name (its answer)."""
    return with_expect_fields(with_kinds(schema))


def with_expect_fields(schema: dict) -> dict:
    """An op's `expect` names fields of that op's answer only: an expectation
    of a field no answer has can never be met, and is the trace's mistake (bad
    input), not a divergence."""
    for op in schema["definitions"].values():
        props = op.get("properties", {})
        answer = props.get("answer", {}).get("properties")
        if "expect" in props and answer:
            props["expect"]["propertyNames"] = {"enum": sorted(answer)}
    return schema


def group_schema(schema: dict) -> dict:
    """The schema of one cache group."""
    return schema["definitions"]["cache"]["properties"]["groups"]["items"]


# A kind field the file does not describe (a registered kind's): a count of tokens.
_FIELD = {"type": "integer", "minimum": 1, "maximum": 16777216}


def _field_clause(field: str, kinds_with: list[str]) -> dict:
    """A group of one of `kinds_with` states `field`; no other group does."""
    kind = {"const": kinds_with[0]} if len(kinds_with) == 1 else {"enum": kinds_with}
    return {"if": {"properties": {"kind": kind}, "required": ["kind"]},
            "then": {"required": [field]},
            "else": {"not": {"required": [field]}}}


def _is_field_clause(clause: dict) -> bool:
    return list(clause.get("then", {})) == ["required"] and "not" in clause.get("else", {})


def with_kinds(schema: dict) -> dict:
    """`schema` with the group's kind enum, kind fields and their
    required-or-forbidden clauses derived from the kinds table (the file's
    clauses for other facts stay as written, in place)."""
    group = group_schema(schema)
    group["properties"]["kind"]["enum"] = list(kinds.names())
    by_field: dict[str, list[str]] = {}
    for row in kinds.rows():
        for f in row.fields:
            by_field.setdefault(f, []).append(row.name)
    for f, with_it in by_field.items():
        group["properties"].setdefault(f, {**_FIELD, "description": f"{', '.join(with_it)} "
                                           "groups (a registered kind's field)"})
    clauses = group["allOf"]
    at = next((i for i, c in enumerate(clauses) if _is_field_clause(c)), len(clauses))
    kept = [c for c in clauses if not _is_field_clause(c)]
    field_clauses = [_field_clause(f, k) for f, k in by_field.items()]
    group["allOf"] = kept[:at] + field_clauses + kept[at:]
    return schema


def write_schema(path: Path = SCHEMA_PATH) -> bool:
    """Rewrite the schema file from the kinds table (after adding a kind's
    row, specs/KINDS.md); True when it changed."""
    old = path.read_text()
    with open(path) as f:
        new = json.dumps(derived(json.load(f)), indent=2, ensure_ascii=False) + "\n"
    if new != old:
        path.write_text(new)
    return new != old


@cache
def event_ops() -> tuple[str, ...]:
    return tuple(load_schema()["definitions"]["event"]["properties"]["op"]["enum"])


@cache
def _event_validator(op: str):
    schema = load_schema()
    return fastjsonschema.compile(
        {"$ref": f"#/definitions/{op}", "definitions": schema["definitions"]}
    )


_DATA_PATH = re.compile(r"^data\.?")


def _field_of(name: str) -> str:
    """fastjsonschema's 'data.prompt[3]' -> 'prompt[3]'."""
    return _DATA_PATH.sub("", name) or "(event)"


def validate_event(obj: Any) -> None:
    """Raise SchemaViolation naming the offending field."""
    if not isinstance(obj, dict):
        raise SchemaViolation("(event)", f"must be a JSON object, not {type(obj).__name__}")
    op = obj.get("op")
    if op is None:
        raise SchemaViolation("op", "missing")
    if op not in event_ops():
        raise SchemaViolation("op", f"unknown op {op!r} (known: {', '.join(event_ops())})")
    try:
        _event_validator(op)(obj)
    except fastjsonschema.JsonSchemaValueException as e:
        message = e.message.removeprefix(e.name).strip() if e.name else e.message
        if e.rule == "additionalProperties":
            where = _field_of(e.name)
            value = e.value if isinstance(e.value, dict) else {}
            extra = sorted(set(value) - set(e.definition.get("properties", {})))
            if extra:
                where = extra[0] if where == "(event)" else f"{where}.{extra[0]}"
            raise SchemaViolation(where, f"unknown field for op '{op}'") from None
        if e.rule == "propertyNames":
            named = e.definition.get("propertyNames", {}).get("enum", [])
            value = e.value if isinstance(e.value, dict) else {}
            bad = sorted(set(value) - set(named))
            where = _field_of(e.name) + (f".{bad[0]}" if bad else "")
            raise SchemaViolation(where, f"op '{op}' answers with no such field (it has: "
                                  f"{', '.join(named)})") from None
        raise SchemaViolation(_field_of(e.name), message) from None


def validate_header(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise SchemaViolation("(header)", "must be a JSON object")
    if "format" not in obj:
        raise SchemaViolation(
            "format", "missing: the first line must be the trace header with \"format\""
        )
    if obj["format"] != FORMAT:
        raise SchemaViolation("format", f"unknown format {obj['format']!r} (supported: {FORMAT})")
    validator = jsonschema.Draft7Validator(
        {"$ref": "#/definitions/header", "definitions": load_schema()["definitions"]}
    )
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path) or "(header)"
        if error.validator == "additionalProperties":
            path = (path + "." if path != "(header)" else "") + "(unknown field)"
        raise SchemaViolation(path, error.message)
