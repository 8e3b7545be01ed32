"""`kvconform report`: a page per trace run, HTML (self-contained: the picture
is inlined, no network) and markdown (the picture beside it as a PNG).

Pure formatting of TraceOutcomes observed with the pool timeline.
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from harness.pool_picture import Picture, draw_pool
from harness.replay import TraceOutcome
from harness.report import format_failure, format_outcome_line


def _verdict(o: TraceOutcome) -> str:
    if o.error is not None:
        return "bad input"
    if o.skipped:
        return "skipped"
    return "DIVERGED" if o.divergence is not None else "conformant"


def _detail(o: TraceOutcome) -> str:
    if o.error is not None:
        return str(o.error)
    if o.divergence is not None:
        return format_failure(o.divergence, o.context)
    return format_outcome_line(o)


def write_report(o: TraceOutcome, out_dir: str) -> dict[str, str]:
    """Write <name>.png/.md/.html for one outcome; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    stem = Path(o.path).name.rsplit(".", 1)[0]
    paths = {"md": os.path.join(out_dir, f"{stem}.md"),
             "html": os.path.join(out_dir, f"{stem}.html")}
    picture: Picture | None = None
    if o.pool_timeline:
        paths["png"] = os.path.join(out_dir, f"{stem}.png")
        divergence = o.divergence.index if o.divergence is not None else None
        picture = draw_pool(o.pool_timeline, len(o.request_index or {}), paths["png"],
                            divergence, title=f"{o.path}: {_verdict(o)}")
    detail = _detail(o)
    md = [f"# {o.path}: {_verdict(o)}", "",
          f"{o.num_events} events, profile {o.profile or '?'}.", ""]
    if picture is not None:
        md += [f"![block pool over time]({Path(picture.path).name})", "",
               "Rows are blocks, columns events: one colour per request holding a block; "
               "dark: shared through a prefix hit; grey: free but cached; white: free; "
               "the red line marks the first divergence.", ""]
    md += ["```", detail, "```", ""]
    Path(paths["md"]).write_text("\n".join(md))

    img = ""
    if picture is not None:
        data = base64.b64encode(Path(picture.path).read_bytes()).decode()
        img = (f'<img alt="block pool over time" src="data:image/png;base64,{data}" '
               f'width="{picture.width}" height="{picture.height}">')
    color = "#b00" if _verdict(o) != "conformant" else "#070"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvconform: {html.escape(o.path)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:80em}}
pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}.v{{color:{color}}}</style></head>
<body><h1>{html.escape(o.path)}: <span class="v">{_verdict(o)}</span></h1>
<p>{o.num_events} events, profile {html.escape(o.profile or '?')}.</p>
{img}
<p>Rows are blocks, columns events: one colour per request holding a block; dark:
shared through a prefix hit; grey: free but cached; white: free; the red line
marks the first divergence.</p>
<pre>{html.escape(detail)}</pre></body></html>
"""
    Path(paths["html"]).write_text(page)
    return paths
