"""Decoded event structs (harness/trace/typed_schema.py) -> harness events.

The structs are compiled with the event dataclasses' defaults (harness/core/events.py),
and each op gets one small generated function that builds its event from its
struct: a property becomes the event's field of the same name, as
harness/trace/codec.event_from_dict does for dicts. Nested objects become the
field's own type (LoRA, MMFeature, PromptEmbeds, ...), read off the
annotation, so a new event field needs no edit here. An op whose schema gives
a property its event lacks, or lets out a field its event needs, gets no
converter: the reader takes the dict path for it, which says what is wrong.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec

from harness.core.events import EVENT_TYPES
from harness.trace.typed_schema import Check, compile_event_structs

# Properties of every event that are not event fields.
RECORD_FIELDS = ("answer", "expect", "note")
UNSET = msgspec.UNSET
# Defaults a struct may share between all the events it decodes.
_IMMUTABLE = (type(None), bool, int, float, str, tuple, frozenset)


@dataclass(frozen=True, slots=True)
class FastEvents:
    decoder: msgspec.json.Decoder | None
    # struct type -> (op, check after decoding or None, struct -> event)
    table: dict[type, tuple[str, Check | None, Callable[[Any], Any]]]


def _plain(cls: type) -> Callable[[Any], Any]:
    """A decoded struct -> the dataclass `cls`, its unset fields defaulted."""
    def convert(v):
        if v is None:
            return v
        return cls(**{k: x for k in v.__struct_fields__ if (x := getattr(v, k)) is not UNSET})
    return convert


def _field_converter(hint: Any) -> Callable[[Any], Any] | None:
    """How a decoded value becomes a value of the annotated type; None: as is."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _field_converter(inner[0]) if len(inner) == 1 else None
    if origin is tuple:
        args = typing.get_args(hint)
        item = _field_converter(args[0]) if args else None
        if item is None:
            return tuple
        return lambda v: tuple(map(item, v))
    if dataclasses.is_dataclass(hint):
        return _plain(hint)
    return None


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING and isinstance(f.default, _IMMUTABLE)}


def _converter(op: str, struct: type) -> Callable[[Any], Any] | None:
    cls = EVENT_TYPES[op]
    fields = {f.name for f in dataclasses.fields(cls)}
    names = [n for n in struct.__struct_fields__ if n not in RECORD_FIELDS]
    defaults = dict(zip(struct.__struct_fields__[::-1], struct.__struct_defaults__[::-1]))
    if any(n not in fields or defaults.get(n) is UNSET for n in names) or any(
            n not in struct.__struct_fields__ for n in RECORD_FIELDS):
        return None
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    env: dict[str, Any] = {"cls": cls}
    args = []
    for name in names:
        conv = _field_converter(hints[name])
        if conv is None:
            args.append(f"{name}=s.{name}")
        else:
            env[f"c_{name}"] = conv
            args.append(f"{name}=c_{name}(s.{name})")
    src = f"def convert(s):\n    return cls({', '.join(args)})\n"
    exec(compile(src, f"<event converter {op}>", "exec"), env)
    return env["convert"]


@cache
def fast_events() -> FastEvents:
    """The decoder of the schema's event structs, and how each becomes an event."""
    compiled = compile_event_structs({op: _defaults(cls) for op, cls in EVENT_TYPES.items()})
    table = {}
    for op, struct in compiled.structs.items():
        conv = _converter(op, struct) if op in EVENT_TYPES else None
        if conv is not None:
            table[struct] = (op, compiled.checks.get(op), conv)
    return FastEvents(compiled.decoder if table else None, table)
