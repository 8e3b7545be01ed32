"""The attention kinds: one row each, and every translation derived from it.

A row says what a trace calls the kind and which fields it needs, which spec
class impl and vLLM keep it with (vLLM's by name, resolved only when asked:
core imports no vllm), the release it arrived in and the profile flag that
gates it, how the fuzzer draws it and the few facts the capture and the
backends read (DCP sharding, the in-flight admission cap, ...).
CacheConfig's spec building, the vLLM backend's, the capture header's naming,
the peer conversion, the fuzz templates and the schema's kind enum all read
this table; `register` adds a platform plugin's kind at run time
(specs/KINDS.md: "Adding an attention kind").
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

# Where vLLM keeps its spec classes (a row naming a bare class means this module).
VLLM_SPECS = "vllm.v1.kv_cache_interface"

# Draws one of a kind's fields for a case of block size bs.
FieldDraw = Callable[[random.Random, int], int]
# A kind's spec values besides block_size and its trace fields (the group, the
# cache config), named as both sides' spec classes name them.
SpecValues = Callable[[object, object], dict]


@dataclass(frozen=True, slots=True)
class KindRow:
    """One attention kind, as every part of the harness knows it."""

    name: str  # the trace's name (specs/trace.schema.json), as vLLM's events name it
    impl_spec: type  # impl's spec class (impl/managers picks the manager by it)
    vllm_spec: str  # vLLM's spec class: "Class" in VLLM_SPECS, or "module:Class"
    vllm_manager: str  # the single-type manager vLLM keeps it with (the capture checks it)
    # Trace fields the kind requires besides block_size: named as both spec
    # classes name them, so the specs are built from them as they are.
    fields: tuple[str, ...] = ()
    # How the fuzzer draws each of `fields` (same order).
    draws: tuple[FieldDraw, ...] = ()
    # Spec values of its own the kind adds (None: none).
    values: SpecValues | None = None
    release: str = "0.17"  # the first followed release that has it
    since: str | None = None  # the impl/profiles.py VersionProfile flag that gates it
    # "alone": the fuzzer has a template of its name drawing it alone from
    # `draws`; "own": a template of its name written in harness/fuzz/configs.py;
    # None: drawn only inside other templates.
    fuzz: str | None = "alone"
    sharded: bool = True  # DCP may shard its blocks (dcp_sharded applies)
    hisparse: bool = False  # one of HiSparse's device groups
    # vLLM caps a request's admission by the tokens in flight (it recycles blocks).
    in_flight_cap: bool = False
    # Its cached blocks follow prefix_cache_retention_interval.
    retaining: bool = False
    # Its lookups scan from the left (lookahead hashing leaves them in range).
    prefix_scan: bool = False
    # Its cache_blocks keys nothing (any number of blocks, never a hash).
    never_keyed: bool = False
    # Its requests read an encoder's output (their events carry encoder tokens).
    encoder: bool = False
    # A connector may load its KV (external tokens); Mamba state and
    # encoder-decoder models take none.
    external_kv: bool = True

    def __post_init__(self) -> None:
        if len(self.draws) not in (0, len(self.fields)):
            raise ValueError(f"kind {self.name}: one draw per field ({self.fields})")
        if self.fuzz == "alone" and self.fields and not self.draws:
            raise ValueError(f"kind {self.name}: drawn alone, but no draws for {self.fields}")


def draw_window(rng: random.Random, bs: int) -> int:
    return max(1, rng.choice((1, 2, bs - 1, bs, bs + 1, 2 * bs, 3 * bs + 1, 5 * bs)))


def _sink(rng: random.Random, bs: int) -> int:
    return bs * rng.choice((1, 2))


def _chunk(rng: random.Random, bs: int) -> int:
    return max(rng.choice((bs, 2 * bs, 3 * bs, bs + 1, 2 * bs - 1)), 1)


def _rswa_window(rng: random.Random, bs: int) -> int:
    return max(1, rng.choice((1, bs - 1, bs, 2 * bs + 1, 5 * bs)))


def _blocks_per_request(rng: random.Random, bs: int) -> int:
    return rng.choice((1, 2, 3))


def hisparse_page_size(block_size: int) -> int:
    """Bytes of a HiSparse page: the manager never reads it (the one float32
    head of the other groups' specs)."""
    return block_size * 4


def _mla_values(g, config) -> dict:
    return {} if g.cache_role == "sparse" else {"cache_role": g.cache_role}


def _mamba_values(g, config) -> dict:
    return dict(mamba_cache_mode=config.mamba_cache_mode(g),
                num_speculative_blocks=g.num_speculative_blocks,
                num_prefill_checkpoint_blocks=g.num_prefill_checkpoint_blocks,
                prefill_checkpoint_alignment=g.prefill_checkpoint_alignment)


def _hisparse_values(g, config) -> dict:
    return {"page_size": hisparse_page_size(g.block_size)}


BUILTIN = (
    KindRow("full_attention", FullAttentionSpec, "FullAttentionSpec", "FullAttentionManager",
            prefix_scan=True),
    KindRow("mla_attention", MLAAttentionSpec, "MLAAttentionSpec", "FullAttentionManager",
            values=_mla_values, prefix_scan=True),
    KindRow("sink_full_attention", SinkFullAttentionSpec, "SinkFullAttentionSpec",
            "SinkFullAttentionManager", ("sink_len",), (_sink,), prefix_scan=True),
    KindRow("sliding_window", SlidingWindowSpec, "SlidingWindowSpec", "SlidingWindowManager",
            ("sliding_window",), (draw_window,), in_flight_cap=True, retaining=True),
    KindRow("chunked_local_attention", ChunkedLocalAttentionSpec, "ChunkedLocalAttentionSpec",
            "ChunkedLocalAttentionManager", ("attention_chunk_size",), (_chunk,),
            in_flight_cap=True),
    KindRow("mamba", MambaSpec, "MambaSpec", "MambaManager", values=_mamba_values,
            sharded=False, retaining=True, external_kv=False),
    # Encoder-decoder models: beside full attention, prefix caching off.
    KindRow("cross_attention", CrossAttentionSpec, "CrossAttentionSpec",
            "CrossAttentionManager", fuzz="own", encoder=True, external_kv=False),
    # Sparse MLA models (DeepSeek V4): a window over MLA latents.
    KindRow("sliding_window_mla", SlidingWindowMLASpec, "SlidingWindowMLASpec",
            "SlidingWindowManager", ("sliding_window",), (draw_window,), release="0.30",
            since="sparse_mla_groups", fuzz=None, in_flight_cap=True),
    # Named after their specs: events call them full_attention and unknown.
    KindRow("rswa", RSWASpec, "RSWASpec", "RSWAManager", ("rswa_window",), (_rswa_window,),
            release="0.26", since="rswa_groups", fuzz="own"),
    KindRow("circular_buffer", CircularBufferSpec, "CircularBufferSpec",
            "CircularBufferManager", release="0.29", since="circular_buffer_groups",
            fuzz="own", never_keyed=True),
    # HiSparse's device groups (specs/KV_CACHE_MANAGER.md §14; vLLM's events
    # call both kinds "unknown", the trace names them).
    KindRow("hisparse_resident", HiSparseResidentSpec, "HiSparseResidentSpec",
            "HiSparseResidentManager", values=_hisparse_values, release="0.32",
            since="hisparse", fuzz=None, sharded=False, hisparse=True, in_flight_cap=True,
            never_keyed=True),
    KindRow("hisparse_hot", HiSparseHotSpec, "HiSparseHotSpec", "HiSparseHotManager",
            ("blocks_per_request",), (_blocks_per_request,), values=_hisparse_values,
            release="0.32", since="hisparse", fuzz=None, sharded=False, hisparse=True,
            never_keyed=True),
)

_ROWS: dict[str, KindRow] = {r.name: r for r in BUILTIN}
# Bumped by every register/unregister: what is derived from the table (the
# schema, vLLM's classes) is cached per version.
_version = [0]


def rows() -> tuple[KindRow, ...]:
    """Every kind, the built-in ones first, in table order."""
    return tuple(_ROWS.values())


def names() -> tuple[str, ...]:
    return tuple(_ROWS)


def version() -> int:
    return _version[0]


def kind_row(name: str) -> KindRow:
    row = _ROWS.get(name)
    if row is None:
        raise ValueError(f"unknown attention kind '{name}' (known: {', '.join(_ROWS)})")
    return row


def register(row: KindRow) -> None:
    """Add a platform plugin's kind (a name taken already is refused: two rows
    for one name would make the order of imports decide)."""
    if row.name in _ROWS:
        raise ValueError(f"attention kind '{row.name}' has a row already")
    _ROWS[row.name] = row
    _version[0] += 1


def unregister(name: str) -> None:
    """Drop a registered kind (a built-in one stays)."""
    if any(r.name == name for r in BUILTIN):
        raise ValueError(f"'{name}' is a built-in kind")
    if _ROWS.pop(name, None) is not None:
        _version[0] += 1


def kind_fields() -> dict[str, tuple[str, ...]]:
    """Every kind's required trace fields."""
    return {r.name: r.fields for r in _ROWS.values()}


def all_kind_fields() -> tuple[str, ...]:
    """Every field some kind requires (each applies to its kinds only)."""
    out: dict[str, None] = {}
    for r in _ROWS.values():
        out.update(dict.fromkeys(r.fields))
    return tuple(out)


# -- building specs from the dataclass fields --------------------------------------


class SpecFieldMissing(ValueError):
    """A kind's value the spec class has no field for."""


def build_spec(cls: type, required: dict, offered: dict):
    """`cls` from `required` (every one set, or SpecFieldMissing) and the
    `offered` values its dataclass has a field for. A required value left at
    its unset form (None, 0) is dropped where the class lacks the field: a
    release before it had none."""
    have = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in offered.items() if k in have}
    for name, value in required.items():
        if name in have:
            kwargs[name] = value
        elif not (value is None or (type(value) is int and value == 0)):
            raise SpecFieldMissing(f"{cls.__name__} has no field {name} (={value!r})")
    return cls(**kwargs)


def spec_values(row: KindRow, g, config) -> dict:
    """The values the kind's spec is built with on either side: block_size,
    its trace fields, its own values, dcp_sharded when off."""
    out = {"block_size": g.block_size, **{f: g.value(f) for f in row.fields}}
    if row.values is not None:
        out.update(row.values(g, config))
    if not g.dcp_sharded:
        out["dcp_sharded"] = False
    return out


# The shape of the impl specs the harness builds (tiny: the manager never
# reads it; attention specs default to one float32 head).
_IMPL_SHAPE = {"shapes": ((1,),), "dtype_sizes": (4,)}


def impl_spec(g, config):
    """impl's spec of a group."""
    row = kind_row(g.kind)
    return build_spec(row.impl_spec, spec_values(row, g, config), _IMPL_SHAPE)


# -- vLLM's side (resolved lazily) --------------------------------------------------


def vllm_class(row: KindRow) -> type | None:
    """vLLM's spec class of `row` (None: the installed release has none)."""
    module, _, name = row.vllm_spec.rpartition(":")
    try:
        return getattr(importlib.import_module(module or VLLM_SPECS), name, None)
    except ImportError:
        return None


_BY_VLLM_CLASS: dict[int, dict[type, KindRow]] = {}


def _by_vllm_class() -> dict[type, KindRow]:
    table = _BY_VLLM_CLASS.get(version())
    if table is None:
        table = {}
        for row in _ROWS.values():
            cls = vllm_class(row)
            if cls is not None:
                table.setdefault(cls, row)
        _BY_VLLM_CLASS.clear()
        _BY_VLLM_CLASS[version()] = table
    return table


def row_of_vllm_spec(spec, exact: bool = False) -> KindRow | None:
    """The row of a vLLM spec instance: its own class's, else (unless `exact`)
    the nearest base class's with a row (an MLA spec is a full-attention spec)."""
    table = _by_vllm_class()
    classes = (type(spec),) if exact else type(spec).__mro__
    for cls in classes:
        if cls in table:
            return table[cls]
    return None
