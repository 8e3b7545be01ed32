"""vLLM's own CPU attention ops, fed like its CPU backends feed them.

The module of the attention differential that imports vllm (with
vllm_triton_attention.py for the GPU). It follows vLLM 0.32:

- CPU_ATTN (vllm/v1/attention/backends/cpu_attn.py): the cache is allocated
  [num_blocks, num_kv_heads, block_size, 2 * head_size], viewed as
  [num_blocks, num_kv_heads, 2 * block_size, head_size] and split into key
  and value caches; `cpu_attn_reshape_and_cache` writes the new tokens (the
  backend's do_kv_cache_update), `cpu_attn_get_scheduler_metadata` plans the
  batch and `cpu_attention_with_kv_cache` runs it, with the kind's causal
  flag, sliding window, ALiBi slopes, soft-cap, sinks (`s_aux`) and fp8 cache
  (uint8 storage, per-tensor scales). The ISA is the one the backend picks
  (`_get_attn_isa`).
- chunked local attention: vLLM's own `make_local_attention_virtual_batches`
  turns the batch into virtual batches, one per chunk, for the same op;
- static sink tokens: the sink blocks (1 ..) in front of every table row and
  seq_lens + sink_len, as vLLM's StaticSinkAttentionBuilder does;
- MLA (vllm/v1/attention/backends/mla/cpu_mla.py): a latent cache
  [num_blocks, block_size, kv_lora_rank + rope], written by indexing as the
  backend's do_kv_cache_update does, read by `mla_decode_kvcache` (decode
  batches only: vLLM's CPU MLA prefill is unpaged SDPA, no paged op).

What vLLM declares it does not serve (`unsupported_reason`) is never probed;
anything it should serve but fails on is an environment problem
(VllmUnavailable), never a silent skip.
"""

from __future__ import annotations

import torch

from harness.backends.vllm_cpu_attn_layout import SUPPORTED_ISAS, unpack
from impl.attention_batch import AttentionBatch

# vLLM's CPU MLA decode kernel compiles for this row (kv_lora_rank 512 +
# rope 64) and block size only (CPUMLABackend).
MLA_HEAD_SIZE, MLA_ROPE, MLA_BLOCK_SIZE = 576, 64, 16


class VllmUnavailable(RuntimeError):
    """vLLM's ops are not importable or fail on a shape they serve: an
    environment problem."""


class ProcessorUnsupported(VllmUnavailable):
    """vLLM serves the layer, but not on this processor (an fp8 cache without
    AVX-512 or AMX): the machine decides, so it is the environment, never a
    result."""


def _ops():
    try:
        from vllm import _custom_ops as ops
        from vllm import envs
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, _get_attn_isa
    except Exception as e:  # ImportError, or vLLM failing to initialise
        raise VllmUnavailable(f"vLLM's CPU attention ops are not importable: {e}") from e
    return ops, _get_attn_isa, envs, CPUAttentionBackend


def unsupported_reason(kind, head_size: int, block_size: int, dtype: torch.dtype,
                       kv_cache_dtype: str = "auto") -> str | None:
    """Why vLLM's CPU backends do not serve this layer (their own declarations
    and documented limits), or None when they do."""
    _, _, _, backend = _ops()
    if kind.is_mla:
        if (head_size, kind.mla_rope_dim, block_size) != (MLA_HEAD_SIZE, MLA_ROPE,
                                                           MLA_BLOCK_SIZE):
            return (f"vLLM's CPU MLA serves only a {MLA_HEAD_SIZE - MLA_ROPE} + {MLA_ROPE} "
                    f"latent row in blocks of {MLA_BLOCK_SIZE}")
        if kv_cache_dtype != "auto":
            return "vLLM's CPU MLA serves no fp8 cache"
        return None
    sizes = backend.get_supported_head_sizes()
    if head_size not in sizes:
        return (f"vLLM's CPU attention serves head sizes {', '.join(map(str, sizes))}, "
                f"not {head_size}")
    # The backend asks for kernel blocks of multiples of 32; its ops take
    # multiples of 16 too (the vec16 ISA), which the differential uses.
    if block_size % 16:
        return f"vLLM's CPU attention needs block sizes that are multiples of 16, not {block_size}"
    if kv_cache_dtype != "auto" and head_size % 32:
        return f"vLLM's CPU attention keeps an fp8 cache for head sizes of multiples of 32, " \
               f"not {head_size}"
    # The 16-token kernels (vec16) have no fp8 variant: vLLM's pick hands them
    # such a layer and its op refuses it, whatever the processor.
    if kv_cache_dtype != "auto" and block_size % 32:
        return f"vLLM's CPU attention keeps an fp8 cache in blocks of multiples of 32, " \
               f"not {block_size}"
    if kind.chunk_size and kind.chunk_size % block_size:
        return f"vLLM's chunked local attention needs chunks of whole blocks ({block_size})"
    return None


class VllmCpuAttention:
    """One attention layer's KV cache and ops on vLLM's CPU backends."""

    def __init__(self, num_blocks: int, block_size: int, num_heads: int, num_kv_heads: int,
                 head_size: int, dtype: torch.dtype, scale: float, kind,
                 kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                 v_scale: float = 1.0) -> None:
        self.ops, get_isa, envs, _ = _ops()
        reason = unsupported_reason(kind, head_size, block_size, dtype, kv_cache_dtype)
        if reason is not None:
            raise ValueError(reason)
        self.kind, self.block_size = kind, block_size
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.dtype, self.scale = dtype, scale
        self.kv_cache_dtype, self.k_scale, self.v_scale = kv_cache_dtype, k_scale, v_scale
        self.fp8 = kv_cache_dtype != "auto"
        if kind.is_mla:
            self.isa = "mla"
            self.cache = torch.zeros(num_blocks, block_size, head_size, dtype=dtype)
        else:
            # As the backend's metadata builder: split long KV across threads.
            self.split_kv = bool(envs.VLLM_CPU_ATTN_SPLIT_KV)
            try:
                self.isa = get_isa(dtype, block_size, head_size, kv_cache_dtype)
            except NotImplementedError as e:
                # The pick refuses only for what the CPU lacks: the rest of its
                # limits are unsupported_reason's, checked above.
                raise ProcessorUnsupported(f"vLLM's CPU attention on this processor: {e}"
                                           ) from None
            if self.isa == "amx" and self.fp8:
                # vLLM picks amx for a bf16 model on an AMX machine whatever the
                # cache dtype; its fp8 byte order there is not converted here, so
                # the layer runs vLLM's AVX-512 kernels, the ones every AVX-512
                # machine without AMX runs: the result does not follow the CPU.
                self.isa = "vec"
            if self.isa not in SUPPORTED_ISAS:
                raise VllmUnavailable(f"CPU attention ISA '{self.isa}' has no cache "
                                      "conversion here")
            if self.isa == "amx":
                # AMX tile registers must be enabled for this process before the
                # first tile instruction (vLLM's own tests do the same); without
                # it the kernel dies with SIGILL.
                torch.cpu._init_amx()
            storage = torch.uint8 if self.fp8 else dtype
            self.cache = torch.zeros(num_blocks, num_kv_heads, block_size, 2 * head_size,
                                     dtype=storage)
            self.key_cache, self.value_cache = self.cache.view(
                num_blocks, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
        self.alibi = kind.alibi_slopes(num_heads)
        self.sinks = kind.sink_logits(num_heads)
        self._probe()

    def _probe(self) -> None:
        """Run the ops once on one token in block 0 (the null block, never a
        request's): a failure on a layer vLLM declares it serves is an
        environment problem."""
        heads = 1 if self.kind.is_mla else self.num_kv_heads
        one = torch.zeros(1, heads, self.head_size, dtype=self.dtype)
        batch = AttentionBatch(torch.tensor([0, 1], dtype=torch.int32),
                               torch.tensor([1], dtype=torch.int32),
                               torch.zeros(1, 1, dtype=torch.int32),
                               torch.zeros(1, dtype=torch.int64), 1, 1)
        try:
            self.write(one, None if self.kind.is_mla else one, batch.slot_mapping)
            self._forward(torch.zeros(1, self.num_heads, self.head_size, dtype=self.dtype),
                          batch)
        except Exception as e:
            raise VllmUnavailable(
                f"vLLM's CPU attention failed on a layer it serves ({self.kind.name}, "
                f"head_size {self.head_size}, block_size {self.block_size}, {self.dtype}, "
                f"kv cache {self.kv_cache_dtype}): {str(e).splitlines()[0]}") from e
        finally:
            self.cache.zero_()

    # -- writes ---------------------------------------------------------------------

    def write(self, key: torch.Tensor, value: torch.Tensor | None,
              slot_mapping: torch.Tensor) -> None:
        """key/value [tokens, kv heads, head_size] (MLA: key = latent rows)."""
        slots = slot_mapping.to(torch.int64)
        n = slots.shape[0]
        if self.kind.is_mla:
            keep = slots >= 0
            flat = self.cache.view(-1, self.head_size)
            flat[slots[keep]] = key[:n][keep][:, 0].to(self.cache.dtype)
            return
        self.ops.cpu_attn_reshape_and_cache(key[:n].contiguous(), value[:n].contiguous(),
                                            self.key_cache, self.value_cache, slots, self.isa,
                                            k_scale=self.k_scale, v_scale=self.v_scale,
                                            kv_cache_dtype=self.kv_cache_dtype)

    # -- attention --------------------------------------------------------------------

    def serves(self, batch: AttentionBatch) -> str | None:
        """Why vLLM has no op for this batch, or None (MLA: decodes only)."""
        if self.kind.is_mla and batch.max_query_len > 1:
            return "vLLM's CPU MLA has a paged op for decode batches only"
        return None

    def forward(self, query: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Output [num_actual_tokens, num_heads, head_size_v] of the batch."""
        try:
            return self._forward(query, batch)
        except Exception as e:
            raise VllmUnavailable(f"vLLM's CPU attention failed: "
                                  f"{str(e).splitlines()[0]}") from e

    def _forward(self, query: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        n = batch.num_actual_tokens
        query = query[:n].contiguous()
        if self.kind.is_mla:
            out = torch.zeros(n, self.num_heads, self.head_size - self.kind.mla_rope_dim,
                              dtype=self.dtype)
            self.ops.mla_decode_kvcache_cpu(out, query, self.cache, self.scale,
                                            batch.block_table.to(torch.int32),
                                            batch.seq_lens.to(torch.int32))
            return out
        qsl, seq_lens, table = batch.query_start_loc, batch.seq_lens, batch.block_table
        if self.kind.chunk_size:
            qsl, seq_lens, table = self._virtual_batches(batch)
        if self.kind.sink_len:
            sinks = self.kind.sink_len // self.block_size
            ids = torch.arange(1, sinks + 1, dtype=torch.int32).expand(table.shape[0], sinks)
            table = torch.cat([ids, table], dim=1).contiguous()
            seq_lens = seq_lens + self.kind.sink_len
        window = self.kind.sliding_window or -1
        metadata = self.ops.cpu_attn_get_scheduler_metadata(
            num_reqs=seq_lens.shape[0], num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_size, seq_lens=seq_lens,
            dtype=self.dtype, query_start_loc=qsl, causal=self.kind.causal,
            sliding_window_size=window, isa=self.isa, enable_kv_split=self.split_kv,
            kv_cache_dtype=self.kv_cache_dtype)
        out = torch.empty(n, self.num_heads, self.head_size, dtype=self.dtype)
        self.ops.cpu_attention_with_kv_cache(
            query=query, key_cache=self.key_cache, value_cache=self.value_cache, output=out,
            query_start_loc=qsl, seq_lens=seq_lens, scale=self.scale,
            causal=self.kind.causal, alibi_slopes=self.alibi, sliding_window=window,
            block_table=table, softcap=float(self.kind.softcap or 0.0),
            scheduler_metadata=metadata, s_aux=self.sinks, k_scale=self.k_scale,
            v_scale=self.v_scale, kv_cache_dtype=self.kv_cache_dtype)
        return out

    def _virtual_batches(self, batch: AttentionBatch):
        from vllm.v1.attention.backend import CommonAttentionMetadata
        from vllm.v1.attention.backends.utils import make_local_attention_virtual_batches

        common = CommonAttentionMetadata(
            query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc,
            seq_lens=batch.seq_lens, num_reqs=batch.num_reqs,
            num_actual_tokens=batch.num_actual_tokens, max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len, block_table_tensor=batch.block_table,
            slot_mapping=batch.slot_mapping)
        local, _ = make_local_attention_virtual_batches(self.kind.chunk_size, common,
                                                        self.block_size)
        return (local.query_start_loc.to(torch.int32), local.seq_lens.to(torch.int32),
                local.block_table_tensor.to(torch.int32).contiguous())

    # -- the cache, as [block, offset, kv head, dim] ----------------------------------

    def _as_values(self, key: torch.Tensor, value: torch.Tensor):
        if not self.fp8:
            return key, value
        from impl.kernels.reshape_and_cache import FP8_DTYPES

        fp8 = FP8_DTYPES[self.kv_cache_dtype][0]
        return (key.view(fp8).to(torch.float64) * self.k_scale,
                value.view(fp8).to(torch.float64) * self.v_scale)

    def unpacked_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value) [num_blocks, block_size, num_kv_heads, head_size]: the
        model dtype, or float64 values (x scale) of an fp8 cache; MLA: the
        latent rows as key, value None."""
        if self.kind.is_mla:
            return self.cache[:, :, None, :].clone(), None
        return self._as_values(*unpack(self.cache, self.isa))

    def unpacked_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value) [len(slots), num_kv_heads, head_size] at the slots
        (unpacking only the blocks they are in), as unpacked_cache."""
        blocks, offsets = slots // self.block_size, slots % self.block_size
        if self.kind.is_mla:
            return self.cache[blocks, offsets][:, None, :], None
        key, value = unpack(self.cache[blocks], self.isa)
        rows = torch.arange(slots.shape[0])
        return self._as_values(key[rows, offsets], value[rows, offsets])
