"""A model shape to size a KV cache for: its layers (attention kind, heads,
dtype, kind fields), the engine knobs sizing reads, and the workers with
their memory (specs/SIZING.md).

Both sides of the sizing differential (harness/backends/sizing.py) build
their own specs and configs from it; the corpus (harness/sources/sizing_corpus.py)
reads it from YAML, the fuzzer (harness/fuzz/sizing.py) draws it, and the gate
derives one from every trace with a `model` header and every seeded workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A sizing corpus file says so in its first lines (traces/sizing/*.yaml);
# trace folders are walked past them (harness/trace/reader.py find_traces).
SIZING_FORMAT = "kvconform-sizing/1"
# Cache dtypes by name, with their bytes per element (fp8 caches are 1 byte).
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "uint8": 1, "int8": 1}
# The layouts vLLM 0.32 resolves a KV cache layout to (impl/kv_cache_layout.py).
LAYOUTS = ("LBNHC", "LBHNC", "BLHNC", "BLNHC", "LHBNC", "BHLNC")


def is_sizing_corpus(head: str) -> bool:
    """Whether a file's first few KiB say it is a sizing corpus."""
    return SIZING_FORMAT in head and "shapes:" in head


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One layer's KV cache spec, in the kinds table's names (harness/core/kinds.py):
    `values` are the spec's fields by name (sliding_window, page_size_padded,
    max_tp_shards, kv_quant_mode, Mamba's shapes and mamba_cache_mode, ...),
    each set only where the shape sets it."""

    kind: str
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 64
    dtype: str = "bfloat16"
    # Mamba: one dtype per state tensor (its `shapes` are in `values`).
    dtypes: tuple[str, ...] = ()
    values: tuple[tuple[str, object], ...] = ()

    def value(self, name: str, default=None):
        return dict(self.values).get(name, default)


@dataclass(frozen=True, slots=True)
class WorkerShape:
    """A worker (TP or PP rank): the layers it holds and its free memory, in
    bytes or in blocks of its own pool (`memory_blocks` x the bytes one block
    takes in its layers, plus `memory_extra` bytes, possibly negative: "just
    under n blocks")."""

    layers: tuple[str, ...]
    memory: int | None = None
    memory_blocks: int | None = None
    memory_extra: int = 0


@dataclass(frozen=True, slots=True)
class SizingShape:
    name: str
    layers: tuple[tuple[str, LayerShape], ...]
    workers: tuple[WorkerShape, ...]
    max_model_len: int = 4096
    # vLLM's max_model_len -1: shrunk to what the memory holds.
    auto_fit: bool = False
    num_gpu_blocks_override: int | None = None
    kv_cache_layout: str = "LBNHC"
    tensor_parallel_size: int = 1
    dcp_world_size: int = 1
    enable_caching: bool = True
    prefix_match_unit: int | None = None
    num_prefill_lookahead_tokens: int = 0
    disable_hybrid_kv_cache_manager: bool = False
    # The engine's Mamba cache mode (the Mamba layers' specs take it too).
    mamba_cache_mode: str = "none"
    max_in_flight_tokens: int | None = None
    max_num_encoder_input_tokens: int = 0
    # Where the shape came from, for reports: "file:line".
    where: str = ""
    # What the reference's answer must be, where the shape knows it already
    # (a trace's num_blocks): (field path, value) pairs.
    expect: tuple[tuple[str, object], ...] = field(default=())

    def layer_specs(self) -> dict[str, LayerShape]:
        return dict(self.layers)
