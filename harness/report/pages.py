"""`kvconform report`: a page per trace run and an index over all of them.

Each trace gets `<name>.html` (self-contained: the picture is inlined, no
network), `<name>.md` with `<name>.png` beside it; `index.html` has a row per
trace (verdict, events, steps, requests, hit rate, preemptions, evicted
blocks, peak usage) linking to its page. Names are unique within a report: two
traces called `t.jsonl` in different folders get their folders in their names.
A trace that could not be run (bad input, a version without a profile) still
gets a page, which says why.

Pure formatting of TraceOutcomes (observed with the pool's states).
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections import Counter
from pathlib import Path

from harness.core.exit_codes import ExitCode
from harness.core.outcome import TraceOutcome
from harness.core.traffic import Traffic
from harness.report.pool_picture import Picture, draw_pool
from harness.report.text import format_failure, format_outcome_line, verdict_of

# Rows of the per-request table a page shows at most.
MAX_REQUEST_ROWS = 400
_STYLE = """body{font-family:sans-serif;margin:1.5em auto;max-width:72em;padding:0 1em}
img{max-width:100%;height:auto}pre{background:#f6f6f6;padding:1em;overflow-x:auto;
white-space:pre-wrap}table{border-collapse:collapse;font-size:0.9em}
td,th{border:1px solid #ccc;padding:0.2em 0.6em;text-align:right}
td:first-child,th:first-child{text-align:left}.ok{color:#070}.bad{color:#b00}
.warn{color:#a60}.dim{color:#666}"""


def page_names(paths: list[str]) -> dict[str, str]:
    """A file name (no suffix) per trace path, unique among `paths`: the
    trace's name, with as many of its folders in front as tell it apart."""
    parts = {p: [re.sub(r"[^A-Za-z0-9._-]+", "_", x) for x in Path(p).with_suffix("").parts
                 if x not in ("/", "..", ".")] for p in paths}
    depth = dict.fromkeys(paths, 1)
    while True:
        names = {p: "-".join(parts[p][-depth[p]:]) for p in paths}
        clashes = Counter(names.values())
        grow = [p for p in paths if clashes[names[p]] > 1 and depth[p] < len(parts[p])]
        if not grow:
            break
        for p in grow:
            depth[p] += 1
    seen: Counter = Counter()
    for p in paths:  # the same path given twice
        seen[names[p]] += 1
        if seen[names[p]] > 1:
            names[p] = f"{names[p]}-{seen[names[p]]}"
    return names


def _css_class(o: TraceOutcome) -> str:
    v = verdict_of(o)
    return "ok" if v == "conformant" else ("warn" if v in ("truncated", "skipped") else "bad")


def _detail(o: TraceOutcome) -> str:
    if o.error is not None:
        why = ("the environment cannot check it" if o.error.exit_code == ExitCode.ENVIRONMENT
               else "the trace is bad input, or asks for something vLLM rejects")
        return f"Not run: {why}.\n{o.error}"
    if o.divergence is not None:
        return format_failure(o.divergence, o.context)
    return format_outcome_line(o)


def _percent(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.2f}%" if 0 < x < 0.01 else f"{100 * x:.1f}%"


def _numbers(t: Traffic | None) -> dict[str, str]:
    if t is None:
        return dict.fromkeys(("steps", "requests", "hit rate", "preemptions", "evicted",
                              "peak usage"), "–")
    return {"steps": str(len(t.steps)) if t.has_steps else "–",
            "requests": str(len(t.requests)), "hit rate": _percent(t.hit_rate),
            "preemptions": str(t.preemptions),
            "evicted": "–" if t.evicted is None else str(t.evicted),
            "peak usage": _percent(t.peak_usage)}


def _request_rows(t: Traffic) -> tuple[list[list[str]], int]:
    rows = []
    for r in list(t.requests.values())[:MAX_REQUEST_ROWS]:
        life = (f"{r.first_step}–{r.last_step}" if r.last_step is not None
                else f"{r.first_step}– (never freed)")
        rows.append([r.req, str(r.prompt), "–" if r.hit_tokens is None else str(r.hit_tokens),
                     str(r.peak_blocks), life, str(r.preemptions)])
    return rows, len(t.requests)


_REQUEST_HEAD = ["request", "prompt tokens", "hit tokens", "blocks (peak)",
                 "steps alive", "preemptions"]


def write_report(o: TraceOutcome, out_dir: str, name: str | None = None) -> dict[str, str]:
    """Write <name>.html/.md (and .png with a picture) for one outcome; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    stem = name or page_names([o.path])[o.path]
    paths = {"md": os.path.join(out_dir, f"{stem}.md"),
             "html": os.path.join(out_dir, f"{stem}.html")}
    t = o.traffic
    picture: Picture | None = None
    if t is not None and t.samples:
        paths["png"] = os.path.join(out_dir, f"{stem}.png")
        picture = draw_pool(t, paths["png"], o.divergence is not None,
                            title=f"{o.path}: {verdict_of(o)}")
    verdict = verdict_of(o)
    about = f"{o.num_events} events, profile {o.profile or '?'}"
    numbers = _numbers(t)
    figures = ", ".join(f"{k} {v}" for k, v in numbers.items())
    legend = ("Top: the block pool at the end of each scheduler step, a row per block "
              "(white free, grey free but cached, dark shared through a prefix hit, black the "
              "null block, a colour per request holding it alone). Middle: prefix-cache hit "
              "rate (dots: each step's lookups; line: so far). Bottom: pool usage. A red line "
              "marks the first divergence.")
    detail = _detail(o)
    md = [f"# {o.path}: {verdict}", "", f"{about}.", "", figures + ".", ""]
    if o.truncated:
        md += [f"**Truncated**: the trace lacks its end ({o.truncated}); conformant as far as "
               "it goes.", ""]
    if picture is not None:
        md += [f"![block pool over time]({Path(picture.path).name})", "", legend, ""]
    md += ["```", detail, "```", ""]
    if t is not None and t.requests:
        rows, total = _request_rows(t)
        md += ["| " + " | ".join(_REQUEST_HEAD) + " |",
               "|---" + "|---:" * (len(_REQUEST_HEAD) - 1) + "|"]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        if total > len(rows):
            md.append(f"\n({total - len(rows)} more requests not shown)")
        md.append("")
    Path(paths["md"]).write_text("\n".join(md))

    img = ""
    if picture is not None:
        data = base64.b64encode(Path(picture.path).read_bytes()).decode()
        img = (f'<img alt="block pool, hit rate and usage over scheduler steps" '
               f'src="data:image/png;base64,{data}" width="{picture.width}" '
               f'height="{picture.height}"><p class="dim">{html.escape(legend)}</p>')
    table = ""
    if t is not None and t.requests:
        rows, total = _request_rows(t)
        table = ("<h2>Requests</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in
                                                         _REQUEST_HEAD) + "</tr>"
                 + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                           for r in rows) + "</table>")
        if total > len(rows):
            table += f"<p class='dim'>{total - len(rows)} more requests not shown.</p>"
    truncated = ""
    if o.truncated:
        truncated = (f"<p class='warn'><b>Truncated:</b> the trace lacks its end "
                     f"({html.escape(o.truncated)}); conformant as far as it goes.</p>")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvconform: {html.escape(o.path)}</title>
<style>{_STYLE}</style></head>
<body><p><a href="index.html">all traces</a></p>
<h1>{html.escape(o.path)}: <span class="{_css_class(o)}">{html.escape(verdict)}</span></h1>
<p>{html.escape(about)}. {html.escape(figures)}.</p>
{truncated}{img}
<pre>{html.escape(detail)}</pre>
{table}</body></html>
"""
    Path(paths["html"]).write_text(page)
    return paths


def write_index(entries: list[tuple[TraceOutcome, dict[str, str]]], out_dir: str) -> str:
    """index.html over the outcomes and the pages write_report made for them."""
    head = ["trace", "verdict", "events", "steps", "requests", "hit rate", "preemptions",
            "evicted", "peak usage"]
    rows = []
    for o, pages in entries:
        n = _numbers(o.traffic)
        link = os.path.basename(pages["html"])
        cells = [f'<a href="{html.escape(link)}">{html.escape(o.path)}</a>',
                 f'<span class="{_css_class(o)}">{html.escape(verdict_of(o))}</span>',
                 str(o.num_events)] + [html.escape(n[k]) for k in head[3:]]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    counts = Counter(verdict_of(o) for o, _ in entries)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvconform report</title>
<style>{_STYLE}</style></head>
<body><h1>kvconform report</h1>
<p>{len(entries)} traces: {html.escape(summary)}.</p>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{"".join(rows)}</table>
<p class="dim">Hit rate: tokens found in the prefix cache over tokens looked up. Evicted:
cached blocks dropped (BlockRemoved), counted only for traces whose vLLM published KV
events. Peak usage: the most of the pool in use at a step's end.</p>
</body></html>
"""
    path = os.path.join(out_dir, "index.html")
    Path(path).write_text(page)
    return path
