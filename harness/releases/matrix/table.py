"""The matrix's one row per release: markdown (for people and CI summaries)
and JSON (for tools)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from harness.gate.run import UNVERIFIED
from harness.releases.matrix.run import Row


def format_markdown(rows: list[Row], seconds: float, fuzz_seconds: float) -> str:
    conformant = sum(r.result == "conformant" for r in rows)
    lines = [f"## kvconform matrix: {conformant} of {len(rows)} releases conformant", "",
             f"The gate (traces, seeded workloads, {fuzz_seconds:g} s of fuzz over every kind "
             f"config) against each release through its overlay, in {seconds / 60:.1f} min. "
             "Attention cases need vLLM's CPU attention ops, which overlays lack: they are "
             "counted as not run.", "",
             "| release | profile (checked on) | cases | events | divergences | errors | "
             "attention not run | seconds | result |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        profile = f"{r.profile} ({r.profile_releases})"
        if r.unverified:
            profile += f", {UNVERIFIED}"
        lines.append(f"| {r.release} | {profile} | {r.cases} | {r.events:,} | {r.divergences} | "
                     f"{r.errors} | {r.not_run} | {r.seconds:.0f} | {r.result} |")
    failed = [r for r in rows if r.failed_cases]
    for r in failed:
        lines += ["", f"**{r.release}**:"] + [f"- `{c}`" for c in r.failed_cases]
    return "\n".join(lines) + "\n"


def format_text(rows: list[Row]) -> str:
    head = ("release", "profile", "cases", "events", "diverged", "errors", "not run",
            "seconds", "result")
    body = [(r.release, r.profile + (f" ({UNVERIFIED})" if r.unverified else ""), str(r.cases),
             f"{r.events:,}", str(r.divergences), str(r.errors), str(r.not_run),
             f"{r.seconds:.0f}", r.result) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" if i in (0, 1, 8) else f"{{:>{w}}}"
                    for i, w in enumerate(widths))
    return "\n".join(fmt.format(*x) for x in [head, *body])


def write_reports(rows: list[Row], out_dir: Path, seconds: float, fuzz_seconds: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "matrix.md").write_text(format_markdown(rows, seconds, fuzz_seconds))
    data = {"seconds": round(seconds, 1), "fuzz_seconds": fuzz_seconds,
            "rows": [{**asdict(r), "exit_code": int(r.exit_code), "result": r.result,
                      "seconds": round(r.seconds, 1)} for r in rows]}
    (out_dir / "matrix.json").write_text(json.dumps(data, indent=1) + "\n")
