"""The attention-output differential of a trace.

`check_attention(path)` is the one entry point (what `kvconform diff`, the gate
and `pytest traces/` run for traces with a `model` header). It replays the
trace's allocations (steps.py), and for every batch and every attention group
(one layer each: full, sliding window, chunked local, static sinks, MLA)

- keeps the block ledger (ledger.py): the slot mapping, the block-table rows
  and what every visible slot holds, checked against the trace's own answers;
- writes the batch's keys and values and runs attention through impl's
  kernels, the float64 reference and vLLM's CPU attention ops, comparing the
  outputs within the error model's allowances (layer_check.py, tolerances.py).

The rows are seeded from each token's prefix (seeded.py), or taken from the
trace's tensors sidecar where it has the step (sidecar.py; the recorded output
of the recorded layer's group is then compared too).

It stops at the first divergence, naming the step, the trace line of the
request's allocation, the check, and the request, position, head and dim of
the worst element. The outcome's exit code (harness/core/exit_codes.py): OK,
DIVERGED, BAD_INPUT (no `model` header, a bad sidecar, an unknown dtype) or
ENVIRONMENT (vLLM's ops missing, or failing on a layer vLLM declares it
serves). A layer vLLM declares it does not serve is compared with the
reference only, and the outcome says so (`vllm_groups`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.attention.compare import ErrorStats
from harness.attention.kinds import AttentionKind
from harness.attention.layer_check import (
    OUTPUT_CHECKS,
    BatchCheck,
    LayerCheck,
    LayerSetup,
    Problem,
    padded_len,
)
from harness.attention.ledger import BlockLedger, LedgerProblem, identities
from harness.attention.seeded import (
    STREAM_KEY,
    STREAM_QUERY,
    STREAM_VALUE,
    PrefixHasher,
    seeded_rows,
)
from harness.attention.sidecar import RecordedTensors, SidecarError
from harness.attention.steps import ATTENTION_KINDS, StepBatch, iter_batches
from harness.attention.tolerances import dtype_name, torch_dtype
from harness.core.exit_codes import ExitCode
from harness.trace import TraceError, open_trace
from impl.attention_batch import ScheduledRequest, build_attention_batch
from impl.kv_cache_tensors import KVCacheLayout

# MLA groups run with DeepSeek V2/V3's latent row (kv_lora_rank 512 + rope
# 64), the one vLLM's CPU MLA kernel serves.
MLA_LATENT, MLA_ROPE = 512, 64
# Identity chain of the static sink tokens (ledger): no request's prefix.
_SINK_SEED = 0x51A7C5


class BadTrace(ValueError):
    """The trace cannot be checked as it stands (exit code 2)."""


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    dtype: str | None = None  # default: the trace's model dtype
    # Query heads; default: the sidecar's, else 2 per kv head (GQA exercised).
    num_heads: int | None = None
    vllm: bool = True  # also compare with vLLM's CPU attention ops
    layout: KVCacheLayout = KVCacheLayout.CPU_ATTN
    kv_cache_dtype: str | None = None  # default: the trace's model (its --kv-cache-dtype)
    # Per-tensor scales of an fp8 cache.
    k_scale: float = 1.0
    v_scale: float = 1.0
    device: str = "cpu"
    max_batches: int | None = None
    # Called after each batch checked (a progress display).
    on_batch: Callable[[], None] | None = None


@dataclass(slots=True)
class AttentionDivergence:
    step: int
    line: int  # trace line of the allocation that scheduled the request
    group: int
    check: str  # "impl~reference", "cache write", "block table", ...
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
    # Per group checked: "compared" or why vLLM's ops were not (its own
    # declarations, or the comparison switched off by the caller).
    vllm_groups: dict[int, str] = field(default_factory=dict)
    divergence: AttentionDivergence | None = None
    error: str | None = None
    error_code: ExitCode = ExitCode.OK
    # The environment error is this processor's (vLLM's kernels need an
    # instruction set it lacks): what it lacks, in vLLM's words.
    machine_lacks: str | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> ExitCode:
        if self.error is not None:
            return self.error_code
        return ExitCode.DIVERGED if self.divergence is not None else ExitCode.OK

    def summary_lines(self) -> list[str]:
        """What `kvconform diff` prints for the attention part of a trace."""
        lines = [f"attention {self.path}: {self.dtype}, {self.num_batches} batches, "
                 f"{self.num_tokens} query tokens ({self.recorded_batches} recorded), "
                 f"{self.seconds:.1f}s"]
        for name, s in sorted(self.stats.items()):
            verdict = "ok" if s.ok else "FAIL"
            lines.append(f"  {name:<16} max abs {s.max_abs:.3e}  max rel {s.max_rel:.3e}  "
                         f"worst/allowed {s.worst_ratio:.2f}  (|values| up to "
                         f"{s.max_value:.2g})  {verdict}")
        for g, what in sorted(self.vllm_groups.items()):
            if what != "compared":
                lines.append(f"  note: group {g}: vLLM not compared: {what}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.error is not None:
            lines.append(f"  error: {self.error}")
        if self.divergence is not None:
            lines.append(f"  DIVERGED {self.divergence.describe(self.path)}")
        return lines

    def failure_message(self) -> str | None:
        """One line for a JUnit failure/error (None when OK)."""
        if self.error is not None:
            return self.error
        if self.divergence is not None:
            return self.divergence.describe(self.path)
        return None

    def as_dict(self) -> dict:
        """JSON-able form, for `kvconform diff --json`."""
        d = self.divergence
        return {
            "path": self.path, "dtype": self.dtype, "batches": self.num_batches,
            "query_tokens": self.num_tokens, "recorded_batches": self.recorded_batches,
            "seconds": round(self.seconds, 3), "exit_code": int(self.exit_code),
            "stats": {name: s.as_dict() for name, s in sorted(self.stats.items())},
            "vllm_groups": {str(g): v for g, v in sorted(self.vllm_groups.items())},
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
    """The sidecar's path, inside the trace's folder: a gate fed captured
    traces must not open files elsewhere on a trace's say-so (symlinks
    followed before the check)."""
    folder = os.path.realpath(os.path.dirname(trace_path) or ".")
    path = os.path.realpath(os.path.join(folder, name))
    if os.path.isabs(name) or os.path.commonpath([folder, path]) != folder:
        raise TraceError(trace_path, 1, "tensors",
                         f"'{name}' is outside the trace's folder; a sidecar lies beside "
                         "its trace")
    return path


def check_attention(path: str, options: AttentionOptions = AttentionOptions()
                    ) -> AttentionOutcome:
    """Run the attention differential over one trace (which needs a `model`
    header). Never raises for bad input or environment: see outcome.error."""
    from harness.backends.vllm_cpu_attention import ProcessorUnsupported, VllmUnavailable

    outcome = AttentionOutcome(path)
    t0 = time.perf_counter()
    try:
        _run(path, options, outcome)
    except TraceError as e:
        outcome.error, outcome.error_code = str(e), ExitCode(e.exit_code)
    except (SidecarError, BadTrace) as e:
        outcome.error, outcome.error_code = f"{path}: {e}", ExitCode.BAD_INPUT
    except ProcessorUnsupported as e:
        outcome.error, outcome.error_code = f"{path}: {e}", ExitCode.ENVIRONMENT
        outcome.machine_lacks = str(e)
    except VllmUnavailable as e:
        outcome.error, outcome.error_code = f"{path}: {e}", ExitCode.ENVIRONMENT
    finally:
        outcome.seconds = time.perf_counter() - t0
    return outcome


@dataclass(slots=True)
class _Group:
    index: int
    layer: LayerCheck
    ledger: BlockLedger
    recorded: bool  # the sidecar's layer is of this group


def _run(path: str, options: AttentionOptions, outcome: AttentionOutcome) -> None:
    trace = open_trace(path)
    header = trace.header
    if header.model is None:
        raise BadTrace("model: the trace has no `model` header: nothing to size KV tensors "
                       "with")
    recorded = None
    if header.tensors is not None:
        try:
            recorded = RecordedTensors(_sidecar_path(path, header.tensors))
        except SidecarError as e:
            raise TraceError(path, 1, "tensors", str(e)) from None
    try:
        dtype = torch_dtype(options.dtype or header.model.dtype)
    except ValueError as e:
        raise BadTrace(f"model.dtype: {e}") from None
    outcome.dtype = dtype_name(dtype)
    groups = _groups(header, options, dtype, recorded, outcome)
    for batch in iter_batches(trace):
        if options.max_batches is not None and outcome.num_batches >= options.max_batches:
            outcome.notes.append(f"stopped at max_batches={options.max_batches}")
            break
        outcome.num_batches += 1
        outcome.num_tokens += sum(s.num_new for s in batch.scheduled)
        use_recorded = recorded is not None and recorded.has_step(batch.step)
        outcome.recorded_batches += use_recorded
        for group in groups:
            divergence = _check_batch(batch, group, recorded if use_recorded else None,
                                      outcome)
            if divergence is not None:
                outcome.divergence = divergence
                return
        if options.on_batch is not None:
            options.on_batch()


def _kind(group) -> AttentionKind:
    if group.kind == "sliding_window":
        return AttentionKind("sliding_window", sliding_window=group.sliding_window)
    if group.kind == "chunked_local_attention":
        return AttentionKind("chunked_local", chunk_size=group.attention_chunk_size)
    if group.kind == "sink_full_attention":
        return AttentionKind("static_sink", sink_len=group.sink_len)
    if group.kind == "mla_attention":
        return AttentionKind("mla", mla_rope_dim=MLA_ROPE)
    return AttentionKind("full")


def _groups(header, options: AttentionOptions, dtype: torch.dtype,
            recorded: RecordedTensors | None, outcome: AttentionOutcome) -> list[_Group]:
    model = header.model
    num_heads = (options.num_heads or (recorded and recorded.meta_int("num_heads"))
                 or getattr(model, "num_heads", None) or 2 * model.num_kv_heads)
    recorded_window = recorded.meta_int("sliding_window") if recorded is not None else None
    groups: list[_Group] = []
    for g, group in enumerate(header.cache.groups):
        if group.kind not in ATTENTION_KINDS:
            outcome.notes.append(f"group {g} ({group.kind}) left out: "
                                 + ("no attention" if group.kind == "mamba" else
                                    "the trace carries no encoder tokens (cross attention "
                                    "is checked at kernel level)"))
            continue
        kind = _kind(group)
        kv_heads, head_size = model.num_kv_heads, model.head_size
        scale = (recorded and recorded.meta_float("scale")) or 1.0 / math.sqrt(head_size)
        if kind.is_mla:
            kv_heads, head_size = 1, MLA_LATENT + MLA_ROPE
            scale = 1.0 / math.sqrt(head_size)
        setup = LayerSetup(header.cache.num_blocks, group.block_size, num_heads, kv_heads,
                           head_size, dtype, scale, kind,
                           options.kv_cache_dtype or model.kv_cache_dtype,
                           options.layout, options.device, options.k_scale, options.v_scale)
        layer = LayerCheck(setup, _vllm_layer(setup, options, outcome, g))
        is_recorded = (recorded is not None and not kind.is_mla
                       and kind.sliding_window == recorded_window
                       and not any(x.recorded for x in groups))
        groups.append(_Group(g, layer, BlockLedger(setup.num_blocks, setup.block_size),
                             is_recorded))
        if kind.sink_len:
            _write_sinks(groups[-1])
    if not groups:
        raise BadTrace("cache.groups: no attention group in the trace")
    if recorded is not None and not any(x.recorded for x in groups):
        outcome.notes.append("the sidecar's layer matches no group: recorded outputs "
                             "not compared")
    return groups


def _vllm_layer(setup: LayerSetup, options: AttentionOptions, outcome: AttentionOutcome,
                g: int):
    if not options.vllm:
        outcome.vllm_groups[g] = "switched off (AttentionOptions.vllm=False)"
        return None
    from harness.backends.vllm_cpu_attention import VllmCpuAttention, unsupported_reason

    reason = unsupported_reason(setup.kind, setup.head_size, setup.block_size, setup.dtype,
                                setup.kv_cache_dtype)
    if reason is not None:
        outcome.vllm_groups[g] = f"{reason}; compared with the reference only"
        return None
    try:
        layer = VllmCpuAttention(setup.num_blocks, setup.block_size, setup.num_heads,
                                 setup.num_kv_heads, setup.head_size, setup.dtype,
                                 setup.scale, setup.kind, setup.kv_cache_dtype,
                                 setup.k_scale, setup.v_scale)
    except ValueError as e:  # vLLM's own ISA choice refuses the layer
        outcome.vllm_groups[g] = f"{e}; compared with the reference only"
        return None
    outcome.vllm_groups[g] = "compared"
    return layer


def _write_sinks(group: _Group) -> None:
    """Static sink tokens, written once into the blocks after the null block."""
    s = group.layer.setup
    n = s.kind.sink_len
    slots = torch.arange(s.block_size, s.block_size + n)
    hasher = PrefixHasher(_SINK_SEED)
    hasher.extend(list(range(n)))
    k = seeded_rows(hasher.hashes, STREAM_KEY, s.num_kv_heads, s.head_size, s.dtype)
    v = seeded_rows(hasher.hashes, STREAM_VALUE, s.num_kv_heads, s.head_size, s.dtype)
    check = BatchCheck()
    group.layer.write(k, v, slots, check)
    group.ledger.record(slots, identities(hasher.hashes), group.layer.expected_hashes(k, v),
                        None, torch.arange(n), -1)


def _rows(batch: StepBatch, spans, stream: int, heads: int, s: LayerSetup) -> torch.Tensor:
    parts = [seeded_rows(batch.hashes(r.req_id, r.positions), stream, heads, s.head_size,
                         s.dtype) for r in spans]
    if not parts:
        return torch.empty(0, heads, s.head_size, dtype=s.dtype)
    return torch.cat(parts)


def _pad(x: torch.Tensor | None, n: int) -> torch.Tensor | None:
    if x is None:
        return None
    pad = torch.full((n - x.shape[0], *x.shape[1:]), float("nan"), dtype=x.dtype)
    return torch.cat([x, pad])


def _write(batch: StepBatch, group: _Group, spans: list[ScheduledRequest], key, value,
           check: BatchCheck, pad_to: int | None = None) -> None:
    """Check the kernels' slots against the ledger, write, record."""
    table, ledger, layer = batch.tables[group.index], group.ledger, group.layer
    rows = batch.trace_rows[group.index]
    attn = build_attention_batch(spans, table)
    trace_slots, start = [], 0
    for r in spans:
        got = attn.slot_mapping[start:start + r.num_new]
        start += r.num_new
        want = ledger.check_writes(r.req_id, torch.arange(r.num_computed,
                                                         r.num_computed + r.num_new),
                                   got, rows.get(r.req_id))
        if isinstance(want, LedgerProblem):
            check.problems.append(Problem(want.check, want.message, want.req_id))
            return
        trace_slots.append(want)
    slots = attn.slot_mapping
    if pad_to is not None:
        slots = torch.cat([slots, torch.full((pad_to - len(slots),), -1, dtype=torch.int64)])
        key, value = _pad(key, pad_to), _pad(value, pad_to)
    layer.write(key, value, slots, check)
    n = attn.num_actual_tokens
    hashes = layer.expected_hashes(key[:n], None if value is None else value[:n])
    start = 0
    for r, where in zip(spans, trace_slots):
        ids = identities(batch.hashes(r.req_id, r.positions))
        ledger.record(where, ids, hashes[start:start + r.num_new], r.req_id,
                      torch.arange(r.num_computed, r.num_computed + r.num_new), batch.step,
                      batch.num_known(r.req_id))
        start += r.num_new


def _check_batch(batch: StepBatch, group: _Group, recorded: RecordedTensors | None,
                 outcome: AttentionOutcome) -> AttentionDivergence | None:
    layer = group.layer
    s, table = layer.setup, batch.tables[group.index]
    check = BatchCheck()
    if recorded is not None and (s.kind.is_mla or not _fits(recorded, layer)):
        recorded = None
    external = [x for x in (_held_part(r, table, s.block_size) for r in batch.external) if x]
    if external:  # a KV connector's load: written, never queried
        _, k, v, _ = _inputs(batch, external, layer, None)
        _write(batch, group, external, k, v, check)
    if batch.scheduled and not check.problems:
        attn = build_attention_batch(batch.scheduled, table)
        q, k, v, out = _inputs(batch, batch.scheduled, layer, recorded)
        total = padded_len(attn.num_actual_tokens)
        _write(batch, group, batch.scheduled, k, v, check, total)
        if not check.problems:
            _check_reads(batch, group, attn, check)
        if not check.problems:
            layer.attend(_pad(q, total), attn, check, out if group.recorded else None)
        check.row_owner = [(r.req_id, p) for r in batch.scheduled for p in r.positions]
    if check.vllm_skipped:
        note = f"group {group.index}: {check.vllm_skipped}"
        if note not in outcome.notes:
            outcome.notes.append(note)
    for name, stats in check.stats.items():
        outcome.stats.setdefault(name, ErrorStats()).merge(stats)
    return _first_problem(batch, group.index, check)


def _held_part(r: ScheduledRequest, table, block_size: int) -> ScheduledRequest | None:
    """The connector-loaded tokens whose blocks the group holds: a sliding
    window's manager leaves the blocks of tokens no query will see null, and
    nothing is written there."""
    row = table.row(r.req_id)
    first = r.num_computed
    while first < r.num_computed + r.num_new and row[first // block_size] == 0:
        first += block_size - first % block_size
    end = r.num_computed + r.num_new
    return ScheduledRequest(r.req_id, first, end - first) if first < end else None


def _visible(r: ScheduledRequest, kind: AttentionKind) -> torch.Tensor:
    seq_len = r.num_computed + r.num_new
    lo = 0
    if kind.sliding_window:
        lo = max(0, r.num_computed - kind.sliding_window + 1)
    if kind.chunk_size:
        lo = max(lo, r.num_computed // kind.chunk_size * kind.chunk_size)
    return torch.arange(lo, seq_len)


def _check_reads(batch: StepBatch, group: _Group, attn, check: BatchCheck) -> None:
    """Every position a query sees: the block the trace gives, holding the
    request's own token, byte for byte as written."""
    ledger, layer = group.ledger, group.layer
    kind = layer.setup.kind
    rows = batch.trace_rows[group.index]
    for i, r in enumerate(batch.scheduled):
        positions = _visible(r, kind)
        ids = identities(batch.hashes(r.req_id, range(int(positions[0]),
                                                       int(positions[-1]) + 1)))
        problem = ledger.check_reads(r.req_id, positions, ids, attn.block_table[i],
                                     rows.get(r.req_id), layer.cache_hashes)
        if problem is not None:
            check.problems.append(Problem(problem.check, problem.message, problem.req_id))
            return
    if kind.sink_len:
        bs = layer.setup.block_size
        slots = torch.arange(bs, bs + kind.sink_len)
        hasher = PrefixHasher(_SINK_SEED)
        hasher.extend(list(range(kind.sink_len)))
        problem = ledger.check_slots("(static sinks)", torch.arange(kind.sink_len), slots,
                                     identities(hasher.hashes), layer.cache_hashes)
        if problem is not None:
            check.problems.append(Problem(problem.check, problem.message, None))


def _fits(recorded: RecordedTensors, layer: LayerCheck) -> bool:
    n = recorded.meta_int("num_kv_heads")
    return n is None or n == layer.setup.num_kv_heads


def _inputs(batch: StepBatch, spans, layer: LayerCheck, recorded: RecordedTensors | None):
    """(query, key, value, recorded output or None) of the spans; MLA: the
    key is the latent row, value None."""
    s = layer.setup
    if recorded is None:
        q = _rows(batch, spans, STREAM_QUERY, s.num_heads, s)
        k = _rows(batch, spans, STREAM_KEY, s.num_kv_heads, s)
        v = None if s.kind.is_mla else _rows(batch, spans, STREAM_VALUE, s.num_kv_heads, s)
        return q, k, v, None
    rows = [recorded.rows(batch.step, r.req_id, r.num_new) for r in spans]
    q, k, v = (torch.cat([getattr(r, f) for r in rows]).to(s.dtype)
               for f in ("query", "key", "value"))
    outs = [r.output for r in rows]
    out = None if any(o is None for o in outs) else torch.cat(outs)
    return q, k, v, out


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
            f"{stats.worst_ratio:.1f}x its allowance (max abs {stats.max_abs:.3e}, "
            f"|values| up to {stats.max_value:.2g}, {stats.nonfinite} non-finite)")
    return None
