"""`kvconform capture join`: a plugin session's parts as one trace, and what it lacks.

The parts concatenated in order are the trace (harness/capture/segments.py).
A session whose last part is still `.partial` lost its server without a
signal (SIGKILL, a crash): the part is taken only with `include_partial` (or
`repair`), its cut last line is dropped, and the trace's header says
`truncated` and why, so that replays and reports never call it plainly
conformant. `repair` also ends the trace at its last complete scheduler step
(the events before the last `step` line): the step the server died in may
hold only some of its calls.

The report says what is missing either way: requests that were added but
never freed (still running when the recording ended), and the bytes of a cut
line.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.capture.segments import PART_SUFFIX, PARTIAL, part_name
from harness.capture.sinks import encode_line

_STEP = b'{"op":"step"'
_ADD = b'{"op":"add_request"'
_FREE = b'{"op":"free"'
# How many ids of requests never freed a report names.
SHOWN_IDS = 5


class JoinError(ValueError):
    """The parts do not make one trace (`file:line: field: message`)."""


@dataclass(slots=True)
class JoinReport:
    out: str
    session: str
    num_events: int = 0
    num_parts: int = 0
    # The last part was never closed (its server died without a signal).
    cut: bool = False
    cut_bytes: int = 0  # of the line being written when it died
    # With repair: events of the unfinished last step left out.
    repaired_events: int = 0
    never_freed: list[str] = field(default_factory=list)
    truncated: str | None = None  # the header's note, when the trace lacks an end

    def lines(self) -> list[str]:
        out = [f"{self.out}: {self.num_events} events from {self.session} "
               f"({self.num_parts} part{'s' if self.num_parts != 1 else ''})"]
        if self.cut:
            out.append(f"  incomplete: the last part was never closed (the server died "
                       f"without a signal); up to its last {FLUSH_NOTE} of calls may be "
                       f"missing, {self.cut_bytes} bytes of a cut line dropped")
        if self.repaired_events:
            out.append(f"  repaired: {self.repaired_events} events of the unfinished last "
                       "step left out; the trace ends at the last complete step")
        if self.never_freed:
            shown = ", ".join(self.never_freed[:SHOWN_IDS])
            more = len(self.never_freed) - SHOWN_IDS
            out.append(f"  {len(self.never_freed)} requests never freed (still running when "
                       f"the recording ended): {shown}" + (f" and {more} more" if more > 0
                                                            else ""))
        if self.truncated:
            out.append("  marked truncated in its header: replays and reports say so")
        return out


FLUSH_NOTE = "0.5 s"


def _parts(folder: Path, include_partial: bool) -> tuple[list[Path], bool]:
    if not folder.is_dir():
        raise JoinError(f"{folder}:0: (folder): not a capture session folder")
    names = sorted(p.name for p in folder.iterdir())
    done = [folder / n for n in names if n.endswith(PART_SUFFIX)]
    partial = [folder / n for n in names if n.endswith(PART_SUFFIX + PARTIAL)]
    if not done and not partial:
        raise JoinError(f"{folder}:0: (folder): no {PART_SUFFIX} parts")
    for i, p in enumerate(done):
        if p.name != part_name(i):
            raise JoinError(f"{p}:0: (file): expected {part_name(i)}: a part is missing")
    if not partial:
        return done, False
    if not include_partial:
        raise JoinError(f"{partial[0]}:0: (file): never closed: the server died without a "
                        "signal (SIGKILL, a crash) or is still running; --repair takes it "
                        "and ends the trace at its last complete step (--include-partial: "
                        "as it is)")
    if len(partial) > 1 or partial[0].name != part_name(len(done)) + PARTIAL:
        raise JoinError(f"{partial[0]}:0: (file): does not follow the last closed part")
    return [*done, partial[0]], True


def join(session: str, out: str, include_partial: bool = False,
         repair: bool = False) -> JoinReport:
    """Concatenate a session's parts into one trace at `out` (see the module)."""
    folder = Path(session)
    parts, cut = _parts(folder, include_partial or repair)
    report = JoinReport(out, session, num_parts=len(parts), cut=cut)
    body = f"{out}.body.partial"
    live: dict[str, None] = {}  # requests added and not freed, in order
    header = b""
    last_step_at = None  # offset in body of the last step line, and the events before it
    events_before_step = 0
    with open(body, "wb") as w:
        for p in parts:
            with open(p, "rb") as f:
                for raw in f:
                    if not raw.endswith(b"\n"):
                        report.cut_bytes = len(raw)  # the line being written when it died
                        break
                    if not header:
                        header = raw
                        continue
                    if raw.startswith(_STEP):
                        last_step_at, events_before_step = w.tell(), report.num_events
                        step_live = dict(live)
                    elif raw.startswith(_ADD):
                        live[json.loads(raw)["req"]] = None
                    elif raw.startswith(_FREE):
                        live.pop(json.loads(raw)["req"], None)
                    w.write(raw)
                    report.num_events += 1
        if repair and cut and last_step_at is not None:
            report.repaired_events = report.num_events - events_before_step
            report.num_events = events_before_step
            live = step_live
            w.truncate(last_step_at)
    if not header:
        os.remove(body)
        raise JoinError(f"{parts[0]}:1: (file): no header line: the server died before "
                        "writing anything")
    report.never_freed = list(live)
    if cut:
        report.truncated = _truncation_note(report)
    _write(out, header, body, report.truncated)
    return report


def _truncation_note(r: JoinReport) -> str:
    what = ("the server died without closing its capture (SIGKILL or a crash): the last "
            f"{FLUSH_NOTE} of calls may be missing")
    if r.cut_bytes:
        what += f", a cut line of {r.cut_bytes} bytes dropped"
    if r.repaired_events:
        what += (f"; ended at the last complete step by `capture join --repair` "
                 f"({r.repaired_events} events of the unfinished step left out)")
    if r.never_freed:
        what += f"; {len(r.never_freed)} requests never freed"
    return what


def _write(out: str, header: bytes, body: str, truncated: str | None) -> None:
    tmp = f"{out}.partial"
    if truncated is not None:
        obj = json.loads(header)
        obj["truncated"] = truncated
        header = encode_line(obj)
    with open(tmp, "wb") as w:
        w.write(header)
        with open(body, "rb") as r:
            shutil.copyfileobj(r, w, 1 << 20)
        w.flush()
        os.fsync(w.fileno())
    os.remove(body)
    os.replace(tmp, out)
