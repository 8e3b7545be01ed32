"""Reading traces: JSON Lines streamed line by line, or the YAML form.

`open_trace(path)` checks the header at once and yields records lazily, so a
trace of millions of events never sits in memory. Every problem becomes a
TraceError naming file:line and the field. Beyond the schema, the reader checks
what needs context: block ids against the pool size, token counts against
max_model_len, and that events name requests that exist.

A JSON line is read in one step where it can be: msgspec decodes it straight
into the struct compiled from the schema for its op (typed_schema.py) and the
struct becomes the event (struct_events.py). A line that step refuses is read
again the plain way (decode, the schema's validator, codec.event_from_dict),
which either accepts it or names the field; so what is accepted, and every
message, comes from the schema. The plain way is also the JSON grammar's
judge: strict RFC 8259 (msgspec's), and input no parser can hold (nesting
thousands deep, integers of thousands of digits) is one line of bad input.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from harness.core.events import (
    AddRequest,
    Allocate,
    Checkpoint,
    Event,
    EvictBlocks,
    Free,
    HiSparseAck,
    HiSparseStep,
)
from harness.core.exit_codes import ExitCode
from harness.core.sizing_shape import is_sizing_corpus
from harness.core.trace_error import TraceError
from harness.trace.codec import TraceHeader, TraceRecord, event_from_dict, header_from_dict
from harness.trace.rules import TraceRules
from harness.trace.schema import SchemaViolation, validate_event, validate_header
from harness.trace.struct_events import fast_events
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


def _is_sizing_corpus(path: str) -> bool:
    """A sizing corpus (traces/sizing/) in a trace folder: no trace."""
    if not path.endswith(YAML_SUFFIXES):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return is_sizing_corpus(f.read(4096))
    except OSError:
        return False


def find_traces(paths: list[str]) -> list[str]:
    """Files named directly, plus every trace file under named folders
    (sorted; sizing corpora left out)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out.extend(path for path in (os.path.join(root, f) for f in sorted(files)
                                             if f.endswith(TRACE_SUFFIXES))
                           if not _is_sizing_corpus(path))
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
        records = _Records(path, header, objects, jsonl=False)
        return Trace(path, header, _profile(path, header, any_version), records,
                     os.path.getsize(path))
    f = open(path, "rb")
    try:
        first = f.readline()
        header = _parse_header(path, first)
    except BaseException:
        f.close()
        raise
    records = _Records(path, header, _JsonlLines(f), jsonl=True)
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


_PLAIN = msgspec.json.Decoder()
_BYTE = re.compile(r"\(byte (\d+)\)")
# msgspec's words for a number it cannot hold, in ours.
_TOO_LARGE = {"Integer value out of range": "an integer too large to read",
              "Number out of range": "a number too large to read"}


def _decode_line(path: str, line_no: int, raw: bytes) -> object:
    """A line as plain JSON data, or the TraceError that says why it is not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(path, line_no, "(line)",
                         f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                         ) from None
    try:
        return _PLAIN.decode(raw)
    except RecursionError:
        problem = "nested too deeply"
    except msgspec.ValidationError as e:
        what = str(e).split(" - ", 1)[0]
        problem = _TOO_LARGE.get(what, what)
    except msgspec.DecodeError as e:
        problem = _json_message(text) or _BYTE.sub(
            lambda m: f"at column {int(m.group(1)) + 1}",
            str(e).removeprefix("JSON is malformed: "))
        if not raw.endswith(b"\n"):
            problem += " (the last line is cut short: truncated file?)"
    raise TraceError(path, line_no, "(line)", f"not valid JSON: {problem}")


def _json_message(text: str) -> str | None:
    """Python's json module's account of malformed JSON (it names the column),
    or None where that module reads what msgspec refuses (NaN, lone surrogates)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"{e.msg} at column {e.colno}"
    except (RecursionError, ValueError):
        return None
    return None


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


class _JsonlLines:
    """The lines after the header: the open file, read by _Records; knows how
    many bytes have been read (the file's own position, so that reading a
    line costs nothing more)."""

    def __init__(self, f) -> None:
        self.f = f
        self._end: int | None = None

    @property
    def bytes_read(self) -> int:
        return self.f.tell() if self._end is None else self._end

    def close(self) -> None:
        if self._end is None:
            self._end = self.f.tell()
            self.f.close()


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
    except RecursionError:
        raise TraceError(path, 1, "(yaml)", "nested too deeply to read") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise TraceError(path, 1, "(yaml)", f"cannot read a value: {e}".split(";")[0]
                         ) from None
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

    def __init__(self, path: str, header: TraceHeader, objects, jsonl: bool) -> None:
        self.path = path
        self.header = header
        # JSON Lines: the open file (_JsonlLines); YAML: (line, object, answer line, expect line).
        self.objects = objects
        self.jsonl = jsonl
        cache = header.cache
        self.num_blocks = cache.num_blocks
        self.max_model_len = cache.max_model_len
        self.hisparse = cache.hisparse
        # A HiSparse source group's ids are host block ids.
        self.group_limits = [cache.hisparse_host_num_blocks if g.role == "hisparse_source"
                             else cache.num_blocks for g in cache.groups]
        self.live: set[str] = set()
        self.rules = TraceRules(path, header)  # what vLLM rejects (harness/trace/rules.py)
        # Event class -> its context check.
        self._checks: dict[type, object] = {}

    @property
    def bytes_read(self) -> int:
        return getattr(self.objects, "bytes_read", 0)

    def __iter__(self) -> Iterator[TraceRecord]:
        if not self.jsonl:
            for line_no, obj, answer_line, expect_line in self.objects:
                yield self._from_object(line_no, obj, answer_line, expect_line)
            return
        path = self.path
        fast = fast_events()
        decode, table = fast.decoder.decode if fast.decoder else None, fast.table
        unset = msgspec.UNSET
        to_builtins = msgspec.to_builtins
        check_context = self._check_context
        check_rules = self.rules.check
        lines = self.objects
        try:
            for line_no, raw in enumerate(lines.f, 2):
                if raw.isspace():
                    continue  # blank lines are allowed
                # The typed step; anything it refuses is read again the plain way.
                try:
                    s = decode(raw)
                    _, check, convert = table[s.__class__]
                    if check is not None and not check(s):
                        raise ValueError(check)
                    event = convert(s)
                except (msgspec.MsgspecError, RecursionError, KeyError, ValueError, TypeError):
                    yield self._from_object(line_no, _decode_line(path, line_no, raw), None,
                                            None)
                    continue
                answer = s.answer
                answer = None if answer is unset else to_builtins(answer)
                check_context(line_no, event, answer)
                check_rules(line_no, event)
                expect, note = s.expect, s.note
                yield TraceRecord(line_no, event, answer, None if expect is unset else expect,
                                  None if note is unset else note)
        finally:
            lines.close()

    def _from_object(self, line_no: int, obj, answer_line, expect_line) -> TraceRecord:
        """The plain way: the schema's validator names what is wrong."""
        try:
            validate_event(obj)
        except SchemaViolation as e:
            raise TraceError(self.path, line_no, e.field, e.message) from None
        event = event_from_dict(obj)
        answer = obj.get("answer")
        self._check_context(line_no, event, answer)
        self.rules.check(line_no, event)
        return TraceRecord(line_no, event, answer, obj.get("expect"), obj.get("note"),
                           answer_line, expect_line)

    def _fail(self, line: int, field: str, message: str):
        raise TraceError(self.path, line, field, message)

    def _check_context(self, line: int, event: Event, answer: dict | None) -> None:
        """What a schema cannot say: requests that exist, token counts within
        max_model_len, block ids within the pool."""
        check = self._checks.get(event.__class__)
        if check is None:
            check = self._checks[event.__class__] = self._context_check_for(event)
        check(line, event, answer)

    def _context_check_for(self, event: Event):
        """The context check of one event class, answer included."""
        live = self.live
        check_answer = self._check_answer
        if isinstance(event, AddRequest):
            return lambda line, ev, answer: self._check_add_request(line, ev)
        if isinstance(event, Allocate):
            def check(line: int, ev: Allocate, answer) -> None:
                if ev.req not in live:
                    self._no_request(line, ev.req)
                total = ev.num_new_tokens + ev.num_lookahead_tokens
                if total > self.max_model_len:
                    self._fail(line, "num_new_tokens", f"{total} tokens exceed max_model_len "
                               f"{self.max_model_len}")
                if answer:
                    check_answer(line, answer)
            return check
        if isinstance(event, (HiSparseStep, HiSparseAck)):
            def check(line: int, ev, answer) -> None:
                self._check_hisparse(line, "op")
                for i, (name, _start, _count) in enumerate(getattr(ev, "scheduled", ())):
                    if name not in live:
                        self._fail(line, f"scheduled[{i}]",
                                   f"no request '{name}' (not added, or already freed)")
            return check
        if isinstance(event, Checkpoint):
            def check(line: int, ev: Checkpoint, answer) -> None:
                if "hisparse" in ev.fields:
                    self._check_hisparse(line, "fields")
                if answer:
                    check_answer(line, answer)
            return check
        if isinstance(event, EvictBlocks):
            return lambda line, ev, answer: self._check_block_ids(line, "block_ids", ev.block_ids)
        if isinstance(event, Free):
            def check(line: int, ev: Free, answer) -> None:
                if ev.req not in live:
                    self._no_request(line, ev.req)
                live.discard(ev.req)
            return check
        if hasattr(event, "req"):
            def check(line: int, ev, answer) -> None:
                if ev.req not in live:
                    self._no_request(line, ev.req)
                if answer:
                    check_answer(line, answer)
            return check

        def check(line: int, ev, answer) -> None:
            if answer:
                check_answer(line, answer)
        return check

    def _check_hisparse(self, line: int, field: str) -> None:
        if not self.hisparse:
            self._fail(line, field, "the trace's model has no HiSparse groups (cache.groups)")

    def _no_request(self, line: int, req: str):
        self._fail(line, "req", f"no request '{req}' (not added, or already freed)")

    def _check_add_request(self, line: int, ev: AddRequest) -> None:
        if ev.req in self.live:
            self._fail(line, "req", f"request '{ev.req}' already exists")
        n = len(ev.prompt)
        if n > self.max_model_len:
            self._fail(line, "prompt", f"{n} tokens exceed max_model_len {self.max_model_len}")
        end = 0
        for i, m in enumerate(ev.mm):
            if m.offset < end or m.offset + m.length > n:
                self._fail(line, f"mm[{i}]", "multimodal ranges must be sorted, "
                           "disjoint and inside the prompt")
            end = m.offset + m.length
        self.live.add(ev.req)

    def _check_answer(self, line: int, answer: dict) -> None:
        groups = answer.get("block_ids")
        if groups:
            limits = self.group_limits
            for g, ids in enumerate(groups):
                limit = limits[g] if g < len(limits) else self.num_blocks
                self._check_block_ids(line, f"answer.block_ids[{g}]", ids, limit)
        free_queue = answer.get("free_queue")
        if free_queue:
            self._check_block_ids(line, "answer.free_queue", free_queue)

    def _check_block_ids(self, line: int, field: str, ids: list[int],
                         limit: int | None = None) -> None:
        limit = self.num_blocks if limit is None else limit
        if not ids or max(ids) < limit:
            return
        for i, b in enumerate(ids):
            if b >= limit:
                what = "num_blocks" if limit == self.num_blocks else "hisparse_host_num_blocks"
                self._fail(line, f"{field}[{i}]", f"block id {b} >= {what} {limit}")


def events_checked_elsewhere(path: str) -> Iterator[Event]:
    """The events of a trace that another reader of the same file checks at the
    same time (the forked side of a diff, harness/sources/side_by_side.py):
    no schema or context checks and no answers, which that reader owns and
    reports. A JSON line takes the typed step; a line that step refuses, the
    plain decode; a line not even that reads ends the events (the checking
    reader names it). YAML traces are small: they are read the checked way."""
    if path.endswith(YAML_SUFFIXES):
        yield from (r.event for r in open_trace(path).records)
        return
    fast = fast_events()
    decode, table = fast.decoder.decode if fast.decoder else None, fast.table
    with open(path, "rb") as f:
        f.readline()  # the header: the checking reader read it
        for raw in f:
            if raw.isspace():
                continue
            try:
                s = decode(raw)
                yield table[s.__class__][2](s)
            except (msgspec.MsgspecError, RecursionError, KeyError, ValueError, TypeError):
                try:
                    yield event_from_dict(_PLAIN.decode(raw))
                except Exception:  # noqa: BLE001 - bad input: the checking reader's to name
                    return
