"""Reports: a Failure and a trace run in a terminal text form, and a JSON form
for machines.

Pure formatting; nothing here runs a backend.
"""

from __future__ import annotations

import json
from typing import Any

from harness.core.compare import Failure, FailureKind
from harness.core.exit_codes import ExitCode
from harness.core.outcome import DivergenceContext, TraceOutcome
from harness.trace.codec import event_to_dict


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _block_row(state: dict) -> str:
    h = state["hash"] or "-"
    flag = " free" if state["free"] else ""
    return f"#{state['block_id']} ref={state['ref_cnt']} hash={h}{flag}"


def format_failure(f: Failure, context: DivergenceContext | None = None) -> str:
    """The report of a Failure, wherever it came from (a trace, a workload, a
    fuzz case): where, the event, every answer and the first differing field;
    for a trace also its note and the context (blocks before and after, the
    earlier events on the same request or blocks)."""
    where = f"{f.path}:{f.line}: " if f.path else ""
    if f.kind is FailureKind.REJECTED:
        return f"{where}{f.field}: {f.message} (event #{f.index}, {f.event.kind})"
    what = "diverged" if f.kind is FailureKind.DIVERGED else f.kind.value
    lines = [
        f"{where}{what} at event #{f.index} ({f.event.kind}), "
        f"field {f.field or '(whole answer)'}",
        f"  event: {_short(event_to_dict(f.event), 300)}",
    ]
    for name, answer in f.answers.items():
        lines.append(f"  {name:>9}: {_short(answer, 300)}")
    if f.record is not None and f.record.note:
        lines.append(f"  note: {f.record.note}")
    c = context
    if c is not None and c.involved_blocks:
        lines.append(f"  blocks involved: {c.involved_blocks}")
        for name in c.after:
            before = {s["block_id"]: s for s in c.before.get(name, [])}
            lines.append(f"  {name} before -> after:")
            for state in c.after[name]:
                b = before.get(state["block_id"])
                left = _block_row(b) if b else "?"
                lines.append(f"    {left:<44} -> {_block_row(state)}")
    if c is not None and c.related:
        lines.append("  earlier events on the same request or blocks:")
        for r in c.related:
            lines.append(f"    {f.path}:{r['line']}: {_short(r['event'], 100)} -> "
                         f"{_short(r['answer'], 100)}")
    return "\n".join(lines)


def format_outcome_line(o: TraceOutcome) -> str:
    if o.error is not None:
        return f"{o.path}: {verdict_of(o)}"
    if o.skipped:
        return f"{o.path}: skipped ({o.skipped})"
    if o.not_covered:
        return f"{o.path}: {o.not_covered}"
    verdict = verdict_of(o)
    extra = f", recorded to {o.recorded}" if o.recorded else ""
    rate = f", {o.num_events / o.run_seconds:,.0f} events/s" if o.run_seconds > 0.1 else ""
    if o.truncated and not o.divergence:
        extra += f" (conformant as far as it goes; it lacks its end: {o.truncated})"
    return f"{o.path}: {verdict}, {o.num_events} events, {o.seconds:.2f}s{rate}{extra}"


def verdict_of(o: TraceOutcome) -> str:
    """One word for a trace run, as every report shows it."""
    if o.error is not None:
        return ("not checked (environment)" if o.error.exit_code == ExitCode.ENVIRONMENT
                else "bad input")
    if o.skipped:
        return "skipped"
    if o.not_covered:
        # "not covered by exec:CMD: why" -> "not covered by exec:CMD"
        return o.not_covered.rsplit(": ", 1)[0]
    if o.divergence is not None:
        return "DIVERGED"
    return "truncated" if o.truncated else "conformant"


def outcome_json(o: TraceOutcome) -> dict:
    out: dict[str, Any] = {"path": o.path, "exit_code": o.exit_code, "events": o.num_events,
                           "seconds": round(o.seconds, 4), "run_seconds": round(o.run_seconds, 4)}
    if o.skipped:
        out["skipped"] = o.skipped
    if o.not_covered:
        out["not_covered"] = o.not_covered
    if o.recorded:
        out["recorded"] = o.recorded
    if o.truncated:
        out["truncated"] = o.truncated
    out["verdict"] = verdict_of(o)
    if o.error is not None:
        e = o.error
        out["error"] = {"line": e.line, "field": e.field, "message": e.message}
    d = o.divergence
    if d is not None:
        out["divergence"] = {
            "kind": d.kind.value, "line": d.line, "index": d.index, "field": d.field,
            "event": event_to_dict(d.event), "answers": d.answers,
            "note": d.record.note if d.record is not None else None,
        }
        if o.context is not None:
            c = o.context
            out["divergence"].update(blocks=c.involved_blocks, before=c.before, after=c.after,
                                     related=c.related)
    return out


def _spark(values: list[float | None], width: int = 60) -> str:
    """A line of block characters for a series in [0, 1] ('·' where unknown),
    averaged into at most `width` cells."""
    if not values:
        return ""
    marks = " ▁▂▃▄▅▆▇█"
    k = -(-len(values) // width)
    out = []
    for i in range(0, len(values), k):
        known = [v for v in values[i:i + k] if v is not None]
        out.append("·" if not known else marks[round(sum(known) / len(known) * 8)])
    return "".join(out)


def format_traffic(o: TraceOutcome, max_requests: int = 20) -> list[str]:
    """`kvconform stats`: a trace run's traffic (harness/core/traffic.py) as text."""
    t = o.traffic
    lines = [format_outcome_line(o)]
    if t is None:
        return lines
    span = f"{len(t.steps)} scheduler steps" if t.has_steps else "no scheduler steps"
    freed = f", {len(t.never_freed)} never freed" if t.never_freed else ""
    lines.append(f"  {t.num_events} events, {span}, {len(t.requests)} requests{freed}")
    rate = t.hit_rate
    lines.append("  prefix cache: " + ("no lookups" if rate is None else
                 f"hit rate {100 * rate:.1f}% ({t.hits} of {t.queries} tokens looked up)"))
    unit = "step" if t.has_steps else "event"
    if t.steps and t.queries:
        lines.append(f"    per {unit}:   |" + _spark([s.hits / s.queries if s.queries else None
                                                      for s in t.steps]) + "|")
    peak = 100 * t.peak_usage
    lines.append(f"  pool usage: peak {peak:.2f}%" if 0 < peak < 1 else
                 f"  pool usage: peak {peak:.1f}%")
    if t.steps:
        lines.append(f"    per {unit}:   |" + _spark([s.usage for s in t.steps]) + "|")
    evicted = ("not counted (the trace's vLLM published no KV events)" if t.evicted is None
               else str(t.evicted))
    lines.append(f"  preemptions: {t.preemptions}; evicted blocks: {evicted}")
    if max_requests and t.requests:
        lines.append(f"  {'request':<24} {'prompt':>7} {'hit':>7} {'blocks':>7} "
                     f"{'steps alive':>13} {'preempted':>9}")
        for r in list(t.requests.values())[:max_requests]:
            life = f"{r.first_step}-" + ("" if r.last_step is None else str(r.last_step))
            hit = "-" if r.hit_tokens is None else str(r.hit_tokens)
            lines.append(f"  {r.req[:24]:<24} {r.prompt:>7} {hit:>7} {r.peak_blocks:>7} "
                         f"{life:>13} {r.preemptions:>9}")
        if len(t.requests) > max_requests:
            lines.append(f"  ... {len(t.requests) - max_requests} more (--requests N, --json)")
    return lines
