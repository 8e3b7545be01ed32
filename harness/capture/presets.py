"""Workload presets: small YAML files (traces/workloads/*.workload) that say what
traffic a scheduler-driven capture sends, and with which engine settings.

A preset is read with yaml.safe_load and checked field by field; a problem is
one PresetError naming file:line and the field. The shape (specs/CAPTURE.md):

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

import math
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.capture.errors import PresetError

WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "traces" / "workloads"
# Not .yaml: everything .yaml/.yml under traces/ is taken for a trace.
PRESET_SUFFIX = ".workload"
KINDS = ("chat", "few_shot", "rag", "sharegpt")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


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
        self.lines: dict[str, int] = {}
        if node is not None:
            self._index(node, "")

    def _index(self, node, prefix: str) -> None:
        import yaml

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

    def fail(self, where: str, message: str):
        line = self.lines.get(where)
        probe = where
        while line is None and probe:
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
            line = self.lines.get(probe)
        raise PresetError(self.path, line or 1, where or "(preset)", message)


def _int(doc: _Doc, where: str, v: Any, lo: int = 0, hi: int = 1 << 24) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        doc.fail(where, f"must be an integer, not {v!r}")
    if not lo <= v <= hi:
        doc.fail(where, f"must be in [{lo}, {hi}], not {v}")
    return v


def _float(doc: _Doc, where: str, v: Any, lo: float = 0.0, hi: float = 1.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        doc.fail(where, f"must be a number, not {v!r}")
    if not lo <= v <= hi:
        doc.fail(where, f"must be in [{lo}, {hi}], not {v}")
    return float(v)


def _bool(doc: _Doc, where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        doc.fail(where, f"must be true or false, not {v!r}")
    return v


def _str(doc: _Doc, where: str, v: Any) -> str:
    if not isinstance(v, (str, int)) or isinstance(v, bool):
        doc.fail(where, f"must be a string, not {v!r}")
    return str(v)


def _length(doc: _Doc, where: str, v: Any, lo: int = 0) -> Length:
    if isinstance(v, int) and not isinstance(v, bool):
        n = _int(doc, where, v, lo)
        return Length(n, n)
    if isinstance(v, list):
        if len(v) != 2:
            doc.fail(where, "a range is [lo, hi]")
        a, b = _int(doc, f"{where}[0]", v[0], lo), _int(doc, f"{where}[1]", v[1], lo)
        if a > b:
            doc.fail(where, f"range [{a}, {b}] is empty")
        return Length(a, b)
    if isinstance(v, dict):
        unknown = sorted(set(v) - {"lognormal", "min", "max"})
        if unknown:
            doc.fail(f"{where}.{unknown[0]}", "unknown field (lognormal, min, max)")
        ln = v.get("lognormal")
        if not (isinstance(ln, list) and len(ln) == 2):
            doc.fail(f"{where}.lognormal", "must be [mu, sigma]")
        mu = _float(doc, f"{where}.lognormal[0]", ln[0], -20, 20)
        sigma = _float(doc, f"{where}.lognormal[1]", ln[1], 0, 10)
        a = _int(doc, f"{where}.min", v.get("min", lo), lo)
        b = _int(doc, f"{where}.max", v.get("max", 1 << 16), a)
        return Length(a, b, (mu, sigma))
    doc.fail(where, f"a length is an int, [lo, hi] or {{lognormal: [mu, sigma], min, max}}, "
             f"not {v!r}")


def _choice(doc: _Doc, where: str, v: Any) -> Choice:
    if not isinstance(v, dict):
        doc.fail(where, "must be {fraction: f, values: [...]}")
    unknown = sorted(set(v) - {"fraction", "values"})
    if unknown:
        doc.fail(f"{where}.{unknown[0]}", "unknown field (fraction, values)")
    values = v.get("values", [])
    if not isinstance(values, list) or not values:
        doc.fail(f"{where}.values", "must be a non-empty list")
    return Choice(_float(doc, f"{where}.fraction", v.get("fraction", 0.0)),
                  tuple(_str(doc, f"{where}.values[{i}]", x) for i, x in enumerate(values)))


def _section(doc: _Doc, where: str, v: Any, cls: type, readers: dict) -> Any:
    """A mapping read into dataclass `cls`; `readers[name](where, value)`."""
    if v is None:
        return cls()
    if not isinstance(v, dict):
        doc.fail(where, "must be a mapping")
    names = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in v.items():
        sub = f"{where}.{key}"
        if key not in names or key not in readers:
            doc.fail(sub, f"unknown field (known: {', '.join(sorted(readers))})")
        kwargs[key] = readers[key](sub, value)
    return cls(**kwargs)


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
    known = {"name", "description", "seed", "kind", "engine", "requests", "admin",
             "max_steps", *KINDS}
    for key in d:
        if key not in known:
            doc.fail(str(key), f"unknown field (known: {', '.join(sorted(known))})")
    kind = d.get("kind")
    if kind not in KINDS:
        doc.fail("kind", f"must be one of {', '.join(KINDS)}, not {kind!r}")
    for other in KINDS:
        if other != kind and other in d:
            doc.fail(other, f"section for kind '{other}' in a '{kind}' preset")

    i = lambda lo=0, hi=1 << 24: (lambda w, v: _int(doc, w, v, lo, hi))  # noqa: E731
    f = lambda lo=0.0, hi=1.0: (lambda w, v: _float(doc, w, v, lo, hi))  # noqa: E731
    b = lambda w, v: _bool(doc, w, v)  # noqa: E731
    ln = lambda lo=0: (lambda w, v: _length(doc, w, v, lo))  # noqa: E731

    def algo(w, v):
        if v not in HASH_ALGOS:
            doc.fail(w, f"must be one of {', '.join(HASH_ALGOS)}")
        return v

    engine = _section(doc, "engine", d.get("engine"), EngineSpec, {
        "num_blocks": i(2, 1 << 22), "block_size": i(1, 4096), "max_num_seqs": i(1, 4096),
        "max_num_batched_tokens": i(1, 1 << 20), "max_model_len": i(1, 1 << 24),
        "enable_prefix_caching": b, "enable_chunked_prefill": b,
        "long_prefill_token_threshold": i(0, 1 << 20), "hash_algo": algo,
        "hash_seed": lambda w, v: _str(doc, w, v), "kv_events": b, "log_stats": b,
        "watermark": f(0.0, 1.0),
    })
    requests = _section(doc, "requests", d.get("requests"), RequestsSpec, {
        "count": i(1, 1 << 20), "arrivals_per_step": ln(0), "vocab": i(2, (1 << 31) - 1),
        "output_tokens": ln(1), "abort_probability": f(),
        "lora": lambda w, v: _choice(doc, w, v), "salts": lambda w, v: _choice(doc, w, v),
    })
    resets: list[ResetAt] = []
    admin = d.get("admin")
    if admin is not None:
        if not isinstance(admin, dict):
            doc.fail("admin", "must be a mapping")
        for key in admin:
            if key != "reset_prefix_cache":
                doc.fail(f"admin.{key}", "unknown field (known: reset_prefix_cache)")
        items = admin.get("reset_prefix_cache") or []
        if not isinstance(items, list):
            doc.fail("admin.reset_prefix_cache", "must be a list of {step, "
                     "reset_running_requests}")
        for n, item in enumerate(items):
            resets.append(_section(doc, f"admin.reset_prefix_cache[{n}]", item, ResetAt, {
                "step": i(0, 1 << 30), "reset_running_requests": b}))
    shape_readers = {
        "chat": {"num_system_prompts": i(1, 1024), "system_prompt_tokens": ln(1),
                 "conversations": i(1, 1 << 16), "turns": ln(1), "user_tokens": ln(1)},
        "few_shot": {"tasks": i(1, 1024), "instruction_tokens": ln(1),
                     "examples_per_task": i(1, 1024), "example_tokens": ln(1), "shots": ln(0),
                     "query_tokens": ln(1)},
        "rag": {"system_prompt_tokens": ln(0), "documents": i(1, 1 << 16),
                "document_tokens": ln(1), "docs_per_request": ln(0), "popularity": f(0, 10),
                "question_tokens": ln(1)},
        "sharegpt": {"input_tokens": ln(1), "repeat_fraction": f(), "system_prompt_fraction": f(),
                     "system_prompt_tokens": ln(1)},
    }[kind]
    shape = _section(doc, kind, d.get(kind), _SHAPES[kind], shape_readers)
    if engine.max_num_batched_tokens < 1 or engine.block_size > engine.max_model_len:
        doc.fail("engine.block_size", "must not exceed max_model_len")
    return Preset(
        name=_str(doc, "name", d.get("name", Path(path).name.removesuffix(PRESET_SUFFIX))),
        path=path,
        kind=kind,
        seed=_int(doc, "seed", d.get("seed", 0), 0, 1 << 62),
        description=_str(doc, "description", d.get("description", "")),
        engine=engine,
        requests=requests,
        resets=tuple(resets),
        shape=shape,
        max_steps=_int(doc, "max_steps", d.get("max_steps", 20000), 1, 1 << 30),
        engine_line=doc.lines.get("engine", 1),
    )
