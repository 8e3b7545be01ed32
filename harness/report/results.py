"""A result page a project can publish (markdown and HTML): what was checked,
against which vLLM releases, and what failed, one row per case. The gate
(`kvconform gate --page DIR`) and `kvconform consumer-check --page DIR`
write it; a project that checks its own implementation (`--backend
exec:CMD`) publishes it as its conformance badge's page."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

from harness.core.exit_codes import ExitCode

_VERDICTS = {ExitCode.OK: "conformant", ExitCode.DIVERGED: "FAILED",
             ExitCode.BAD_INPUT: "could not run (bad input)",
             ExitCode.ENVIRONMENT: "could not run (environment)",
             ExitCode.INTERRUPTED: "interrupted"}


@dataclass(slots=True)
class ResultRow:
    case: str
    mode: str
    exit_code: ExitCode
    message: str = ""
    verdict: str = ""  # more telling than the exit code's ("not covered by ...")

    @property
    def shown(self) -> str:
        return self.verdict or _VERDICTS[ExitCode(self.exit_code)]


def _headline(rows: list[ResultRow]) -> str:
    failed = sum(r.exit_code != ExitCode.OK for r in rows)
    skipped = sum(bool(r.verdict.startswith("not covered")) for r in rows)
    checked = len(rows) - skipped
    if failed:
        return f"{failed} of {checked} checked cases failed"
    return f"all {checked} checked cases conformant" + (
        f" ({skipped} not covered)" if skipped else "")


def result_markdown(title: str, rows: list[ResultRow], against: str = "") -> str:
    lines = [f"# {title}", "", f"**{_headline(rows)}**", ""]
    if against:
        lines += [f"Checked: {against}.", ""]
    lines += ["| case | mode | result |", "|---|---|---|"]
    lines += [f"| `{r.case}` | {r.mode} | {r.shown} |" for r in rows]
    failed = [r for r in rows if r.exit_code != ExitCode.OK]
    if failed:
        lines += ["", "## What failed", ""]
        for r in failed:
            lines += [f"### `{r.case}`", "", "```", r.message.strip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def result_html(title: str, rows: list[ResultRow], against: str = "") -> str:
    e = html.escape
    body = [f"<h1>{e(title)}</h1>", f"<p><strong>{e(_headline(rows))}</strong></p>"]
    if against:
        body.append(f"<p>Checked: {e(against)}.</p>")
    body.append("<table><tr><th>case</th><th>mode</th><th>result</th></tr>")
    for r in rows:
        cls = "ok" if r.exit_code == ExitCode.OK else "bad"
        body.append(f'<tr class="{cls}"><td><code>{e(r.case)}</code></td><td>{e(r.mode)}</td>'
                    f"<td>{e(r.shown)}</td></tr>")
    body.append("</table>")
    failed = [r for r in rows if r.exit_code != ExitCode.OK]
    if failed:
        body.append("<h2>What failed</h2>")
        for r in failed:
            body.append(f"<h3><code>{e(r.case)}</code></h3><pre>{e(r.message.strip())}</pre>")
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}"
             "tr.bad td{background:#fdd}pre{background:#f6f6f6;padding:.5em;overflow:auto}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_result_page(out_dir: str, title: str, rows: list[ResultRow],
                      against: str = "") -> str:
    """index.md and index.html in out_dir; the markdown's path."""
    os.makedirs(out_dir, exist_ok=True)
    md = os.path.join(out_dir, "index.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(result_markdown(title, rows, against))
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write(result_html(title, rows, against))
    return md
