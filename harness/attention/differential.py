"""The attention-output differential of a trace (DESIGN.md §7).

`check_attention(path)` replays the trace's allocations (steps.py), and for
every batch and every attention group (one layer each) writes the batch's keys
and values and runs attention through impl's kernels, the float64 reference and
vLLM's CPU attention ops (layer_check.py). The rows are seeded from each token's
prefix (seeded.py), or taken from the trace's tensors sidecar where it has the
step (sidecar.py; the recorded output is then compared too). With seeded rows
the differential also checks that every position a query can see holds the row
its own prefix would have written: a prefix-cache hit handing back a block of
another prefix is a divergence.

It stops at the first divergence, naming the step, the trace line of the
request's allocation, the request, position, head and dim of the worst element.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from harness.attention.compare import ErrorStats
from harness.attention.layer_check import (
    OUTPUT_CHECKS,
    PREFIX_CONTENT,
    BatchCheck,
    LayerCheck,
    LayerSetup,
    Problem,
    padded_len,
)
from harness.attention.seeded import STREAM_KEY, STREAM_QUERY, STREAM_VALUE, seeded_rows
from harness.attention.sidecar import RecordedTensors, SidecarError
from harness.attention.steps import ATTENTION_KINDS, StepBatch, iter_batches
from harness.attention.tolerances import torch_dtype
from harness.trace import TraceError, open_trace
from impl.attention_batch import build_attention_batch
from impl.kv_cache_tensors import KVCacheLayout

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    dtype: str | None = None  # default: the trace's model dtype
    # Query heads; default: the sidecar's, else 2 per kv head (GQA exercised).
    num_heads: int | None = None
    vllm: bool = True  # also compare with vLLM's CPU attention ops
    layout: KVCacheLayout = KVCacheLayout.CPU_ATTN
    kv_cache_dtype: str = "auto"
    device: str = "cpu"
    max_batches: int | None = None


@dataclass(slots=True)
class AttentionDivergence:
    step: int
    line: int  # trace line of the allocation that scheduled the request
    group: int
    check: str  # "impl~reference", "cache write", "prefix content", ...
    message: str

    def describe(self, path: str) -> str:
        return f"{path}:{self.line}: step {self.step}, group {self.group}: {self.check}: " \
               f"{self.message}"


@dataclass(slots=True)
class AttentionOutcome:
    path: str
    dtype: str = ""
    num_batches: int = 0
    num_tokens: int = 0
    recorded_batches: int = 0
    stats: dict[str, ErrorStats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    divergence: AttentionDivergence | None = None
    error: str | None = None
    error_code: int = 0
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error_code
        return EXIT_DIVERGED if self.divergence is not None else EXIT_OK

    def summary_lines(self) -> list[str]:
        """What `kvconform diff` prints for the attention part of a trace."""
        lines = [f"attention {self.path}: {self.dtype}, {self.num_batches} batches, "
                 f"{self.num_tokens} query tokens ({self.recorded_batches} recorded), "
                 f"{self.seconds:.1f}s"]
        for name, s in sorted(self.stats.items()):
            verdict = "ok" if s.ok else "FAIL"
            lines.append(f"  {name:<16} max abs {s.max_abs:.3e}  max rel {s.max_rel:.3e}  "
                         f"worst/tol {s.worst_ratio:.2f}  {verdict}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.error is not None:
            lines.append(f"  error: {self.error}")
        if self.divergence is not None:
            lines.append(f"  DIVERGED {self.divergence.describe(self.path)}")
        return lines

    def as_dict(self) -> dict:
        """JSON-able form, for `kvconform diff --json`."""
        d = self.divergence
        return {
            "path": self.path, "dtype": self.dtype, "batches": self.num_batches,
            "query_tokens": self.num_tokens, "recorded_batches": self.recorded_batches,
            "seconds": round(self.seconds, 3), "exit_code": self.exit_code,
            "stats": {name: s.as_dict() for name, s in sorted(self.stats.items())},
            "notes": list(self.notes), "error": self.error,
            "divergence": None if d is None else {
                "step": d.step, "line": d.line, "group": d.group, "check": d.check,
                "message": d.message},
        }


def wants_attention(path: str) -> bool:
    """Whether a trace asks for the attention differential (its header has a
    `model`). Reads the header only; unreadable traces answer False, the
    block-level run reports them."""
    try:
        return open_trace(path).header.model is not None
    except TraceError:
        return False


def _sidecar_path(trace_path: str, name: str) -> str:
    return name if os.path.isabs(name) else os.path.join(os.path.dirname(trace_path), name)


def check_attention(path: str, options: AttentionOptions = AttentionOptions()
                    ) -> AttentionOutcome:
    """Run the attention differential over one trace (which needs a `model`
    header). Never raises for bad input or environment: see outcome.error."""
    outcome = AttentionOutcome(path)
    t0 = time.perf_counter()
    try:
        _run(path, options, outcome)
    except TraceError as e:
        outcome.error, outcome.error_code = str(e), e.exit_code
    except (SidecarError, ValueError) as e:
        outcome.error, outcome.error_code = f"{path}: {e}", EXIT_BAD_INPUT
    except ImportError as e:
        outcome.error, outcome.error_code = f"{path}: {e}", EXIT_ENVIRONMENT
    finally:
        outcome.seconds = time.perf_counter() - t0
    return outcome


def _run(path: str, options: AttentionOptions, outcome: AttentionOutcome) -> None:
    trace = open_trace(path)
    header = trace.header
    if header.model is None:
        raise ValueError("the trace has no `model` header: nothing to size KV tensors with")
    recorded = None
    if header.tensors is not None:
        recorded = RecordedTensors(_sidecar_path(path, header.tensors))
    dtype = torch_dtype(options.dtype or header.model.dtype)
    outcome.dtype = str(dtype).removeprefix("torch.")
    layers = _layers(header, options, dtype, recorded, outcome)
    for batch in iter_batches(trace):
        if options.max_batches is not None and outcome.num_batches >= options.max_batches:
            outcome.notes.append(f"stopped at max_batches={options.max_batches}")
            break
        outcome.num_batches += 1
        outcome.num_tokens += sum(s.num_new for s in batch.scheduled)
        use_recorded = recorded is not None and recorded.has_step(batch.step)
        outcome.recorded_batches += use_recorded
        for g, layer in layers.items():
            divergence = _check_batch(batch, g, layer, recorded if use_recorded else None,
                                      outcome)
            if divergence is not None:
                outcome.divergence = divergence
                return


def _layers(header, options: AttentionOptions, dtype: torch.dtype,
            recorded: RecordedTensors | None, outcome: AttentionOutcome
            ) -> dict[int, LayerCheck]:
    model = header.model
    num_heads = (options.num_heads or (recorded and recorded.meta_int("num_heads"))
                 or getattr(model, "num_heads", None) or 2 * model.num_kv_heads)
    scale = (recorded and recorded.meta_float("scale")) or 1.0 / math.sqrt(model.head_size)
    layers: dict[int, LayerCheck] = {}
    for g, group in enumerate(header.cache.groups):
        if group.kind not in ATTENTION_KINDS:
            outcome.notes.append(f"group {g} ({group.kind}) is not paged attention: "
                                 "left out")
            continue
        window = getattr(group, "sliding_window", None) if group.kind == "sliding_window" \
            else None
        setup = LayerSetup(header.cache.num_blocks, group.block_size, num_heads,
                           model.num_kv_heads, model.head_size, dtype, scale, window,
                           options.kv_cache_dtype, options.layout, options.device)
        layers[g] = LayerCheck(setup, _vllm_layer(setup, options, outcome, g))
    if not layers:
        raise ValueError("no paged-attention group in the trace")
    return layers


def _vllm_layer(setup: LayerSetup, options: AttentionOptions, outcome: AttentionOutcome,
                g: int):
    if not options.vllm:
        return None
    if setup.kv_cache_dtype != "auto":
        outcome.notes.append(f"group {g}: vLLM's CPU op not compared for an fp8 cache")
        return None
    from harness.backends.vllm_cpu_attention import VllmCpuAttention, VllmUnavailable

    try:
        return VllmCpuAttention(setup.num_blocks, setup.block_size, setup.num_heads,
                                setup.num_kv_heads, setup.head_size, setup.dtype,
                                setup.scale, setup.sliding_window)
    except VllmUnavailable as e:
        raise ImportError(str(e)) from e
    except ValueError as e:  # a shape vLLM's CPU kernels refuse
        outcome.notes.append(f"group {g}: {e}; compared with the reference only")
        return None


def _rows(batch: StepBatch, spans, stream: int, heads: int, s: LayerSetup) -> torch.Tensor:
    parts = [seeded_rows(batch.hashes(r.req_id, r.positions), stream, heads, s.head_size,
                         s.dtype) for r in spans]
    if not parts:
        return torch.empty(0, heads, s.head_size, dtype=s.dtype)
    return torch.cat(parts)


def _pad(x: torch.Tensor, n: int) -> torch.Tensor:
    pad = torch.full((n - x.shape[0], *x.shape[1:]), float("nan"), dtype=x.dtype)
    return torch.cat([x, pad])


def _check_batch(batch: StepBatch, g: int, layer: LayerCheck,
                 recorded: RecordedTensors | None, outcome: AttentionOutcome
                 ) -> AttentionDivergence | None:
    s, table = layer.setup, batch.tables[g]
    check = BatchCheck()
    if batch.external:  # a KV connector's load: written, never queried
        ext = build_attention_batch(batch.external, table)
        layer.write(_rows(batch, batch.external, STREAM_KEY, s.num_kv_heads, s),
                    _rows(batch, batch.external, STREAM_VALUE, s.num_kv_heads, s),
                    ext.slot_mapping, check)
    if batch.scheduled:
        attn = build_attention_batch(batch.scheduled, table)
        n = attn.num_actual_tokens
        q, k, v, out = _inputs(batch, layer, recorded)
        total = padded_len(n)
        slots = torch.cat([attn.slot_mapping,
                           torch.full((total - n,), -1, dtype=torch.int64)])
        layer.write(_pad(k, total), _pad(v, total), slots, check)
        layer.attend(_pad(q, total), attn, check, out)
        check.row_owner = [(r.req_id, p) for r in batch.scheduled for p in r.positions]
        # Seeded rows identify their prefix; once recorded rows are in the cache
        # (an earlier recorded step), positions no longer hold seeded content.
        if recorded is None and outcome.recorded_batches == 0:
            _check_content(batch, g, layer, attn, check)
    for name, stats in check.stats.items():
        outcome.stats.setdefault(name, ErrorStats()).merge(stats)
    return _first_problem(batch, g, check)


def _inputs(batch: StepBatch, layer: LayerCheck, recorded: RecordedTensors | None):
    s = layer.setup
    if recorded is None:
        return (_rows(batch, batch.scheduled, STREAM_QUERY, s.num_heads, s),
                _rows(batch, batch.scheduled, STREAM_KEY, s.num_kv_heads, s),
                _rows(batch, batch.scheduled, STREAM_VALUE, s.num_kv_heads, s), None)
    rows = [recorded.rows(batch.step, r.req_id, r.num_new) for r in batch.scheduled]
    q, k, v = (torch.cat([getattr(r, f) for r in rows]).to(s.dtype)
               for f in ("query", "key", "value"))
    outs = [r.output for r in rows]
    out = None if any(o is None for o in outs) else torch.cat(outs)
    return q, k, v, out


def _check_content(batch: StepBatch, g: int, layer: LayerCheck, attn, check: BatchCheck
                   ) -> None:
    """Every position a query can see must hold its own prefix's rows."""
    s = layer.setup
    for i, r in enumerate(batch.scheduled):
        seq_len = r.num_computed + r.num_new
        lo = max(0, r.num_computed - s.sliding_window + 1) if s.sliding_window else 0
        positions = range(lo, seq_len)
        hashes = batch.hashes(r.req_id, positions)
        ok = layer.content_matches(
            attn.block_table[i], torch.arange(lo, seq_len),
            seeded_rows(hashes, STREAM_KEY, s.num_kv_heads, s.head_size, s.dtype),
            seeded_rows(hashes, STREAM_VALUE, s.num_kv_heads, s.head_size, s.dtype))
        if not ok.all():
            bad = lo + int((~ok).nonzero()[0])
            block = batch.tables[g].row(r.req_id)[bad // s.block_size]
            check.problems.append(Problem(
                PREFIX_CONTENT, f"request '{r.req_id}' position {bad} (block {block}) "
                "holds rows another prefix wrote, or none", r.req_id))
            return


def _first_problem(batch: StepBatch, g: int, check: BatchCheck) -> AttentionDivergence | None:
    line = batch.line
    if check.problems:
        p = check.problems[0]
        return AttentionDivergence(batch.step, batch.lines.get(p.req_id, line), g, p.check,
                                   p.message)
    for name in OUTPUT_CHECKS:
        stats = check.stats.get(name)
        if stats is None or stats.ok:
            continue
        token, head, dim = stats.worst_index
        req, pos = check.row_owner[token]
        return AttentionDivergence(
            batch.step, batch.lines.get(req, line), g, name,
            f"request '{req}' position {pos} head {head} dim {dim}: error "
            f"{stats.worst_ratio:.1f}x its tolerance (max abs {stats.max_abs:.3e}, "
            f"max rel {stats.max_rel:.3e}, {stats.nonfinite} non-finite)")
    return None
