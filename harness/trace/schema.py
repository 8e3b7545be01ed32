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

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "specs" / "trace.schema.json"
FORMAT = "kvconform-trace/1"


class SchemaViolation(ValueError):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@cache
def load_schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return json.load(f)


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
