"""Trace objects <-> plain dicts (the JSON/YAML form), in both directions.

Encoding leaves out fields that have their default value, so traces stay small
and hand-written ones stay short; decoding fills them back in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import (
    EVENT_TYPES,
    AddRequest,
    Checkpoint,
    Event,
    HiSparseAck,
    HiSparseStep,
    LoRA,
    MMFeature,
    PromptEmbeds,
)
from harness.trace.schema import FORMAT


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Enough of the model to size KV tensors for attention replay."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: str
    # vLLM's --kv-cache-dtype: "auto" (the model's dtype) or an fp8 format.
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True, slots=True)
class TraceHeader:
    vllm_version: str
    source: str
    cache: CacheConfig
    description: str | None = None
    model: ModelShape | None = None
    tensors: str | None = None
    format: str = FORMAT
    # Set when the trace lacks its end (a capture whose server died): why.
    truncated: str | None = None


@dataclass(slots=True)
class TraceRecord:
    """One event of a trace with what the trace says about its answer."""

    line: int
    event: Event
    answer: dict | None = None  # recorded from vLLM
    expect: dict | None = None  # hand-derived subset of the answer
    note: str | None = None  # free text for people
    # Line of the recorded answer / expectation when it is not the event's own
    # line (YAML events span several lines).
    answer_line: int | None = None
    expect_line: int | None = None


_CACHE_DEFAULTS = CacheConfig(num_blocks=2)


_GROUP_DEFAULTS = GroupConfig(1)


def group_to_dict(g: GroupConfig) -> dict:
    """block_size first, then kind and the kind's fields that are set."""
    out: dict[str, Any] = {"block_size": g.block_size}
    for f in fields(GroupConfig):
        value = getattr(g, f.name)
        if f.name not in ("block_size", "params") and value != getattr(_GROUP_DEFAULTS, f.name):
            out[f.name] = value
    # A registered kind's fields, as the group's own (specs/KINDS.md).
    out.update(g.params)
    return out


def cache_to_dict(cache: CacheConfig) -> dict:
    out: dict[str, Any] = {
        "num_blocks": cache.num_blocks,
        "groups": [group_to_dict(g) for g in cache.groups],
    }
    for f in fields(CacheConfig):
        if f.name in ("num_blocks", "groups"):
            continue
        value = getattr(cache, f.name)
        if value != getattr(_CACHE_DEFAULTS, f.name):
            out[f.name] = value
    return out


def cache_from_dict(d: dict) -> CacheConfig:
    kwargs = {k: v for k, v in d.items() if k != "groups"}
    groups = tuple(GroupConfig.make(**g) for g in d["groups"])
    return CacheConfig(groups=groups, **kwargs)


def header_to_dict(h: TraceHeader) -> dict:
    out: dict[str, Any] = {"format": h.format, "vllm_version": h.vllm_version,
                           "source": h.source}
    if h.description:
        out["description"] = h.description
    out["cache"] = cache_to_dict(h.cache)
    if h.model is not None:
        # Defaults are left out: a trace written before a field existed
        # reads and writes back the same.
        out["model"] = {f.name: getattr(h.model, f.name) for f in fields(ModelShape)
                        if getattr(h.model, f.name) != f.default}
    if h.tensors is not None:
        out["tensors"] = h.tensors
    if h.truncated is not None:
        out["truncated"] = h.truncated
    return out


def header_from_dict(d: dict) -> TraceHeader:
    return TraceHeader(
        vllm_version=d["vllm_version"],
        source=d["source"],
        cache=cache_from_dict(d["cache"]),
        description=d.get("description"),
        model=ModelShape(**d["model"]) if "model" in d else None,
        tensors=d.get("tensors"),
        format=d["format"],
        truncated=d.get("truncated"),
    )


# Per event class: (field name, default) for the fields after `kind`.
_EVENT_FIELDS = {
    cls: [(f.name, f.default) for f in fields(cls)] for cls in EVENT_TYPES.values()
}


def event_to_dict(
    event: Event, answer: dict | None = None, expect: dict | None = None, note: str | None = None
) -> dict:
    out: dict[str, Any] = {"op": event.kind}
    for name, default in _EVENT_FIELDS[type(event)]:
        value = getattr(event, name)
        if value == default:
            continue
        if name == "lora":
            value = {"name": value.name, "int_id": value.int_id,
                     **({"path": value.path} if value.path else {})}
        elif name == "mm":
            value = [{"identifier": m.identifier, "offset": m.offset, "length": m.length}
                     for m in value]
        elif name == "prompt_embeds":
            value = {"dim": value.dim, "seed": value.seed}
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[name] = value
    if note is not None:
        out["note"] = note
    if expect is not None:
        out["expect"] = expect
    if answer is not None:
        out["answer"] = answer
    return out


_NOT_EVENT_FIELDS = ("op", "answer", "expect", "note")


def event_from_dict(d: dict) -> Event:
    """Build the event of a schema-valid dict."""
    op = d["op"]
    cls = EVENT_TYPES[op]
    kwargs = {k: v for k, v in d.items() if k not in _NOT_EVENT_FIELDS}
    if cls is AddRequest:
        if "lora" in kwargs:
            lo = kwargs["lora"]
            kwargs["lora"] = LoRA(lo["name"], lo["int_id"], lo.get("path", ""))
        if "mm" in kwargs:
            kwargs["mm"] = tuple(MMFeature(m["identifier"], m["offset"], m["length"])
                                 for m in kwargs["mm"])
        if "prompt_embeds" in kwargs:
            kwargs["prompt_embeds"] = PromptEmbeds(**kwargs["prompt_embeds"])
    elif cls is Checkpoint and "fields" in kwargs:
        kwargs["fields"] = tuple(kwargs["fields"])
    elif cls is HiSparseStep or cls is HiSparseAck:
        # Lists in the file, tuples in the event (as the fuzzer builds them).
        kwargs = {k: tuple(tuple(v) if isinstance(v, list) else v for v in value)
                  for k, value in kwargs.items()}
    return cls(**kwargs)
