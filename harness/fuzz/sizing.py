"""Fuzzing KV cache sizing: random model shapes, each sized by impl and by the
installed vLLM (harness/backends/sizing.py), until the time is up or one
differs (specs/SIZING.md, specs/FUZZING.md).

A shape draws one to three layer kinds (attention kinds, MLA, Mamba; heads,
head sizes, dtypes with fp8, windows and chunks near the block size),
interleaves them, and gives it one to four workers (tensor-parallel ranks
holding every layer, or pipeline stages holding a run of them) with memory
in bytes or near the blocks one request needs (one more, one byte less),
auto-fit, block overrides, layouts, TP and DCP sizes.

The gate runs it as a fuzz slice of its own (the kind config
harness/fuzz/kind_configs/model_shapes.yaml); a shape that differs is written
as a sizing corpus (kvconform-sizing/1) to rerun with `pytest FILE`.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, fields, replace

from harness.core.sizing_shape import DTYPE_SIZES, LAYOUTS, LayerShape, SizingShape, WorkerShape

_ATTENTION = ("full_attention", "sliding_window", "chunked_local_attention",
              "sink_full_attention")


@dataclass(frozen=True, slots=True)
class SizingFuzzConfig:
    """What shapes are drawn from (a kind config's `sizing:` mapping)."""

    layer_kinds: tuple[str, ...] = (*_ATTENTION, "mla_attention", "mamba")
    block_sizes: tuple[int, ...] = (1, 16, 32, 64, 128)
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float32", "fp8_e4m3", "fp8_e5m2")
    layouts: tuple[str, ...] = LAYOUTS
    max_workers: int = 4
    max_layers: int = 48

    @property
    def kinds(self) -> tuple[str, ...]:
        """The fuzz templates it needs of a release (none: sizing only)."""
        return ()

    @classmethod
    def from_dict(cls, data: dict) -> SizingFuzzConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"sizing: unknown field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _window(rng: random.Random, bs: int) -> int:
    return max(1, rng.choice((1, bs - 1, bs, bs + 1, 2 * bs, 128, 1024, 4096)))


def _layer(rng: random.Random, fc: SizingFuzzConfig, kind: str, bs: int) -> LayerShape:
    values: dict = {}
    if kind == "mamba":
        conv = (rng.choice((2, 3, 4)), rng.choice((64, 256, 1024)))
        ssm = (rng.choice((1, 4, 8)), rng.choice((16, 64)), rng.choice((16, 64, 128)))
        shapes = (conv, ssm) if rng.random() < 0.8 else (conv,)
        values["shapes"] = shapes
        if rng.random() < 0.3:
            values["num_speculative_blocks"] = rng.choice((1, 2, 3))
        dtypes = tuple(rng.choice(("bfloat16", "float16", "float32")) for _ in shapes)
        return LayerShape("mamba", bs, dtypes=dtypes, values=tuple(sorted(values.items())))
    dtype = rng.choice(fc.dtypes)
    if kind == "mla_attention":
        heads, head = 1, rng.choice((576, 320))
        values["max_tp_shards"] = 1
    else:
        heads, head = rng.choice((1, 2, 4, 8)), rng.choice((64, 80, 128, 256))
        if rng.random() < 0.3:
            values["max_tp_shards"] = rng.choice((1, 2, 4, 8))
    if dtype.startswith("fp8") and rng.random() < 0.7:
        values["kv_quant_mode"] = 1
    if kind == "sliding_window":
        values["sliding_window"] = _window(rng, bs)
    elif kind == "chunked_local_attention":
        values["attention_chunk_size"] = bs * rng.choice((1, 2, 4, 64))
    elif kind == "sink_full_attention":
        values["sink_len"] = bs * rng.choice((1, 2))
    return LayerShape(kind, bs, heads, head, dtype, values=tuple(sorted(values.items())))


def _workers(rng: random.Random, fc: SizingFuzzConfig, names: tuple[str, ...],
             need: int) -> tuple[WorkerShape, ...]:
    count = rng.randint(1, fc.max_workers)
    if count == 1 or rng.random() < 0.5:
        spans = [names] * count  # tensor-parallel ranks: every layer each
    else:
        cuts = sorted(rng.sample(range(1, len(names)), min(count, len(names)) - 1))
        bounds = [0, *cuts, len(names)]
        spans = [names[a:b] for a, b in zip(bounds, bounds[1:])]
    out = []
    for span in spans:
        # Mostly enough memory (a plan to compare), sometimes the edges.
        if rng.random() < 0.3:
            out.append(WorkerShape(span, memory=rng.choice((
                0, 1 << 20, 1 << 30, 5 << 30, rng.randint(1 << 28, 1 << 34),
                rng.randint(1 << 28, 1 << 34)))))
        else:
            blocks = rng.choice((1, need - 1, need, need, need + 1, 2 * need, 4 * need,
                                 rng.randint(need, 8 * need)))
            out.append(WorkerShape(span, memory_blocks=max(0, blocks),
                                   memory_extra=rng.choice((0, 0, -1, 1))))
    return tuple(out)


def _one_name_per_size(layer: LayerShape, names: dict) -> LayerShape:
    """The layer with each dtype replaced by the shape's one dtype of its byte
    size: impl's specs know a dtype by its size only (specs/SIZING.md, "known
    differences"), so bf16 beside fp16 in one model is left undrawn."""
    def pick(d: str) -> str:
        return names.setdefault(DTYPE_SIZES[d], d)

    return replace(layer, dtype=pick(layer.dtype), dtypes=tuple(pick(d) for d in layer.dtypes))


def draw_shape(rng: random.Random, fc: SizingFuzzConfig, name: str) -> SizingShape:
    bs = rng.choice(fc.block_sizes)
    kinds = [rng.choice(fc.layer_kinds) for _ in range(rng.randint(1, 3))]
    # Attention layers take the engine's block size (a Mamba layer may have
    # its own); distinct layer specs only, each its own label in the names.
    shapes = list(dict.fromkeys(
        _layer(rng, fc, k, bs if k != "mamba" or rng.random() < 0.5 else
               rng.choice(fc.block_sizes)) for k in kinds))
    by_size: dict[int, str] = {}
    shapes = list(dict.fromkeys(_one_name_per_size(x, by_size) for x in shapes))
    pattern = [rng.randrange(len(shapes)) for _ in range(rng.randint(1, 6))]
    repeat = rng.randint(1, max(1, fc.max_layers // len(pattern)))
    labels = (pattern * repeat)[:fc.max_layers]
    layers = tuple((f"model.layers.{i}.k{k}", shapes[k]) for i, k in enumerate(labels))
    max_model_len = rng.choice((16, 256, 1000, 4096, 32768, 131072))
    # Blocks of one request of full attention in every group, and the null block.
    need = -(-max_model_len // bs) * len(shapes) + 1
    names = tuple(n for n, _ in layers)
    return SizingShape(
        name, layers, _workers(rng, fc, names, need), max_model_len=max_model_len,
        auto_fit=rng.random() < 0.3,
        num_gpu_blocks_override=rng.choice((None,) * 8 + (1, need - 1, need, 2 * need,
                                                       rng.randint(1, 4096))),
        kv_cache_layout=rng.choice(("LBNHC",) * len(fc.layouts) + fc.layouts),
        tensor_parallel_size=rng.choice((1, 1, 2, 4, 8)),
        dcp_world_size=rng.choice((1,) * 9 + (2,)),
        enable_caching=rng.random() < 0.8,
        num_prefill_lookahead_tokens=rng.choice((0,) * 5 + (3,)),
        disable_hybrid_kv_cache_manager=rng.random() < 0.1,
        mamba_cache_mode=rng.choice(("none", "align")))


@dataclass(slots=True)
class SizingCampaign:
    seed: int
    cases: int = 0
    refused: int = 0  # shapes both sides refused alike
    vllm_crashed: int = 0  # shapes vLLM crashed on (nothing compared; not a finding)
    crash_example: str = ""  # the first of them, in one line
    fields: int = 0  # fields compared, over all shapes
    seconds: float = 0.0
    finding: object | None = None  # the SizingOutcome of the first shape that differed
    path: str | None = None  # where that shape was written


def case_rng(seed: int, case: int) -> random.Random:
    return random.Random(f"sizing:{seed}:{case}")


def fuzz_sizing(seconds: float, seed: int, fc: SizingFuzzConfig | None = None,
                out_dir: str | None = None, min_cases: int = 0,
                max_cases: int | None = None) -> SizingCampaign:
    """Draw and compare shapes for `seconds` (at least `min_cases` of them,
    at most `max_cases`); stop at the first difference."""
    from harness.backends.sizing import check_sizing
    from harness.backends.vllm_backend import installed_vllm_api, installed_vllm_profile

    fc = fc or SizingFuzzConfig()
    profile, api = installed_vllm_profile(), installed_vllm_api()
    result = SizingCampaign(seed)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or result.cases < min_cases:
        if max_cases is not None and result.cases >= max_cases:
            break
        shape = draw_shape(case_rng(seed, result.cases), fc,
                           f"fuzz-seed{seed}-case{result.cases}")
        outcome = check_sizing(shape, profile, api)
        result.cases += 1
        result.refused += outcome.refused
        result.fields += outcome.num_fields
        if outcome.crashed:
            result.vllm_crashed += 1
            result.crash_example = result.crash_example or outcome.report()
            continue
        if outcome.exit_code != 0:
            result.finding = outcome
            if out_dir is not None:
                result.path = write_finding(shape, out_dir)
            break
    result.seconds = time.perf_counter() - t0
    return result


def write_finding(shape: SizingShape, out_dir: str) -> str:
    """The shape as a one-shape sizing corpus (rerun: pytest FILE)."""
    import yaml

    from harness.sources.sizing_corpus import shape_document

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"sizing-{shape.name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(shape_document([shape]), f, sort_keys=False)
    return path
