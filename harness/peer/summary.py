"""`.peer/summary.json` (the issue's shape), `summary.md` (a table per file,
then every test that did not pass on impl with its reason), `gaps.md` (the
features impl lacks, by how many of vLLM's tests need them) and
`results.json` (every test's verdict)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from harness.peer.classify import FAILED, NOT_APPLICABLE, PASSED, Verdict


def _file_counts(verdicts: list[Verdict]) -> dict:
    c = Counter()
    for v in verdicts:
        c[f"vllm_{v.vllm}"] += 1
        if v.impl is not None:
            c[f"impl_{v.impl}"] += 1
    return {
        "vllm_passed": c["vllm_passed"],
        "vllm_failed": c["vllm_failed"],
        "vllm_skipped": c["vllm_skipped"],
        "impl_passed": c[f"impl_{PASSED}"],
        "impl_failed": c[f"impl_{FAILED}"],
        "not_applicable": c[f"impl_{NOT_APPLICABLE}"],
    }


def summarize(version: str, verdicts: list[Verdict]) -> dict:
    by_file: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_file[v.file].append(v)
    na = Counter(v.reason for v in verdicts if v.impl == NOT_APPLICABLE)
    total = _file_counts(verdicts)
    return {
        "vllm_version": version,
        "vllm_passed": total["vllm_passed"],
        "impl_passed": total["impl_passed"],
        "impl_failed": total["impl_failed"],
        "not_applicable": dict(na.most_common()),
        "files": {f: _file_counts(vs) for f, vs in sorted(by_file.items())},
    }


def not_runnable(vllm_records: dict[str, dict]) -> list[dict]:
    """The tests (and test files that did not import) that do not pass on
    vLLM itself: on a release's overlay, mostly a device type, a compiled op
    or a module the overlay lacks. They are in no impl count."""
    out = []
    for nodeid, rec in vllm_records.items():
        if rec["outcome"] == "passed":
            continue
        exc = rec.get("exc") or {}
        reason = (rec.get("skip_reason") if rec["outcome"] == "skipped"
                  else f"{exc.get('exc_type', '?')}: {exc.get('message', '')}")
        out.append({"nodeid": nodeid, "outcome": rec["outcome"],
                    "phase": rec.get("phase", ""), "reason": (reason or "")[:200]})
    return sorted(out, key=lambda r: r["nodeid"])


def gaps(verdicts: list[Verdict]) -> Counter:
    return Counter(v.feature for v in verdicts if v.impl == FAILED and v.feature)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"


def markdown(summary: dict, verdicts: list[Verdict], seconds: float | None = None) -> str:
    lines = [f"# kvconform peer: vLLM {summary['vllm_version']}'s KV-cache unit tests on impl", ""]
    s = summary
    lines.append(f"{s['vllm_passed']} pass on vLLM; on impl **{s['impl_passed']} pass** "
                 f"({_pct(s['impl_passed'], s['vllm_passed'])}), {s['impl_failed']} fail, "
                 f"{sum(s['not_applicable'].values())} not applicable."
                 + (f" ({seconds:.0f} s)" if seconds is not None else ""))
    lines += ["", "| file | vLLM passed | impl passed | impl failed | not applicable "
              "| vLLM failed/skipped |", "|---|---:|---:|---:|---:|---:|"]
    for f, c in s["files"].items():
        lines.append(f"| `{f}` | {c['vllm_passed']} | {c['impl_passed']} | {c['impl_failed']} "
                     f"| {c['not_applicable']} | {c['vllm_failed'] + c['vllm_skipped']} |")
    lines.append(f"| **total** | {s['vllm_passed']} | {s['impl_passed']} | {s['impl_failed']} "
                 f"| {sum(s['not_applicable'].values())} | |")
    lines += ["", "## Features impl lacks (failing tests)", "", "| feature | tests |", "|---|---:|"]
    for feature, n in gaps(verdicts).most_common():
        lines.append(f"| {feature} | {n} |")
    lines += ["", "## Not applicable", "", "| reason | tests |", "|---|---:|"]
    for reason, n in s["not_applicable"].items():
        lines.append(f"| {reason} | {n} |")
    lines += ["", "## Every test that does not pass on impl", ""]
    for f in s["files"]:
        rows = [v for v in verdicts if v.file == f and v.impl in (FAILED, NOT_APPLICABLE)]
        if not rows:
            continue
        lines += [f"### `{f}`", "", "| test | impl | reason |", "|---|---|---|"]
        for v in rows:
            name = v.nodeid.split("::", 1)[1].replace("|", "\\|")
            impl, reason = v.impl.replace('_', ' '), v.reason.replace('|', '/')
            lines.append(f"| `{name}` | {impl} | {reason} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def gaps_markdown(verdicts: list[Verdict]) -> str:
    lines = ["# Features impl lacks, by vLLM tests that need them", "",
             "*blocked*: tests failing first on the feature; *need it*: failing tests whose "
             "inputs need it (a test may need several); *alone*: failing tests it is the "
             "only known gap of (what adding it alone should turn into passes).", "",
             "| feature | blocked | need it | alone | tests (names) |", "|---|---:|---:|---:|---|"]
    by_feature: dict[str, list[Verdict]] = defaultdict(list)
    need: Counter = Counter()
    alone: Counter = Counter()
    for v in verdicts:
        if v.impl == FAILED and v.feature:
            by_feature[v.feature].append(v)
        if v.impl == FAILED:
            need.update(v.needs)
            if len(v.needs) == 1:
                alone[v.needs[0]] += 1
    for feature, vs in sorted(by_feature.items(), key=lambda kv: -len(kv[1])):
        names = sorted({v.nodeid.split("::", 1)[1].split("[", 1)[0] for v in vs})
        more = f" (+{len(names) - 4})" if len(names) > 4 else ""
        shown = ", ".join(f"`{n}`" for n in names[:4]) + more
        lines.append(f"| {feature} | {len(vs)} | {need[feature]} | {alone[feature]} | {shown} |")
    other = [v for v in verdicts if v.impl == FAILED and not v.feature]
    lines += ["", f"Failing for another reason (a divergence or unclassified): {len(other)}", ""]
    for v in other:
        lines.append(f"- `{v.nodeid}`: {v.reason}")
    return "\n".join(lines) + "\n"


def not_runnable_markdown(rows: list[dict], lacking_files: list[str]) -> str:
    lines = ["", "## Not runnable on vLLM (in no impl count)", ""]
    if lacking_files:
        lines.append("Not in this release's sdist: " + ", ".join(f"`{f}`" for f in lacking_files))
        lines.append("")
    if not rows:
        return "\n".join(lines + ["None.", ""])
    lines += ["| test | on vLLM | reason |", "|---|---|---|"]
    for r in rows:
        what = "collection" if r["phase"] == "collect" else r["outcome"]
        lines.append(f"| `{r['nodeid']}` | {what} | {r['reason'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write(out: Path, version: str, verdicts: list[Verdict], seconds: float | None = None,
          not_runnable: list[dict] = (), lacking_files: list[str] = (),
          timing: dict | None = None) -> dict:
    summary = summarize(version, verdicts)
    summary["not_runnable_on_vllm"] = list(not_runnable)
    summary["files_not_in_sdist"] = list(lacking_files)
    if timing:
        summary["timing"] = timing
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(summary, verdicts, seconds)
                                    + not_runnable_markdown(list(not_runnable),
                                                            list(lacking_files)))
    (out / "gaps.md").write_text(gaps_markdown(verdicts))
    (out / "results.json").write_text(json.dumps([v.as_dict() for v in verdicts], indent=1) + "\n")
    return summary
