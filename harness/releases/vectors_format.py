"""The golden vectors' files (specs/VECTORS.md): names, writing and reading,
and the KV event wire layout a file documents, applied both ways.

Nothing here imports vllm: the producer (vectors_produce.py, inside a
release's process) writes the files, and the checker and the diff read them
with only what the files say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = "kvconform-vectors/1"
HASHES = "hashes.json"
EVENTS = "events.json"
FILES = (HASHES, EVENTS)


class VectorsError(ValueError):
    """A vectors folder or file that cannot be read (bad input)."""


def dump(doc: dict) -> str:
    """JSON with one top-level key per line and one list item per line: small,
    stable (the same inputs give the same bytes) and readable in a diff."""
    lines = ["{"]
    items = list(doc.items())
    for i, (key, value) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        head = json.dumps(key) + ": "
        if isinstance(value, list) and value:
            lines.append(head + "[")
            lines += [_compact(v) + ("," if j < len(value) - 1 else "")
                      for j, v in enumerate(value)]
            lines.append("]" + end)
        else:
            lines.append(head + _compact(value) + end)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def write(folder: Path, name: str, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(dump(doc))
    return path


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise VectorsError(f"{path}:1: file: cannot read ({e.strerror})") from None
    except ValueError as e:
        line = getattr(e, "lineno", 1)
        raise VectorsError(f"{path}:{line}: json: {str(e).split(':')[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise VectorsError(f"{path}:1: format: not {FORMAT}")
    return doc


def hexed(value: Any) -> Any:
    """A decoded msgpack value as JSON: bytes as hex, tuples as lists."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [hexed(v) for v in value]
    if isinstance(value, dict):
        return {k: hexed(v) for k, v in value.items()}
    return value


# -- the wire layout -------------------------------------------------------------
#
# A file's "wire" object says how events are laid out: "layout" ("array": a
# list whose first item is the tag; "map": an object whose `tag_field` holds
# it), and per event type its fields in order, each {"name", "required"}.
# vLLM's structs leave fields at their default (None) out of a map; an array
# holds every field.


def event_fields(wire: dict, type_name: str) -> list[dict]:
    try:
        return wire["events"][type_name]
    except KeyError:
        raise VectorsError(f"wire: no event type {type_name!r}") from None


def named_event(wire: dict, raw: Any) -> dict:
    """One decoded event -> {"type": tag, field: value} with null fields left
    out (the form kvconform's traces hold), read with the file's layout."""
    if wire["layout"] == "map":
        if not isinstance(raw, dict):
            raise VectorsError(f"expected a map-layout event, got {_kind(raw)}")
        tag = raw.get(wire["tag_field"])
        names = {f["name"] for f in event_fields(wire, tag)}
        values = {k: v for k, v in raw.items() if k != wire["tag_field"]}
        unknown = sorted(set(values) - names)
        if unknown:
            raise VectorsError(f"{tag}: unknown field {unknown[0]!r}")
    else:
        if not isinstance(raw, list) or not raw:
            raise VectorsError(f"expected an array-layout event, got {_kind(raw)}")
        tag = raw[0]
        fields = event_fields(wire, tag)
        if len(raw) - 1 > len(fields):
            raise VectorsError(f"{tag}: {len(raw) - 1} values, {len(fields)} fields")
        values = {f["name"]: v for f, v in zip(fields, raw[1:])}
    out = {"type": tag}
    out.update((k, hexed(v)) for k, v in values.items() if v is not None)
    return out


def _kind(raw: Any) -> str:
    return type(raw).__name__


def wire_event(wire: dict, type_name: str, values: dict) -> bytes:
    """An event's values (native: bytes, tuples) -> its msgpack bytes, as the
    file says vLLM's encoder lays them out."""
    import msgspec

    fields = event_fields(wire, type_name)
    if wire["layout"] == "map":
        obj: Any = {wire["tag_field"]: type_name}
        for f in fields:
            v = values.get(f["name"])
            if f["required"] or v is not None:
                obj[f["name"]] = v
        count = len(obj)
    else:
        # Arrays keep every field, defaults included (msgspec omits defaults
        # from maps only).
        obj = [type_name, *(values.get(f["name"]) for f in fields)]
        count = len(obj)
    body = msgspec.msgpack.encode(obj)
    # msgspec sizes a struct's header for all its fields and the tag, written
    # or not: past 15 the header is 16-bit even when fewer entries follow.
    if len(fields) + 1 > 15 and count <= 15:
        marker = b"\xde" if wire["layout"] == "map" else b"\xdc"
        body = marker + count.to_bytes(2, "big") + body[1:]
    return body


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def wire_batch(wire: dict, ts: float, events: list[bytes],
               data_parallel_rank: int | None) -> bytes:
    """A batch's msgpack bytes from its events' bytes: [ts, events,
    data_parallel_rank] (an array; the rank left out when null)."""
    import msgspec

    parts = [_array_header(2 if data_parallel_rank is None else 3),
             msgspec.msgpack.encode(float(ts)), _array_header(len(events)), *events]
    if data_parallel_rank is not None:
        parts.append(msgspec.msgpack.encode(data_parallel_rank))
    return b"".join(parts)


def decode_batch(payload: bytes) -> Any:
    import msgspec

    return msgspec.msgpack.decode(payload)
