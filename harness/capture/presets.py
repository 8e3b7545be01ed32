"""Workload presets: small YAML files (traces/workloads/*.workload) that say what
traffic a scheduler-driven capture sends, and with which engine settings.

A preset is read with yaml.safe_load and checked against
specs/workload.schema.json (as traces are against theirs), then read into the
dataclasses below, which hold the defaults; a problem is one PresetError naming
file:line and the field. The shape (specs/CAPTURE.md):

    description: what the workload is like
    seed: 1
    kind: chat            # chat | few_shot | rag | sharegpt
    engine: {num_blocks, block_size, max_num_seqs, max_num_batched_tokens, ...}
    requests: {count, arrivals_per_step, vocab, output_tokens, lora, salts, ...}
    admin: {reset_prefix_cache: [{step, reset_running_requests}]}
    chat: {...}           # the section named by `kind`

Lengths are an int, `[lo, hi]` (uniform, inclusive) or
`{lognormal: [mu, sigma], min: lo, max: hi}` (ShareGPT-like tails).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from harness.capture.errors import PresetError

WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "traces" / "workloads"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "specs" / "workload.schema.json"
# Not .yaml: everything .yaml/.yml under traces/ is taken for a trace.
PRESET_SUFFIX = ".workload"
KINDS = ("chat", "few_shot", "rag", "sharegpt")


@dataclass(frozen=True, slots=True)
class Length:
    lo: int
    hi: int
    lognormal: tuple[float, float] | None = None

    def draw(self, rng: random.Random) -> int:
        if self.lognormal is None:
            return rng.randint(self.lo, self.hi)
        mu, sigma = self.lognormal
        return min(self.hi, max(self.lo, round(math.exp(rng.gauss(mu, sigma)))))


@dataclass(frozen=True, slots=True)
class EngineSpec:
    num_blocks: int = 128
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    hash_algo: str = "sha256"
    hash_seed: str = "0"
    kv_events: bool = True
    log_stats: bool = True
    # 0.32's admission watermark (a fraction of the pool kept free).
    watermark: float = 0.0


@dataclass(frozen=True, slots=True)
class Choice:
    """With probability `fraction`, one of `values` (else none)."""

    fraction: float = 0.0
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestsSpec:
    count: int = 32
    arrivals_per_step: Length = Length(0, 2)
    vocab: int = 1000
    output_tokens: Length = Length(4, 32)
    # Per step, the chance that one live request is aborted (client gone).
    abort_probability: float = 0.0
    lora: Choice = Choice()
    salts: Choice = Choice()


@dataclass(frozen=True, slots=True)
class ResetAt:
    step: int
    reset_running_requests: bool = False


@dataclass(frozen=True, slots=True)
class ChatSpec:
    num_system_prompts: int = 1
    system_prompt_tokens: Length = Length(200, 200)
    # Conversations open at once; each turn waits for the previous answer.
    conversations: int = 8
    turns: Length = Length(2, 4)
    user_tokens: Length = Length(8, 48)


@dataclass(frozen=True, slots=True)
class FewShotSpec:
    tasks: int = 3
    instruction_tokens: Length = Length(32, 64)
    examples_per_task: int = 8
    example_tokens: Length = Length(24, 64)
    shots: Length = Length(2, 6)
    query_tokens: Length = Length(8, 32)


@dataclass(frozen=True, slots=True)
class RagSpec:
    system_prompt_tokens: Length = Length(48, 48)
    documents: int = 16
    document_tokens: Length = Length(96, 256)
    docs_per_request: Length = Length(1, 3)
    # Zipf exponent of document popularity (0: uniform).
    popularity: float = 1.1
    question_tokens: Length = Length(8, 32)


@dataclass(frozen=True, slots=True)
class ShareGPTSpec:
    input_tokens: Length = Length(4, 1024, (5.0, 1.1))
    # A user regenerating an answer resends an earlier prompt verbatim.
    repeat_fraction: float = 0.1
    # Share of requests that start with the one shared system prompt.
    system_prompt_fraction: float = 0.3
    system_prompt_tokens: Length = Length(64, 64)


_SHAPES = {"chat": ChatSpec, "few_shot": FewShotSpec, "rag": RagSpec, "sharegpt": ShareGPTSpec}


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    path: str
    kind: str
    seed: int = 0
    description: str = ""
    engine: EngineSpec = EngineSpec()
    requests: RequestsSpec = RequestsSpec()
    resets: tuple[ResetAt, ...] = ()
    shape: Any = field(default=None)
    # A safety net: the capture stops after this many scheduler steps.
    max_steps: int = 20000
    # Where `engine:` is, for errors vLLM's own config validation finds.
    engine_line: int = 1


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(PRESET_SUFFIX)
                  for p in WORKLOADS_DIR.glob(f"*{PRESET_SUFFIX}"))


def resolve(name_or_path: str) -> str:
    """A preset name (traces/workloads/NAME.workload) or a file path."""
    p = Path(name_or_path)
    if p.exists():
        return str(p)
    candidate = WORKLOADS_DIR / f"{name_or_path}{PRESET_SUFFIX}"
    if candidate.exists():
        return str(candidate)
    raise PresetError(name_or_path, 0, "(preset)", "no such preset or file (presets: "
                      f"{', '.join(preset_names())})")


# -- reading ------------------------------------------------------------------------------


class _Doc:
    """A parsed YAML document plus the line of every key, for error messages."""

    def __init__(self, path: str, text: str) -> None:
        import yaml

        self.path = path
        try:
            self.data = yaml.safe_load(text)
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise PresetError(path, mark.line + 1 if mark else 1, "(yaml)",
                              str(getattr(e, "problem", e))) from None
        except RecursionError:  # PyYAML's parser recurses once per nesting level
            raise PresetError(path, 1, "(yaml)", "nested too deeply") from None
        self.lines: dict[str, int] = {}
        self._seen: set[int] = set()
        if node is not None:
            self._index(node, "")

    def _index(self, node, prefix: str) -> None:
        import yaml

        # An alias is the node it names: indexed once, or a "billion laughs"
        # document of a few lines would take hours.
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}.{k.value}" if prefix else str(k.value)
                self.lines[key] = k.start_mark.line + 1
                self._index(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = f"{prefix}[{i}]"
                self.lines[key] = v.start_mark.line + 1
                self._index(v, key)

    def line_of(self, where: str) -> int:
        """The line of a field, or of the nearest enclosing one that has one."""
        line = self.lines.get(where)
        probe = where
        while line is None and probe:
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
            line = self.lines.get(probe)
        return line or 1

    def fail(self, where: str, message: str):
        raise PresetError(self.path, self.line_of(where), where or "(preset)", message)


# -- checking against specs/workload.schema.json ---------------------------------------------


@cache
def _validator():
    import jsonschema

    with open(SCHEMA_PATH) as f:
        return jsonschema.Draft7Validator(json.load(f))


def _where(path) -> str:
    """jsonschema's absolute_path as the field names errors use: a.b[0].c."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _in_range(e) -> str:
    return f"must be in [{e.schema.get('minimum')}, {e.schema.get('maximum')}], not {e.instance}"


# What each failed schema keyword says, in the loader's words.
_TYPE_WORDS = {"integer": "an integer", "number": "a number", "boolean": "true or false",
               "string": "a string", "object": "a mapping", "array": "a list"}
_MESSAGES = {
    "type": lambda e: (e.schema.get("x-message") or "must be "
                       + _TYPE_WORDS[[t for t in (e.validator_value if isinstance(
                           e.validator_value, list) else [e.validator_value]) if t != "null"][0]]
                       + ("" if isinstance(e.instance, (dict, list)) else f", not {e.instance!r}")),
    "minimum": _in_range,
    "maximum": _in_range,
    "enum": lambda e: f"must be one of {', '.join(map(str, e.validator_value))}, "
                      f"not {e.instance!r}",
    "required": lambda e: "missing",
    "additionalProperties": lambda e: "unknown field (known: "
                                      f"{', '.join(sorted(e.schema.get('properties', {})))})",
}


def _schema_error(doc: _Doc, errors) -> None:
    """Fail with the first error (in the file's order) in the loader's words."""

    def placed(e) -> tuple[str, str]:
        while e.validator == "oneOf" and e.context:
            # A length: report the form the value was written in.
            form = {int: 0, list: 1, dict: 2}.get(type(e.instance))
            inner = [c for c in e.context if c.schema_path and c.schema_path[0] == form]
            if not inner:
                break
            e = inner[0]
        where = _where(e.absolute_path)
        if e.validator in ("additionalProperties", "required"):
            # Name the field itself: the one too many, or the one missing.
            if e.validator == "required":
                key = next(k for k in e.validator_value if k not in e.instance)
            else:
                key = sorted(set(e.instance) - set(e.schema.get("properties", {})), key=str)[0]
            where = f"{where}.{key}" if where else str(key)
        elif e.validator in ("minItems", "maxItems", "oneOf") or e.validator not in _MESSAGES:
            return where, e.schema.get("x-message") or e.message
        return where, _MESSAGES[e.validator](e)

    first = min(errors, key=lambda e: (doc.line_of(_where(e.absolute_path)),
                                       _where(e.absolute_path)))
    doc.fail(*placed(first))


# -- reading into the dataclasses --------------------------------------------------------------


def _length(doc: _Doc, where: str, v: Any) -> Length:
    if isinstance(v, int):
        return Length(v, v)
    if isinstance(v, list):
        if v[0] > v[1]:
            doc.fail(where, f"range [{v[0]}, {v[1]}] is empty")
        return Length(v[0], v[1])
    lo = _length_floors()[where]
    a, b = v.get("min", lo), v.get("max", 1 << 16)
    if a > b:
        doc.fail(f"{where}.max", f"must be in [{a}, {1 << 24}], not {b}")
    mu, sigma = v["lognormal"]
    return Length(a, b, (float(mu), float(sigma)))


def _value(doc: _Doc, where: str, default: Any, v: Any) -> Any:
    """A schema-checked value as the field's type (the default's) wants it."""
    if isinstance(default, Length):
        return _length(doc, where, v)
    if isinstance(default, Choice):
        return Choice(float(v.get("fraction", 0.0)), tuple(str(x) for x in v["values"]))
    if isinstance(default, float):
        return float(v)
    if isinstance(default, str):
        return str(v)
    return v


def _section(doc: _Doc, where: str, v: dict | None, cls: type) -> Any:
    """A schema-checked mapping read into dataclass `cls` (its defaults fill in)."""
    defaults = cls()
    return cls(**{key: _value(doc, f"{where}.{key}", getattr(defaults, key), value)
                  for key, value in (v or {}).items()})


@cache
def _length_floors() -> dict[str, int]:
    """section.field -> the smallest value of that length (the schema's
    length_from_0 / length_from_1)."""
    out = {}
    for section, spec in _validator().schema["properties"].items():
        for name, prop in spec.get("properties", {}).items():
            ref = prop.get("$ref", "")
            if ref.startswith("#/definitions/length_from_"):
                out[f"{section}.{name}"] = int(ref.rsplit("_", 1)[1])
    return out


def load_preset(name_or_path: str) -> Preset:
    path = resolve(name_or_path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(path, 0, "(file)", str(e)) from None
    doc = _Doc(path, text)
    d = doc.data
    if not isinstance(d, dict):
        doc.fail("", "a preset is a YAML mapping")
    errors = list(_validator().iter_errors(d))
    if errors:
        _schema_error(doc, errors)
    kind = d["kind"]
    for other in KINDS:
        if other != kind and other in d:
            doc.fail(other, f"section for kind '{other}' in a '{kind}' preset")
    engine = _section(doc, "engine", d.get("engine"), EngineSpec)
    if engine.block_size > engine.max_model_len:
        doc.fail("engine.block_size", "must not exceed max_model_len")
    resets = ((d.get("admin") or {}).get("reset_prefix_cache") or [])
    return Preset(
        name=str(d.get("name", Path(path).name.removesuffix(PRESET_SUFFIX))),
        path=path,
        kind=kind,
        seed=d.get("seed", 0),
        description=str(d.get("description", "")),
        engine=engine,
        requests=_section(doc, "requests", d.get("requests"), RequestsSpec),
        resets=tuple(ResetAt(**r) for r in resets),
        shape=_section(doc, kind, d.get(kind), _SHAPES[kind]),
        max_steps=d.get("max_steps", 20000),
        engine_line=doc.lines.get("engine", 1),
    )
