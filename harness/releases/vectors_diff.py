"""`kvconform vectors diff A B`: what changes for a consumer of vLLM's block
hashes and KV events between two releases' vectors, field by field: NONE_HASH
derivation, algorithms, which inputs hash differently, the wire layout of
each event type, and which event fields change value in the traces.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from harness.releases import vectors_format as fmt


@dataclass(slots=True)
class Change:
    what: str
    before: str
    after: str


def _fold(items: list[str]) -> str:
    return ", ".join(items) if items else "-"


# -- hashes ---------------------------------------------------------------------------


def _derivation(row: dict, mode: str, seeds: dict) -> str:
    """How a NONE_HASH mode's value comes about, in words."""
    value = row.get(mode)
    if value is None:
        return "random per process"
    if mode == "unseeded":
        if value == row.get("fixed"):
            return f"hash_fn({seeds['fixed']!r})"
        return "fixed, other seed"
    return f"hash_fn({seeds[mode]!r})"


def _none_hash_changes(a: dict, b: dict) -> list[Change]:
    out = []
    for algo in sorted(set(a["none_hash"]) | set(b["none_hash"])):
        ra, rb = a["none_hash"].get(algo), b["none_hash"].get(algo)
        if ra is None or rb is None:
            continue  # the algorithm row says it
        for mode in ra:
            da, db = _derivation(ra, mode, a["seeds"]), _derivation(rb, mode, b["seeds"])
            if da != db or ra.get(mode) != rb.get(mode):
                value_note = "" if da != db else " (another value)"
                out.append(Change(f"NONE_HASH {algo} {mode}", da, db + value_note))
    return out


def _case_keys(case: dict) -> str:
    """A case's input family: its extra keys, or its sequence when plain."""
    name = case["id"].split("/", 2)[2]
    return name.split("+", 1)[1] if "+" in name else "plain tokens"


def _hash_changes(a: dict, b: dict) -> list[Change]:
    out = []
    algos_a, algos_b = a["algorithms"], b["algorithms"]
    if algos_a != algos_b:
        out.append(Change("hash algorithms", _fold(algos_a), _fold(algos_b)))
    cases_a = {c["id"]: c for c in a["cases"]}
    cases_b = {c["id"]: c for c in b["cases"]}
    changed: dict[str, set[str]] = defaultdict(set)
    same: dict[str, set[str]] = defaultdict(set)
    for cid in cases_a.keys() & cases_b.keys():
        ca, cb = cases_a[cid], cases_b[cid]
        bucket = changed if ca["block_hashes"] != cb["block_hashes"] else same
        bucket[_case_keys(ca)].add(f"{ca['algorithm']} {ca['none_hash']}")
    for keys in sorted(changed):
        out.append(Change(f"block hashes of {keys}", "", f"changed ({len(changed[keys])} of "
                          f"{len(changed[keys]) + len(same.get(keys, ()))} algorithm x "
                          f"NONE_HASH cases)"))
    for label, only in (("only in " + a["vllm"], cases_a.keys() - cases_b.keys()),
                        ("only in " + b["vllm"], cases_b.keys() - cases_a.keys())):
        every = cases_a | cases_b
        families = sorted({f"{_case_keys(every[c])} ({every[c]['none_hash']})" for c in only})
        if families:
            out.append(Change(f"hash cases {label}", *((_fold(families), "") if
                              label.endswith(a["vllm"]) else ("", _fold(families)))))
    unchanged = sorted(k for k in same if k not in changed)
    if unchanged:
        out.append(Change("block hashes unchanged", _fold(unchanged), "same"))
    return out


# -- KV events --------------------------------------------------------------------------


def _names(fields: list[dict]) -> list[str]:
    return [f["name"] for f in fields]


def _field_changes(kind: str, fa: list[dict], fb: list[dict]) -> list[Change]:
    na, nb = _names(fa), _names(fb)
    out = []
    removed = [n for n in na if n not in nb]
    added = [n for n in nb if n not in na]
    # A field gone and another new at the same position: a rename, most likely.
    for old in list(removed):
        pos = na.index(old)
        if pos < len(nb) and nb[pos] in added:
            out.append(Change(f"{kind} field renamed", old, nb[pos]))
            removed.remove(old)
            added.remove(nb[pos])
    for n in removed:
        out.append(Change(f"{kind} field removed", f"{n} (#{na.index(n)})", "-"))
    for n in added:
        req = "required" if fb[nb.index(n)]["required"] else "optional"
        out.append(Change(f"{kind} field added", "-", f"{n} (#{nb.index(n)}, {req})"))
    common_a = [n for n in na if n in nb]
    common_b = [n for n in nb if n in na]
    if common_a != common_b:
        out.append(Change(f"{kind} field order", _fold(common_a), _fold(common_b)))
    req_a = {f["name"]: f["required"] for f in fa}
    for f in fb:
        if f["name"] in req_a and req_a[f["name"]] != f["required"]:
            out.append(Change(f"{kind}.{f['name']}", "required" if req_a[f["name"]] else
                              "optional", "required" if f["required"] else "optional"))
    return out


def _header(wire: dict, kind: str) -> str:
    """The width of an event's map or array header (vectors_format.wire_event)."""
    entries = len(wire["events"][kind]) + 1
    return "16-bit count" if entries > 15 else "fix (4-bit count)"


def _wire_changes(a: dict, b: dict) -> list[Change]:
    wa, wb = a["wire"], b["wire"]
    out = []
    if wa["layout"] != wb["layout"]:
        out.append(Change("event layout", wa["layout"], wb["layout"]))
    for kind in sorted(set(wa["events"]) | set(wb["events"])):
        if kind not in wa["events"] or kind not in wb["events"]:
            out.append(Change(f"event type {kind}", "yes" if kind in wa["events"] else "-",
                              "yes" if kind in wb["events"] else "-"))
            continue
        out += _field_changes(kind, wa["events"][kind], wb["events"][kind])
        ha, hb = _header(wa, kind), _header(wb, kind)
        if ha != hb:
            out.append(Change(f"{kind} header", ha, hb))
    out += _field_changes("batch", wa["batch"]["fields"], wb["batch"]["fields"])
    for which in ("publish", "replay"):
        fa, fb = a["frames"].get(which), b["frames"].get(which)
        if fa != fb:
            out.append(Change(f"{which} message frames", _fold(fa or []), _fold(fb or [])))
    return out


def _trace_changes(a: dict, b: dict) -> list[Change]:
    ta = {t["name"]: t for t in a["traces"]}
    tb = {t["name"]: t for t in b["traces"]}
    out = []
    for name in sorted(ta.keys() ^ tb.keys()):
        out.append(Change(f"trace {name}", "runs" if name in ta else "skipped",
                          "runs" if name in tb else "skipped"))
    values: dict[str, set[str]] = defaultdict(set)
    present: dict[tuple[str, str], set[str]] = defaultdict(set)
    wire_changed = steps = 0
    for name in sorted(ta.keys() & tb.keys()):
        for sa, sb in zip(ta[name]["steps"], tb[name]["steps"]):
            steps += 1
            wire_changed += sa.get("wire") != sb.get("wire")
            for ea, eb in zip(sa.get("events", []), sb.get("events", [])):
                kind = ea["type"]
                for key in sorted(set(ea) | set(eb)):
                    if key in ea and key not in eb:
                        present[(kind, key)].add("gone")
                    elif key in eb and key not in ea:
                        present[(kind, key)].add("new")
                    elif ea[key] != eb[key]:
                        values[f"{kind}.{key}"].add(name.split("/")[0])
            if len(sa.get("events", [])) != len(sb.get("events", [])):
                values["(events per step)"].add(name)
    for (kind, key), how in sorted(present.items()):
        out.append(Change(f"{kind}.{key} in events", "set" if "gone" in how else "absent",
                          "set" if "new" in how else "absent"))
    for key, names in sorted(values.items()):
        out.append(Change(f"{key} values", "", f"differ in {_fold(sorted(names))}"))
    if steps:
        out.append(Change("wire bytes of common steps", f"{steps} steps",
                          f"{wire_changed} differ"))
    return out


def diff_folders(fa: Path, fb: Path) -> tuple[dict, dict, list[Change]]:
    ha, hb = fmt.load(fa / fmt.HASHES), fmt.load(fb / fmt.HASHES)
    ea, eb = fmt.load(fa / fmt.EVENTS), fmt.load(fb / fmt.EVENTS)
    changes = (_none_hash_changes(ha, hb) + _hash_changes(ha, hb) + _wire_changes(ea, eb)
               + _trace_changes(ea, eb))
    return ha, hb, changes


def format_changes(a: str, b: str, changes: list[Change], width: int = 100) -> str:
    def cut(s: str) -> str:
        return s if len(s) <= width else s[:width - 3] + "..."

    head = ("what", a, b)
    rows = [(c.what, cut(c.before), cut(c.after)) for c in changes]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
