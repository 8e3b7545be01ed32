"""impl against the golden vectors: every case of a release's files, run on
impl with that release's profile (impl/profiles.py), must give the file's
answers (specs/VECTORS.md).

- hashes.json: impl's NONE_HASH per algorithm and mode (a null one must be
  random: two derivations differ), and each case's block hashes;
- events.json: each trace's calls on impl give the step's events (the named
  form), impl's events laid out as the file's `wire` says encode to the
  step's bytes, and the bytes decode to the step's `decoded` and `events`.

Only the files are read: a mismatch is a line `file:line: field: message`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.backends.base import BackendError, kv_event_json
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest, PromptEmbeds
from harness.releases import vectors_format as fmt
from harness.trace.codec import cache_from_dict, event_from_dict
from impl.block_hash import none_hash as impl_none_hash
from impl.profiles import UnsupportedVersion, VersionProfile, get_profile
from impl.request import LoRA, MMFeature


@dataclass(slots=True)
class Mismatch:
    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.message}"


@dataclass(slots=True)
class CheckResult:
    release: str
    cases: int = 0  # hash cases and event steps checked
    mismatches: list[Mismatch] | None = None


class _Lines:
    """The line of a case or trace in a file (one item a line, vectors_format.dump)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._lines = path.read_text().splitlines()

    def of(self, key: str, value: str) -> int:
        probe = f'"{key}":{fmt._compact(value)}'
        for i, text in enumerate(self._lines, 1):
            if probe in text:
                return i
        return 1


def _profile(doc: dict, path: Path) -> VersionProfile:
    try:
        return get_profile(doc["vllm"])
    except (KeyError, UnsupportedVersion) as e:
        raise fmt.VectorsError(f"{path}:1: vllm: {e}") from None


# -- hashes ---------------------------------------------------------------------------


def _request(case: dict) -> AddRequest:
    lora = case.get("lora")
    emb = case.get("prompt_embeds")
    return AddRequest(
        req="r", prompt=list(case["tokens"]),
        lora=LoRA(lora["name"], lora["int_id"], lora.get("path", "")) if lora else None,
        cache_salt=case.get("cache_salt"),
        mm=tuple(MMFeature(m["identifier"], m["offset"], m["length"])
                 for m in case.get("mm", ())),
        prompt_embeds=PromptEmbeds(emb["dim"], emb["seed"]) if emb else None,
    )


def check_hashes(path: Path, doc: dict | None = None) -> tuple[int, list[Mismatch]]:
    doc = doc if doc is not None else fmt.load(path)
    profile = _profile(doc, path)
    lines = _Lines(path)
    found: list[Mismatch] = []
    seeds = doc["seeds"]
    for algo, row in doc["none_hash"].items():
        for mode, want in row.items():
            seed = seeds[mode]
            got = impl_none_hash(profile, algo, seed)
            if want is None:
                if got == impl_none_hash(profile, algo, seed):
                    found.append(Mismatch(lines.path, lines.of(algo, row),
                                          f"none_hash.{algo}.{mode}",
                                          f"random in vLLM, fixed in impl ({got.hex()})"))
            elif got.hex() != want:
                found.append(Mismatch(lines.path, lines.of(algo, row),
                                      f"none_hash.{algo}.{mode}", f"{want} != impl {got.hex()}"))
    for case in doc["cases"]:
        line = lines.of("id", case["id"])
        got = _impl_hashes(case, profile, seeds)
        if isinstance(got, str):
            found.append(Mismatch(lines.path, line, "case", f"{case['id']}: impl refuses: {got}"))
            continue
        problem = _first_hash_difference(case["block_hashes"], got)
        if problem:
            found.append(Mismatch(lines.path, line, "block_hashes", f"{case['id']}: {problem}"))
        emb = case.get("prompt_embeds")
        if emb and PromptEmbeds(emb["dim"], emb["seed"]).to_bytes(len(case["tokens"])).hex() \
                != emb["bytes"]:
            found.append(Mismatch(lines.path, line, "prompt_embeds.bytes",
                                  f"{case['id']}: not the bytes of its dim and seed"))
    return len(doc["cases"]), found


def _impl_hashes(case: dict, profile: VersionProfile, seeds: dict) -> list[str] | str:
    config = CacheConfig(num_blocks=16, groups=(GroupConfig(case["block_size"]),),
                         hash_algo=case["algorithm"], hash_seed=seeds[case["none_hash"]],
                         num_hash_lookahead_tokens=case.get("lookahead", 0))
    try:
        return ImplBackend(config, profile).run(_request(case))["block_hashes"]
    except (BackendError, ValueError) as e:
        return str(e)


def _first_hash_difference(want: list[str], got: list[str]) -> str | None:
    if len(want) != len(got):
        return f"{len(want)} hashes in the file, {len(got)} from impl"
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return f"[{i}] {a} != impl {b}"
    return None


# -- KV events ------------------------------------------------------------------------


def _impl_steps(trace: dict, profile: VersionProfile) -> list[list] | str:
    try:
        backend = ImplBackend(cache_from_dict(trace["cache"]), profile)
        out = []
        for step in trace["steps"]:
            for call in step["calls"]:
                backend.run(event_from_dict(call))
            out.append(list(backend.manager.take_events()))
    except (BackendError, ValueError, KeyError) as e:
        return str(e)
    return out


def _values(event) -> dict[str, Any]:
    return {f: getattr(event, f) for f in event.__slots__}


def check_events(path: Path, doc: dict | None = None) -> tuple[int, list[Mismatch]]:
    doc = doc if doc is not None else fmt.load(path)
    profile = _profile(doc, path)
    wire = doc["wire"]
    lines = _Lines(path)
    found: list[Mismatch] = []
    steps = 0
    for trace in doc["traces"]:
        name = trace["name"]
        line = lines.of("name", name)

        def miss(field: str, message: str, _line=line, _name=name) -> None:
            found.append(Mismatch(lines.path, _line, field, f"{_name}: {message}"))

        got = _impl_steps(trace, profile)
        if isinstance(got, str):
            miss("trace", f"impl refuses: {got}")
            continue
        for i, (step, raw) in enumerate(zip(trace["steps"], got)):
            steps += 1
            mine = [kv_event_json(type(e).__name__, _values(e)) for e in raw]
            if mine != step.get("events", []):
                miss(f"steps[{i}].events", _event_difference(step.get("events", []), mine))
            if "wire" not in step:
                continue
            problem = _wire_problem(wire, step, raw)
            if problem:
                miss(f"steps[{i}].{problem[0]}", problem[1])
    return steps, found


def _event_difference(want: list[dict], got: list[dict]) -> str:
    if len(want) != len(got):
        return f"{len(want)} events in the file, {len(got)} from impl"
    for i, (a, b) in enumerate(zip(want, got)):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return f"[{i}] {a.get('type')}.{key}: {a.get(key)!r:.80} != impl {b.get(key)!r:.80}"
    return "differ"


def _wire_problem(wire: dict, step: dict, raw: list) -> tuple[str, str] | None:
    """The first thing wrong between a step's bytes, its JSON and impl's events."""
    payload = bytes.fromhex(step["wire"])
    try:
        decoded = fmt.decode_batch(payload)
        named = [fmt.named_event(wire, e) for e in decoded[1]]
    except (ValueError, TypeError, IndexError, fmt.VectorsError) as e:
        return "wire", f"does not decode with the file's layout: {e}"
    if fmt.hexed(decoded) != step["decoded"]:
        return "decoded", "is not what the wire bytes decode to"
    if named != step["events"]:
        return "events", "are not the wire bytes' events"
    dp_rank = decoded[2] if len(decoded) > 2 else None
    encoded = fmt.wire_batch(wire, decoded[0], [
        fmt.wire_event(wire, type(e).__name__, _values(e)) for e in raw], dp_rank)
    if encoded != payload:
        return "wire", f"impl's events encode to {encoded.hex()[:80]}..."
    return None


def check_folder(folder: Path) -> CheckResult:
    """One release's folder; a file that cannot be read raises VectorsError."""
    hashes = fmt.load(folder / fmt.HASHES)
    events = fmt.load(folder / fmt.EVENTS)
    n1, m1 = check_hashes(folder / fmt.HASHES, hashes)
    n2, m2 = check_events(folder / fmt.EVENTS, events)
    return CheckResult(hashes["vllm"], n1 + n2, m1 + m2)


def release_folders(root: Path) -> list[Path]:
    """`root` itself when it holds a release's files, else its release folders."""
    if (root / fmt.HASHES).exists():
        return [root]
    found = sorted((p for p in root.iterdir() if (p / fmt.HASHES).exists()),
                   key=lambda p: _key(p.name)) if root.is_dir() else []
    if not found:
        raise fmt.VectorsError(f"{root}:1: path: no {fmt.HASHES} here or in a folder below")
    return found


def _key(name: str) -> tuple:
    from impl.releases import NotAVersion, release_key

    try:
        return release_key(name)
    except NotAVersion:
        return (1 << 30, 0, 0)
