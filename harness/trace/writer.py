"""Writing traces: JSON Lines streamed event by event, or the YAML form.

JSONL output is written through as it comes (a writer holds one line at a time);
`close()` flushes and fsyncs, so a trace reported as written is on disk. The
YAML form is for hand-sized traces and is written at close.
"""

from __future__ import annotations

import json
import os

from harness.core.events import Event
from harness.trace.codec import TraceHeader, event_to_dict, header_to_dict
from harness.trace.reader import YAML_SUFFIXES


class TraceWriter:
    def __init__(self, path: str, header: TraceHeader) -> None:
        self.path = path
        self.yaml = path.endswith(YAML_SUFFIXES)
        self._header = header_to_dict(header)
        self._events: list[dict] = []
        self._tmp = f"{path}.partial"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._f = open(self._tmp, "w", encoding="utf-8")
        if not self.yaml:
            self._write_line(self._header)
        self.num_events = 0

    def _write_line(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")))
        self._f.write("\n")

    def write(
        self,
        event: Event,
        answer: dict | None = None,
        expect: dict | None = None,
        note: str | None = None,
    ) -> None:
        obj = event_to_dict(event, answer, expect, note)
        if self.yaml:
            self._events.append(obj)
        else:
            self._write_line(obj)
        self.num_events += 1

    def close(self) -> None:
        """Finish the file: flushed, fsynced, then renamed into place."""
        if self._f.closed:
            return
        if self.yaml:
            _dump_yaml({"header": self._header, "events": self._events}, self._f)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop a half-written trace."""
        if not self._f.closed:
            self._f.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _dump_yaml(doc: dict, f) -> None:
    """The YAML form, laid out for people: one block mapping per event, its
    values (token lists, answers) inline, no anchors."""
    import yaml

    class Flow(dict):
        pass

    class FlowList(list):
        pass

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    Dumper.add_representer(Flow, lambda d, v: d.represent_mapping(
        "tag:yaml.org,2002:map", v.items(), flow_style=True))
    Dumper.add_representer(FlowList, lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", v, flow_style=True))

    def flow(v):
        if isinstance(v, dict):
            return Flow((k, flow(x)) for k, x in v.items())
        if isinstance(v, list):
            return FlowList(flow(x) for x in v)
        return v

    events = [{k: flow(v) for k, v in e.items()} for e in doc["events"]]
    yaml.dump({"header": doc["header"], "events": events}, f, Dumper=Dumper,
              sort_keys=False, width=100)
