"""One attention layer checked batch by batch: impl's kernels against the
float64 reference, against vLLM's CPU attention ops and (where the trace has
them) against the outputs a real engine recorded.

Per batch: the new keys and values go through impl's reshape_and_cache (MLA:
concat_and_cache_mla) into impl-allocated KV tensors (NaN-filled, so a read of
anything never written shows), through a float64 mirror, and through vLLM's
own write op into vLLM's own cache; then impl's paged attention, the reference
and vLLM's op each compute the output. The batch is padded with rows whose
slot is -1 and whose values are NaN: they must neither reach the cache nor be
written to the output. Outputs are compared with the allowances of the error
model (tolerances.py); the block ledger (ledger.py) is kept by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.attention.compare import ErrorStats, error_stats
from harness.attention.impl_call import impl_attention, impl_write
from harness.attention.kinds import AttentionKind
from harness.attention.ledger import row_hashes
from harness.attention.reference import MirrorCache, quantize, reference
from harness.attention.tolerances import allowed, impl_path
from impl.attention_batch import AttentionBatch
from impl.kernels.reshape_and_cache import cache_torch_dtype
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

CACHE_WRITE = "cache write"
PADDING = "padding"


@dataclass(frozen=True, slots=True)
class LayerSetup:
    num_blocks: int
    block_size: int
    num_heads: int
    num_kv_heads: int  # MLA: 1
    head_size: int  # MLA: kv_lora_rank + rope dim
    dtype: torch.dtype
    scale: float
    kind: AttentionKind = AttentionKind()
    kv_cache_dtype: str = "auto"
    layout: KVCacheLayout = KVCacheLayout.CPU_ATTN
    device: str = "cpu"
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def head_size_v(self) -> int:
        return self.kind.head_size_v(self.head_size)

    @property
    def cache_dtype(self) -> torch.dtype:
        return cache_torch_dtype(self.kv_cache_dtype, self.dtype)


@dataclass(frozen=True, slots=True)
class Problem:
    check: str  # CACHE_WRITE, PADDING, or one of the ledger's
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
    # Why vLLM's op did not run on this batch (None: it ran, or is off).
    vllm_skipped: str | None = None


class LayerCheck:
    def __init__(self, setup: LayerSetup, vllm=None) -> None:
        """vllm: a harness.backends.vllm_cpu_attention.VllmCpuAttention, or None."""
        self.setup = s = setup
        shape = KVCacheShape(s.block_size, s.num_kv_heads, s.head_size, s.cache_dtype,
                             mla=s.kind.is_mla)
        plan = plan_kv_cache_tensors(["layer"], s.num_blocks, shape, s.layout)
        self.cache = allocate_kv_cache(plan, s.num_blocks, shape, s.layout, s.device,
                                       fill=float("nan"))["layer"]
        self.k_scale = torch.tensor([s.k_scale], dtype=torch.float32, device=s.device)
        self.v_scale = torch.tensor([s.v_scale], dtype=torch.float32, device=s.device)
        self.mirror = MirrorCache(s.num_blocks, s.block_size, s.num_kv_heads, s.head_size,
                                  s.kv_cache_dtype, s.k_scale, s.v_scale)
        self.vllm = vllm
        # vLLM's CPU fp8 cache keeps the leading mantissa bits (truncates) where
        # impl, torch and CUDA round to nearest: its own mirror.
        self.vllm_mirror = self.mirror
        if vllm is not None and s.kv_cache_dtype != "auto":
            self.vllm_mirror = MirrorCache(s.num_blocks, s.block_size, s.num_kv_heads,
                                           s.head_size, s.kv_cache_dtype, s.k_scale,
                                           s.v_scale, rounding="toward_zero")

    # -- writes -------------------------------------------------------------------

    def write(self, key: torch.Tensor, value: torch.Tensor | None, slots: torch.Tensor,
              check: BatchCheck) -> None:
        """Write through impl, the mirror and vLLM; then compare what landed.
        key/value: [tokens, kv heads, head_size] (MLA: key = latent rows)."""
        dev = self.setup.device
        impl_write(key.to(dev), None if value is None else value.to(dev), self.cache,
                   slots.to(dev), self.setup.kind, self.setup.kv_cache_dtype, self.k_scale,
                   self.v_scale)
        self.mirror.write(key, value, slots)
        if self.vllm is not None:
            self.vllm.write(key, value, slots)
            if self.vllm_mirror is not self.mirror:
                self.vllm_mirror.write(key, value, slots)
        self._check_cache(slots, check)

    def cache_rows(self, slots: torch.Tensor):
        """What impl's cache holds at slots: (key, value) [n, kv heads, dim]
        in the cache dtype (MLA: value None)."""
        dev, bs = self.setup.device, self.setup.block_size
        slots = slots.to(dev)
        blocks, offsets = slots // bs, slots % bs
        key = self.cache.key[blocks, offsets].cpu()
        value = None if self.setup.kind.is_mla else self.cache.value[blocks, offsets].cpu()
        return key, value

    def cache_hashes(self, slots: torch.Tensor) -> torch.Tensor:
        return row_hashes(*self.cache_rows(slots))

    def expected_hashes(self, key: torch.Tensor, value: torch.Tensor | None) -> torch.Tensor:
        """Row hashes of key/value as impl's cache must hold them."""
        s = self.setup

        def stored(x, scale):
            if x is None:
                return None
            if s.kv_cache_dtype == "auto":
                return x.to(s.cache_dtype)
            return (quantize(x, s.kv_cache_dtype, scale) / scale).to(s.cache_dtype)

        return row_hashes(stored(key, s.k_scale), stored(value, s.v_scale))

    def _check_cache(self, slots: torch.Tensor, check: BatchCheck) -> None:
        written = slots[slots >= 0].cpu()
        if written.numel() == 0:
            return
        s = self.setup
        mine_k, mine_v = self.cache_rows(written)
        want_k, want_v = self.mirror.gather_slots(written)
        # The cache holds x / scale; the mirror x as the cache can hold it.
        ok = torch.equal(mine_k.double() * s.k_scale, want_k)
        if mine_v is not None:
            ok = ok and torch.equal(mine_v.double() * s.v_scale, want_v)
        if not ok:
            check.problems.append(Problem(CACHE_WRITE, "impl's cache write stored other "
                                          "values than the reference at the batch's slots"))
        if self.vllm is None:
            return
        their_k, their_v = self.vllm.unpacked_slots(written)
        want_k, want_v = self.vllm_mirror.gather_slots(written)
        same = torch.equal(their_k.double(), want_k)
        if their_v is not None:
            same = same and torch.equal(their_v.double(), want_v)
        if not same:
            what = "its own fp8 rounding of" if s.kv_cache_dtype != "auto" else ""
            check.problems.append(Problem(CACHE_WRITE, "vLLM's cache (converted from its CPU "
                                          f"layout) differs from {what} the batch's rows"))

    # -- attention ------------------------------------------------------------------

    def attend(self, query: torch.Tensor, batch: AttentionBatch, check: BatchCheck,
               recorded_output: torch.Tensor | None = None) -> None:
        """query: [num_tokens (padding included), num_heads, head_size]."""
        s, dev = self.setup, self.setup.device
        n = batch.num_actual_tokens
        out = torch.full((query.shape[0], s.num_heads, s.head_size_v), float("nan"),
                         dtype=s.dtype, device=dev)
        on_dev = _batch_to(batch, dev)
        impl_attention(query.to(dev), self.cache, out, on_dev, s.scale, s.kind,
                       s.kv_cache_dtype, self.k_scale, self.v_scale)
        out = out.cpu()
        if not torch.isnan(out[n:]).all():
            check.problems.append(Problem(PADDING, "impl's attention wrote output rows past "
                                          "the batch's tokens"))
        ref = reference(query[:n], self.mirror, batch, s.scale, s.kind)
        mine = impl_path()
        kvd = s.kv_cache_dtype
        check.stats[IMPL_VS_REFERENCE] = error_stats(
            out[:n], ref.out, allowed(ref, s.dtype, mine, kv_cache_dtype=kvd))
        if self.vllm is not None:
            check.vllm_skipped = self.vllm.serves(batch)
        if self.vllm is not None and check.vllm_skipped is None:
            theirs = self.vllm.forward(query, batch)
            their_ref = ref
            if self.vllm_mirror is not self.mirror:
                their_ref = reference(query[:n], self.vllm_mirror, batch, s.scale, s.kind)
            check.stats[VLLM_VS_REFERENCE] = error_stats(
                theirs, their_ref.out, allowed(their_ref, s.dtype, "vllm_cpu",
                                               kv_cache_dtype=kvd))
            if kvd == "auto":  # else their cache holds other values than impl's
                check.stats[IMPL_VS_VLLM] = error_stats(
                    out[:n], theirs, allowed(ref, s.dtype, mine, "vllm_cpu"))
        if recorded_output is not None:
            check.stats[IMPL_VS_RECORDED] = error_stats(
                out[:n], recorded_output.reshape(out[:n].shape),
                allowed(ref, s.dtype, mine, "vllm_cpu", kv_cache_dtype=kvd))


def _batch_to(batch: AttentionBatch, device: str) -> AttentionBatch:
    if device == "cpu":
        return batch
    return AttentionBatch(batch.query_start_loc.to(device), batch.seq_lens.to(device),
                          batch.block_table.to(device), batch.slot_mapping.to(device),
                          batch.max_query_len, batch.max_seq_len)


def padded_len(num_tokens: int) -> int:
    return (num_tokens // PAD_MULTIPLE + 1) * PAD_MULTIPLE
