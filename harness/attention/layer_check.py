"""One attention layer checked batch by batch: impl's kernels against the
float64 reference and against vLLM's CPU attention ops.

Per batch: the new keys and values go through impl's reshape_and_cache into
impl-allocated KV tensors (NaN-filled, so a read of anything never written
shows), through a float64 mirror, and through vLLM's cpu_attn_reshape_and_cache
into vLLM's own cache; then impl's paged attention, the reference and vLLM's
cpu_attention_with_kv_cache each compute the output. The batch is padded with
rows whose slot is -1 and whose values are NaN: they must neither reach the
cache nor be written to the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.attention.compare import ErrorStats, error_stats
from harness.attention.reference import MirrorCache, quantize, reference_attention
from harness.attention.tolerances import tolerance
from impl.attention_batch import AttentionBatch
from impl.kernels.reshape_and_cache import cache_torch_dtype, reshape_and_cache
from impl.kernels.unified_attention import unified_attention
from impl.kv_cache_tensors import (
    KVCacheLayout,
    KVCacheShape,
    allocate_kv_cache,
    plan_kv_cache_tensors,
)

# Padding rows per batch: the token count is rounded up to a multiple of this,
# and at least one padding row is added (as a captured graph size would).
PAD_MULTIPLE = 8

IMPL_VS_REFERENCE = "impl~reference"
IMPL_VS_VLLM = "impl~vllm"
VLLM_VS_REFERENCE = "vllm~reference"
IMPL_VS_RECORDED = "impl~recorded"
# Checks of the output; VLLM_VS_REFERENCE is informational (vLLM's own error).
OUTPUT_CHECKS = (IMPL_VS_REFERENCE, IMPL_VS_VLLM, IMPL_VS_RECORDED)


@dataclass(frozen=True, slots=True)
class LayerSetup:
    num_blocks: int
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    scale: float
    sliding_window: int | None = None
    kv_cache_dtype: str = "auto"
    layout: KVCacheLayout = KVCacheLayout.CPU_ATTN
    device: str = "cpu"


CACHE_WRITE = "cache write"
PADDING = "padding"
PREFIX_CONTENT = "prefix content"


@dataclass(frozen=True, slots=True)
class Problem:
    check: str  # CACHE_WRITE, PADDING or PREFIX_CONTENT
    message: str
    req_id: str | None = None


@dataclass(slots=True)
class BatchCheck:
    """What one batch showed: output statistics per check, and problems that
    are failures whatever the numbers."""

    stats: dict[str, ErrorStats] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # Output row -> (request, position), to name the worst element.
    row_owner: list[tuple[str, int]] = field(default_factory=list)


class LayerCheck:
    def __init__(self, setup: LayerSetup, vllm=None) -> None:
        """vllm: a harness.backends.vllm_cpu_attention.VllmCpuAttention, or None."""
        self.setup = setup
        shape = KVCacheShape(setup.block_size, setup.num_kv_heads, setup.head_size,
                             cache_torch_dtype(setup.kv_cache_dtype, setup.dtype))
        plan = plan_kv_cache_tensors(["layer"], setup.num_blocks, shape, setup.layout)
        self.cache = allocate_kv_cache(plan, setup.num_blocks, shape, setup.layout,
                                       setup.device, fill=float("nan"))["layer"]
        self.k_scale = torch.ones(1, dtype=torch.float32, device=setup.device)
        self.v_scale = torch.ones(1, dtype=torch.float32, device=setup.device)
        self.mirror = MirrorCache(setup.num_blocks, setup.block_size, setup.num_kv_heads,
                                  setup.head_size, setup.kv_cache_dtype)
        self.vllm = vllm

    # -- writes -------------------------------------------------------------------

    def write(self, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor,
              check: BatchCheck) -> None:
        """Write through impl, the mirror and vLLM; then compare what landed."""
        dev = self.setup.device
        reshape_and_cache(key.to(dev), value.to(dev), self.cache.key, self.cache.value,
                          slots.to(dev), self.setup.kv_cache_dtype, self.k_scale, self.v_scale)
        self.mirror.write(key, value, slots)
        if self.vllm is not None:
            self.vllm.write(key, value, slots)
        self._check_cache(slots, check)

    def _check_cache(self, slots: torch.Tensor, check: BatchCheck) -> None:
        written = slots[slots >= 0].cpu()
        if written.numel() == 0:
            return
        bs, dev = self.setup.block_size, self.setup.device
        blocks, offsets = written // bs, written % bs
        mine_k = self.cache.key[blocks.to(dev), offsets.to(dev)].cpu()
        mine_v = self.cache.value[blocks.to(dev), offsets.to(dev)].cpu()
        # The cache holds x / scale; the mirror x as the cache can hold it.
        k_ok = torch.equal(mine_k.double() * float(self.k_scale), self.mirror.key[blocks, offsets])
        v_ok = torch.equal(mine_v.double() * float(self.v_scale),
                           self.mirror.value[blocks, offsets])
        if not (k_ok and v_ok):
            check.problems.append(Problem(CACHE_WRITE, "impl's reshape_and_cache stored "
                                          "other values than the reference at the batch's slots"))
        if self.vllm is not None and self.setup.kv_cache_dtype == "auto":
            their_k, their_v = self.vllm.unpacked_slots(written)
            if not (torch.equal(mine_k, their_k) and torch.equal(mine_v, their_v)):
                check.problems.append(Problem(CACHE_WRITE, "impl's cache and vLLM's (converted "
                                              "from its CPU layout) differ at the batch's slots"))

    # -- attention ------------------------------------------------------------------

    def attend(self, query: torch.Tensor, batch: AttentionBatch, check: BatchCheck,
               recorded_output: torch.Tensor | None = None) -> None:
        """query: [num_tokens (padding included), num_heads, head_size]."""
        s, dev = self.setup, self.setup.device
        n = batch.num_actual_tokens
        out = torch.full_like(query, float("nan"), device=dev)
        unified_attention(query.to(dev), self.cache.key, self.cache.value, out,
                          batch.query_start_loc.to(dev), batch.seq_lens.to(dev),
                          batch.block_table.to(dev), scale=s.scale,
                          sliding_window=s.sliding_window, max_query_len=batch.max_query_len,
                          kv_cache_dtype=s.kv_cache_dtype, k_scale=self.k_scale,
                          v_scale=self.v_scale)
        out = out.cpu()
        if not torch.isnan(out[n:]).all():
            check.problems.append(Problem(PADDING, "impl's attention wrote output rows past "
                                          "the batch's tokens"))
        ref = reference_attention(query[:n], self.mirror, batch, s.scale, s.sliding_window)
        self._stat(check, IMPL_VS_REFERENCE, out[:n], ref, "reference")
        if self.vllm is not None:
            theirs = self.vllm.forward(query, batch)
            self._stat(check, IMPL_VS_VLLM, out[:n], theirs, "vllm")
            self._stat(check, VLLM_VS_REFERENCE, theirs, ref, "reference")
        if recorded_output is not None:
            self._stat(check, IMPL_VS_RECORDED, out[:n], recorded_output, "vllm")

    def _stat(self, check: BatchCheck, name: str, actual, expected, against: str) -> None:
        tol = tolerance(self.setup.dtype, against, self.setup.kv_cache_dtype)
        check.stats[name] = error_stats(actual, expected, tol)

    # -- prefix content -------------------------------------------------------------------

    def content_matches(self, block_row: torch.Tensor, positions: torch.Tensor,
                        key_rows: torch.Tensor, value_rows: torch.Tensor) -> torch.Tensor:
        """Which positions of a request hold exactly key_rows/value_rows (the
        rows the request itself would write there) in the mirror."""
        k, v = self.mirror.gather(block_row, positions)
        want_k = quantize(key_rows, self.setup.kv_cache_dtype)
        want_v = quantize(value_rows, self.setup.kv_cache_dtype)
        return (k == want_k).flatten(1).all(1) & (v == want_v).flatten(1).all(1)


def padded_len(num_tokens: int) -> int:
    return (num_tokens // PAD_MULTIPLE + 1) * PAD_MULTIPLE
