"""vLLM's own CPU attention ops, fed like its CPU_ATTN backend feeds them.

The only module of harness/attention that imports vllm. It follows
vllm/v1/attention/backends/cpu_attn.py (0.32): the cache is allocated
[num_blocks, num_kv_heads, block_size, 2 * head_size], viewed as
[num_blocks, num_kv_heads, 2 * block_size, head_size] and split into key and
value caches; `cpu_attn_reshape_and_cache` writes the new tokens (the backend's
do_kv_cache_update), `cpu_attn_get_scheduler_metadata` plans the batch and
`cpu_attention_with_kv_cache` runs it (the backend's forward). The kernel ISA is
the one the backend would pick (`_get_attn_isa`). vLLM's CPU kernels need a
head size of 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 or 512 (vec16 takes
multiples of 16 that are not of 32) and a block size that is a multiple of 16
(32 for amx, which bf16 gets on CPUs with AMX).
"""

from __future__ import annotations

import torch

from harness.attention.cpu_attn_layout import SUPPORTED_ISAS, unpack
from impl.attention_batch import AttentionBatch


class VllmUnavailable(RuntimeError):
    """vLLM (with its CPU ops) is not importable: an environment problem."""


def _ops():
    try:
        from vllm import _custom_ops as ops
        from vllm import envs
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except Exception as e:  # ImportError, or vLLM failing to initialise
        raise VllmUnavailable(f"vLLM's CPU attention ops are not importable: {e}") from e
    return ops, _get_attn_isa, envs


class VllmCpuAttention:
    """One attention layer's KV cache and ops on vLLM's CPU backend."""

    def __init__(self, num_blocks: int, block_size: int, num_heads: int, num_kv_heads: int,
                 head_size: int, dtype: torch.dtype, scale: float,
                 sliding_window: int | None = None) -> None:
        self.ops, get_isa, envs = _ops()
        # As the backend's metadata builder: split long KV across threads.
        self.split_kv = bool(envs.VLLM_CPU_ATTN_SPLIT_KV)
        self.isa = get_isa(dtype, block_size, head_size, "auto")
        if self.isa not in SUPPORTED_ISAS:
            raise VllmUnavailable(f"CPU attention ISA '{self.isa}' has no cache "
                                  "conversion here")
        if self.isa == "amx":
            # AMX tile registers must be enabled for this process before the
            # first tile instruction (vLLM's own tests do the same); without it
            # the kernel dies with SIGILL.
            torch.cpu._init_amx()
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.dtype, self.scale = dtype, scale
        self.sliding_window = sliding_window if sliding_window else -1
        self.cache = torch.zeros(num_blocks, num_kv_heads, block_size, 2 * head_size,
                                 dtype=dtype)
        self.key_cache, self.value_cache = self.cache.view(
            num_blocks, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
        self._probe()

    def _probe(self) -> None:
        """Run both ops once on one token in block 0 (the null block, never a
        request's): vLLM's kernels refuse unsupported head and block sizes only
        when called, and a refusal here is a ValueError the caller can note."""
        one = torch.zeros(1, self.num_kv_heads, self.head_size, dtype=self.dtype)
        batch = AttentionBatch(torch.tensor([0, 1], dtype=torch.int32),
                               torch.tensor([1], dtype=torch.int32),
                               torch.zeros(1, 1, dtype=torch.int32),
                               torch.zeros(1, dtype=torch.int64), 1, 1)
        try:
            self.write(one, one, batch.slot_mapping)
            self.forward(torch.zeros(1, self.num_heads, self.head_size, dtype=self.dtype),
                         batch)
        except RuntimeError as e:
            raise ValueError(f"vLLM's CPU attention refuses head_size {self.head_size}, "
                             f"block_size {self.cache.shape[2]}, {self.dtype}: "
                             f"{str(e).splitlines()[0]}") from None
        finally:
            self.cache.zero_()

    def write(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        self.ops.cpu_attn_reshape_and_cache(key, value, self.key_cache, self.value_cache,
                                            slot_mapping.to(torch.int64), self.isa)

    def forward(self, query: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Output [num_actual_tokens, num_heads, head_size] of the batch."""
        n = batch.num_actual_tokens
        metadata = self.ops.cpu_attn_get_scheduler_metadata(
            num_reqs=batch.num_reqs, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
            seq_lens=batch.seq_lens, dtype=self.dtype,
            query_start_loc=batch.query_start_loc, causal=True,
            sliding_window_size=self.sliding_window, isa=self.isa,
            enable_kv_split=self.split_kv)
        out = torch.empty(n, self.num_heads, self.head_size, dtype=self.dtype)
        self.ops.cpu_attention_with_kv_cache(
            query=query[:n].contiguous(), key_cache=self.key_cache,
            value_cache=self.value_cache, output=out,
            query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens,
            scale=self.scale, causal=True, alibi_slopes=None,
            sliding_window=self.sliding_window, block_table=batch.block_table,
            softcap=0.0, scheduler_metadata=metadata, s_aux=None)
        return out

    def unpacked_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value) [num_blocks, block_size, num_kv_heads, head_size]."""
        return unpack(self.cache, self.isa)

    def unpacked_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value) [len(slots), num_kv_heads, head_size] at the slots
        (unpacking only the blocks they are in)."""
        block_size = self.cache.shape[2]
        blocks, offsets = slots // block_size, slots % block_size
        key, value = unpack(self.cache[blocks], self.isa)
        rows = torch.arange(slots.shape[0])
        return key[rows, offsets], value[rows, offsets]
