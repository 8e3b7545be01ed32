"""Reading traces: JSON Lines streamed line by line, or the YAML form.

`open_trace(path)` checks the header at once and yields records lazily, so a
trace of millions of events never sits in memory. Every problem becomes a
TraceError naming file:line and the field. Beyond the schema, the reader checks
what needs context: block ids against the pool size, token counts against
max_model_len, and that events name requests that exist.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from harness.exit_codes import ExitCode
from harness.trace.codec import TraceHeader, TraceRecord, event_from_dict, header_from_dict
from harness.trace.errors import TraceError
from harness.trace.schema import SchemaViolation, validate_event, validate_header
from impl.profiles import UnsupportedVersion, VersionProfile, get_profile

YAML_SUFFIXES = (".yaml", ".yml")
TRACE_SUFFIXES = (".jsonl", *YAML_SUFFIXES)


@dataclass(slots=True)
class Trace:
    path: str
    header: TraceHeader
    # None only when opened with any_version and the version has no profile.
    profile: VersionProfile | None
    records: Iterator[TraceRecord]
    # Bytes of the file, for progress bars over streamed traces.
    size: int = 0

    def bytes_read(self) -> int:
        return getattr(self.records, "bytes_read", 0)


def find_traces(paths: list[str]) -> list[str]:
    """Files named directly, plus every trace file under named folders (sorted)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out.extend(os.path.join(root, f) for f in sorted(files)
                           if f.endswith(TRACE_SUFFIXES))
        else:
            out.append(p)
    return out


def open_trace(path: str, any_version: bool = False) -> Trace:
    """A trace, streamed. Its vLLM version must have a profile (exit 3
    otherwise) unless `any_version`: bisect runs a trace on many releases and
    reads no profile."""
    if not os.path.exists(path):
        raise TraceError(path, 0, "(file)", "no such file")
    if os.path.isdir(path):
        raise TraceError(path, 0, "(file)", "is a folder, not a trace")
    if path.endswith(YAML_SUFFIXES):
        header, objects = _load_yaml(path)
        records = _Records(path, header, objects)
        return Trace(path, header, _profile(path, header, any_version), records,
                     os.path.getsize(path))
    f = open(path, "rb")
    try:
        first = f.readline()
        header = _parse_header(path, first)
    except BaseException:
        f.close()
        raise
    records = _Records(path, header, _jsonl_objects(path, f, len(first)))
    return Trace(path, header, _profile(path, header, any_version), records,
                 os.path.getsize(path))


def _profile(path: str, header: TraceHeader, any_version: bool) -> VersionProfile | None:
    try:
        profile = get_profile(header.vllm_version)
    except UnsupportedVersion as e:
        if any_version:
            return None
        raise TraceError(path, 1, "vllm_version", str(e), ExitCode.ENVIRONMENT) from None
    if header.cache.hisparse and not profile.hisparse:
        raise TraceError(path, 1, "cache.groups", f"vLLM {header.vllm_version} has no HiSparse "
                         "groups (profile hisparse is false)")
    for i, group in enumerate(header.cache.groups):
        # A knob the trace's release does not have is bad input, not a divergence.
        why = group.refused_by(profile)
        if why is not None:
            raise TraceError(path, 1, f"cache.groups[{i}].kind", why)
    return profile


def _decode_line(path: str, line_no: int, raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(path, line_no, "(line)",
                         f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                         ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        hint = "" if raw.endswith(b"\n") else " (the last line is cut short: truncated file?)"
        raise TraceError(path, line_no, "(line)", f"not valid JSON: {e.msg} at column {e.colno}"
                         f"{hint}") from None


def _parse_header(path: str, raw: bytes) -> TraceHeader:
    if not raw:
        raise TraceError(path, 1, "(file)", "empty file: a trace starts with its header line")
    obj = _decode_line(path, 1, raw)
    if isinstance(obj, dict) and "op" in obj and "format" not in obj:
        raise TraceError(path, 1, "format", "missing header: the first line is an event; "
                         "a trace starts with its header line")
    try:
        validate_header(obj)
        return header_from_dict(obj)
    except SchemaViolation as e:
        raise TraceError(path, 1, e.field, e.message) from None
    except ValueError as e:  # a cache config the schema lets through but cannot be
        raise TraceError(path, 1, "cache", str(e)) from None


class _JsonlObjects:
    """(line number, parsed object) for each later line; counts bytes read."""

    def __init__(self, path: str, f, offset: int) -> None:
        self.path, self.f, self.bytes_read = path, f, offset

    def __iter__(self):
        path, f = self.path, self.f
        try:
            for line_no, raw in enumerate(f, 2):
                self.bytes_read += len(raw)
                if not raw.strip():
                    continue  # blank lines are allowed
                yield line_no, _decode_line(path, line_no, raw), None, None
        finally:
            f.close()


def _jsonl_objects(path: str, f, offset: int) -> _JsonlObjects:
    return _JsonlObjects(path, f, offset)


def _load_yaml(path: str) -> tuple[TraceHeader, list[tuple[int, object]]]:
    import yaml

    try:
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise TraceError(path, line, "(line)", f"not UTF-8 text (byte 0x{raw[e.start]:02x})"
                         ) from None
    try:
        doc = yaml.safe_load(text)
        # Line numbers of the events: compose the node tree (parsing only, no
        # object construction) with the safe loader.
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise TraceError(path, line, "(yaml)", str(getattr(e, "problem", e))) from None
    if doc is None:
        raise TraceError(path, 1, "(file)", "empty file: a trace needs a header and events")
    if not isinstance(doc, dict) or "header" not in doc:
        raise TraceError(path, 1, "header", "missing: a YAML trace is {header: ..., events: [...]}")
    unknown = sorted(set(doc) - {"header", "events"})
    if unknown:
        raise TraceError(path, 1, unknown[0], "unknown top-level key (expected header, events)")
    lines = {k.value: v for k, v in node.value}
    header_line = lines["header"].start_mark.line + 1
    try:
        validate_header(doc["header"])
        header = header_from_dict(doc["header"])
    except SchemaViolation as e:
        raise TraceError(path, header_line, f"header.{e.field}", e.message) from None
    except ValueError as e:  # a cache config the schema lets through but cannot be
        raise TraceError(path, header_line, "header.cache", str(e)) from None
    events = doc.get("events") or []
    if not isinstance(events, list):
        raise TraceError(path, lines["events"].start_mark.line + 1, "events", "must be a list")
    event_nodes = lines["events"].value if "events" in lines and events else []
    objects = []
    for n, obj in zip(event_nodes, events):
        keys = {k.value: k.start_mark.line + 1 for k, _ in n.value} if isinstance(
            n, yaml.MappingNode) else {}
        objects.append((n.start_mark.line + 1, obj, keys.get("answer"), keys.get("expect")))
    return header, objects


class _Records:
    """Validated TraceRecords, with the context checks that need the header."""

    def __init__(self, path: str, header: TraceHeader, objects) -> None:
        self.path = path
        self.header = header
        self.objects = objects
        cache = header.cache
        self.num_blocks = cache.num_blocks
        self.max_model_len = cache.max_model_len
        self.hisparse = cache.hisparse
        # A HiSparse source group's ids are host block ids.
        self.group_limits = [cache.hisparse_host_num_blocks if g.role == "hisparse_source"
                             else cache.num_blocks for g in cache.groups]
        self.live: set[str] = set()

    @property
    def bytes_read(self) -> int:
        return getattr(self.objects, "bytes_read", 0)

    def __iter__(self) -> Iterator[TraceRecord]:
        path = self.path
        for line_no, obj, answer_line, expect_line in self.objects:
            try:
                validate_event(obj)
            except SchemaViolation as e:
                raise TraceError(path, line_no, e.field, e.message) from None
            self._check_context(line_no, obj)
            yield TraceRecord(line_no, event_from_dict(obj), obj.get("answer"),
                              obj.get("expect"), obj.get("note"), answer_line, expect_line)

    def _fail(self, line: int, field: str, message: str):
        raise TraceError(self.path, line, field, message)

    def _check_context(self, line: int, obj: dict) -> None:
        op = obj["op"]
        req = obj.get("req")
        if op == "add_request":
            if req in self.live:
                self._fail(line, "req", f"request '{req}' already exists")
            n = len(obj["prompt"])
            if n > self.max_model_len:
                self._fail(line, "prompt", f"{n} tokens exceed max_model_len "
                           f"{self.max_model_len}")
            end = 0
            for i, m in enumerate(obj.get("mm", ())):
                if m["offset"] < end or m["offset"] + m["length"] > n:
                    self._fail(line, f"mm[{i}]", "multimodal ranges must be sorted, "
                               "disjoint and inside the prompt")
                end = m["offset"] + m["length"]
            self.live.add(req)
        elif req is not None:
            if req not in self.live:
                self._fail(line, "req", f"no request '{req}' (not added, or already freed)")
            if op == "free":
                self.live.discard(req)
        if op == "allocate":
            total = obj["num_new_tokens"] + obj.get("num_lookahead_tokens", 0)
            if total > self.max_model_len:
                self._fail(line, "num_new_tokens", f"{total} tokens exceed max_model_len "
                           f"{self.max_model_len}")
        elif op == "evict_blocks":
            self._check_block_ids(line, "block_ids", obj["block_ids"])
        elif op in ("hisparse_step", "hisparse_ack") or "hisparse" in obj.get("fields", ()):
            if not self.hisparse:
                self._fail(line, "op" if op != "checkpoint" else "fields",
                           "the trace's model has no HiSparse groups (cache.groups)")
            for i, (name, _start, _count) in enumerate(obj.get("scheduled", ())):
                if name not in self.live:
                    self._fail(line, f"scheduled[{i}]",
                               f"no request '{name}' (not added, or already freed)")
        answer = obj.get("answer")
        if answer:
            if "block_ids" in answer:
                limits = self.group_limits
                for g, ids in enumerate(answer["block_ids"]):
                    limit = limits[g] if g < len(limits) else self.num_blocks
                    self._check_block_ids(line, f"answer.block_ids[{g}]", ids, limit)
            if "free_queue" in answer:
                self._check_block_ids(line, "answer.free_queue", answer["free_queue"])

    def _check_block_ids(self, line: int, field: str, ids: list[int],
                         limit: int | None = None) -> None:
        limit = self.num_blocks if limit is None else limit
        for i, b in enumerate(ids):
            if b >= limit:
                what = "num_blocks" if limit == self.num_blocks else "hisparse_host_num_blocks"
                self._fail(line, f"{field}[{i}]", f"block id {b} >= {what} {limit}")
