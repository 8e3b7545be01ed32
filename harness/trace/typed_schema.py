"""specs/trace.schema.json compiled to msgspec types: the reader's fast path.

Each event definition becomes a msgspec Struct, tagged by its `op`, unknown
fields forbidden, with the schema's bounds as msgspec constraints, so that one
call in C decodes a line and checks it. The schema stays the specification:
this module reads it and names no op and no field. What msgspec cannot say
(uniqueItems, minProperties/maxProperties, the required keys of a free-form
object) is checked right after decoding; an op whose definition uses any other
keyword gets no struct and takes the compiled-validator path.

The fast path may only be as strict as the schema, or stricter, never more
permissive: whatever it rejects goes through harness/trace/schema.py, which
accepts it or names the field (tests/harness/trace/test_typed_schema.py holds
the two together on every sample and bad-input case).
"""

from __future__ import annotations

import keyword
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import msgspec

from harness.trace.schema import event_ops, load_schema

UNSET = msgspec.UNSET
# A check run after decoding: True when the value satisfies what msgspec could
# not express.
Check = Callable[[Any], bool]
# Keywords that say nothing about validity.
_ANNOTATIONS = frozenset({"description", "default", "title", "$comment", "examples"})
_SUPPORTED = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "uniqueItems", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "enum", "const",
    "minProperties", "maxProperties", "$ref", "propertyNames",
}


class Unsupported(Exception):
    """A schema construct this compiler does not translate."""


@dataclass(frozen=True, slots=True)
class EventStructs:
    """The compiled event definitions."""

    # op -> its Struct (ops missing here take the validator path).
    structs: dict[str, type]
    # op -> check after decoding, for the ops that need one.
    checks: dict[str, Check]
    # op -> why it has no struct.
    unsupported: dict[str, str]
    decoder: msgspec.json.Decoder | None


def _ref(schema: dict, definitions: dict) -> dict:
    ref = schema["$ref"]
    if not ref.startswith("#/definitions/") or len(schema) != 1:
        raise Unsupported(f"$ref {ref!r}")
    return definitions[ref.removeprefix("#/definitions/")]


def _all(checks: list[Check]) -> Check | None:
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    first, *rest = checks

    def every(v) -> bool:
        if not first(v):
            return False
        for c in rest:
            if not c(v):
                return False
        return True
    return every


def _field_check(name: str, check: Check) -> Check:
    get = operator.attrgetter(name)
    return lambda v: (x := get(v)) is UNSET or check(x)


# A pattern that is one character class repeated, anchored at both ends: a
# list of such strings is checked in one match over their concatenation.
_ONE_CLASS = re.compile(r"\^(\[(?:[^\]\\]|\\.)+\])([+*])\$")


def _strings_check(pattern: str) -> Check | None:
    m = _ONE_CLASS.fullmatch(pattern)
    if m is None:
        return None
    whole = re.compile(f"{m.group(1)}*")
    if m.group(2) == "+":
        return lambda v: all(v) and whole.fullmatch("".join(v)) is not None
    return lambda v: whole.fullmatch("".join(v)) is not None


def _scalar(kind: str, s: dict) -> Any:
    if kind == "integer":
        meta = dict(ge=s.get("minimum"), le=s.get("maximum"),
                    gt=s.get("exclusiveMinimum"), lt=s.get("exclusiveMaximum"))
        meta = {k: v for k, v in meta.items() if v is not None}
        return Annotated[int, msgspec.Meta(**meta)] if meta else int
    if kind == "number":
        meta = dict(ge=s.get("minimum"), le=s.get("maximum"),
                    gt=s.get("exclusiveMinimum"), lt=s.get("exclusiveMaximum"))
        meta = {k: v for k, v in meta.items() if v is not None}
        return Annotated[float, msgspec.Meta(**meta)] if meta else float
    if kind == "string":
        meta = dict(min_length=s.get("minLength"), max_length=s.get("maxLength"),
                    pattern=s.get("pattern"))
        meta = {k: v for k, v in meta.items() if v is not None}
        return Annotated[str, msgspec.Meta(**meta)] if meta else str
    if kind == "boolean":
        return bool
    if kind == "null":
        return None
    raise Unsupported(f"type {kind!r}")


class _Compiler:
    def __init__(self, definitions: dict, prefix: str,
                 defaults: Mapping[str, Any] | None = None) -> None:
        self.definitions = definitions
        self.prefix = prefix
        # What an absent optional property of the tagged (event) struct
        # decodes to; UNSET where none is given.
        self.defaults = defaults or {}
        self.count = 0

    def compile(self, s: dict, *, tag: str | None = None) -> tuple[Any, Check | None]:
        """(msgspec type, check after decoding or None) for a JSON Schema."""
        if "$ref" in s:
            return self.compile(_ref(s, self.definitions), tag=tag)
        unknown = set(s) - _SUPPORTED
        if unknown:
            raise Unsupported(f"keyword(s) {sorted(unknown)}")
        if "const" in s:
            return self._literal([s["const"]])
        if "enum" in s:
            return self._literal(s["enum"])
        kinds = s.get("type")
        if kinds is None:
            raise Unsupported("a schema without a type")
        if isinstance(kinds, list):
            parts = [self._one(k, s, None) for k in kinds]
            types = [t for t, _ in parts]
            checks = [c for _, c in parts if c is not None]
            if len(checks) > 1:
                raise Unsupported("checks on more than one type of a union")
            inner = checks[0] if checks else None
            check = None if inner is None else (lambda v: v is None or inner(v))
            return Union[tuple(types)], check  # noqa: UP007 - built at run time
        return self._one(kinds, s, tag)

    def _literal(self, values: list) -> tuple[Any, Check | None]:
        if all(isinstance(v, str) for v in values) or all(
            isinstance(v, int) and not isinstance(v, bool) for v in values
        ) or all(v is True for v in values):
            return Literal[tuple(values)], None
        raise Unsupported(f"const/enum of {values!r}")

    def _one(self, kind: str, s: dict, tag: str | None) -> tuple[Any, Check | None]:
        if kind == "array":
            return self._array(s)
        if kind == "object":
            return self._object(s, tag)
        return _scalar(kind, s), None

    def _array(self, s: dict) -> tuple[Any, Check | None]:
        items = s.get("items")
        if isinstance(items, list):
            return self._positional(s, items)
        joined = None
        if items is not None and items.get("type") == "string" and "pattern" in items:
            # Matched once for the whole list rather than once per string.
            joined = _strings_check(items["pattern"])
            if joined is not None:
                items = {k: v for k, v in items.items() if k != "pattern"}
        item, item_check = self.compile(items) if items is not None else (Any, None)
        meta = {k: v for k, v in (("min_length", s.get("minItems")),
                                  ("max_length", s.get("maxItems"))) if v is not None}
        t = list[item]
        if meta:
            t = Annotated[t, msgspec.Meta(**meta)]
        checks: list[Check] = []
        if joined is not None:
            checks.append(joined)
        if item_check is not None:
            checks.append(lambda v: all(item_check(x) for x in v))
        if s.get("uniqueItems"):
            if item not in (str, int, bool) and getattr(item, "__origin__", None) is not Literal:
                raise Unsupported("uniqueItems over items that are not scalars")
            checks.append(lambda v: len(set(v)) == len(v))
        return t, _all(checks)

    def _positional(self, s: dict, items: list) -> tuple[Any, Check | None]:
        """An array whose i-th item has the i-th schema (a fixed-length
        record such as [req, start, count]): a msgspec tuple, when its length
        is fixed too."""
        if s.get("minItems") != len(items) or s.get("maxItems") != len(items) or (
                s.get("additionalItems") not in (None, False)):
            raise Unsupported("positional items of a length that is not fixed")
        parts = [self.compile(item) for item in items]
        checks = [(i, c) for i, (_, c) in enumerate(parts) if c is not None]
        t = tuple[tuple(t for t, _ in parts)]
        if not checks:
            return t, None
        return t, lambda v: all(c(v[i]) for i, c in checks)

    def _object(self, s: dict, tag: str | None) -> tuple[Any, Check | None]:
        props = s.get("properties")
        lo, hi = s.get("minProperties"), s.get("maxProperties")
        extra = s.get("additionalProperties", True)
        if props is None and extra is not False:
            # A free-form object (values of one schema, when it gives one),
            # with its required keys.
            required = tuple(s.get("required", ()))
            checks: list[Check] = []
            value: Any = Any
            if isinstance(extra, dict):
                value, value_check = self.compile(extra)
                if value_check is not None:
                    checks.append(lambda v: all(value_check(x) for x in v.values()))
            if required:
                checks.append(lambda v: all(k in v for k in required))
            if lo is not None:
                checks.append(lambda v: len(v) >= lo)
            if hi is not None:
                checks.append(lambda v: len(v) <= hi)
            if "propertyNames" in s:
                names = s["propertyNames"]
                if set(names) != {"enum"}:
                    raise Unsupported("propertyNames other than an enum")
                allowed = frozenset(names["enum"])
                checks.append(lambda v: allowed.issuperset(v))
            return dict[str, value], _all(checks)
        if s.get("additionalProperties", True) is not False:
            # Unknown keys would be dropped by a Struct, and the answer with them.
            raise Unsupported("an object with properties that allows other keys")
        props = props or {}
        required = set(s.get("required", ()))
        if tag is not None:
            required.discard("op")
        fields = []
        checks = []
        for name, sub in props.items():
            if tag is not None and name == "op":
                continue  # the tag
            if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
                raise Unsupported(f"property name {name!r}")
            t, check = self.compile(sub)
            default = self.defaults.get(name, UNSET) if tag is not None else UNSET
            if name in required:
                fields.append((name, t))
            elif default is UNSET:
                fields.append((name, Union[t, type(UNSET)], UNSET))  # noqa: UP007
            else:
                fields.append((name, t, default))
            if check is not None:
                checks.append(_field_check(name, check))
        missing = required - set(props)
        if missing:
            raise Unsupported(f"required but not described: {sorted(missing)}")
        names = tuple(n for n in props if not (tag is not None and n == "op"))
        lo_, hi_ = lo or 0, len(names) if hi is None else hi
        if lo_ > len(required & set(names)) or hi_ < len(names):
            if not names:
                raise Unsupported("minProperties on an object with no properties")
            if len(names) == 1:
                names = names + names  # attrgetter of one name gives no tuple
                lo_, hi_ = 2 * lo_, 2 * hi_
            present = operator.attrgetter(*names)
            total = len(names)
            checks.append(lambda v: lo_ <= total - present(v).count(UNSET) <= hi_)
        self.count += 1
        options: dict[str, Any] = dict(forbid_unknown_fields=True)
        if tag is not None:
            options.update(tag=tag, tag_field="op")
        # Required fields first: msgspec wants defaults last.
        fields.sort(key=lambda f: len(f) == 3)
        struct = msgspec.defstruct(f"{self.prefix}{self.count}", fields, **options)
        return struct, _all(checks)


def compile_event_structs(defaults: Mapping[str, Mapping[str, Any]] | None = None
                          ) -> EventStructs:
    """Every event definition of the schema as a struct; `defaults[op][name]`
    is what an absent optional property of that op decodes to (else UNSET)."""
    definitions = load_schema()["definitions"]
    defaults = defaults or {}
    structs: dict[str, type] = {}
    checks: dict[str, Check] = {}
    unsupported: dict[str, str] = {}
    for op in event_ops():
        compiler = _Compiler(definitions, f"{op}_", defaults.get(op))
        try:
            struct, check = compiler.compile(definitions[op], tag=op)
        except Unsupported as e:
            unsupported[op] = str(e)
            continue
        structs[op] = struct
        if check is not None:
            checks[op] = check
    decoder = None
    if structs:
        union = Union[tuple(structs.values())] if len(structs) > 1 else next(  # noqa: UP007
            iter(structs.values()))
        decoder = msgspec.json.Decoder(union)
    return EventStructs(structs, checks, unsupported, decoder)
