"""vLLM's own Triton attention kernels, called as its TRITON_ATTN backend calls
them (vllm/v1/attention/backends/triton_attn.py, 0.32): for ci/gpu_check.py.

The kernels come from `vllm.v1.attention.ops`: the installed vLLM, or the
bundle ci/vllm_triton_bundle.py copies out of it (placed first on sys.path) on
a GPU machine where vLLM cannot be installed. Nothing else of vLLM is needed.
"""

from __future__ import annotations

import torch

from harness.backends.vllm_cpu_attention import VllmUnavailable
from impl.attention_batch import AttentionBatch

# The backend's split-KV choice (triton_attn.py): batches of fewer sequences
# than MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads run the 3-D kernel, each
# sequence's keys split into NUM_PAR_SOFTMAX_SEGMENTS segments.
MIN_LAUNCH_GRID_SIZE_2D = 128
NUM_PAR_SOFTMAX_SEGMENTS = 16


def _ops():
    try:
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
            triton_reshape_and_cache_flash,
        )
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.kv_cache_interface import KVQuantMode
    except Exception as e:  # not installed, no bundle, or a build without these ops
        raise VllmUnavailable(f"vLLM's Triton attention does not import: {e}") from e
    return unified_attention, triton_reshape_and_cache_flash, KVQuantMode


def vllm_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           kv_cache_dtype: str = "auto", k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> None:
    """Caches: [num_blocks, block_size, num_kv_heads, head_size] views."""
    _, reshape, _ = _ops()
    one = torch.ones(1, dtype=torch.float32, device=key.device)
    reshape(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
            one if k_scale is None else k_scale, one if v_scale is None else v_scale)


class VllmTritonAttention:
    """The backend's per-layer state: its split-KV scratch buffers."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int,
                 device: torch.device | str) -> None:
        self.unified_attention, _, self.quant_modes = _ops()
        self.seq_threshold_3d = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
        padded = 1 << (head_size - 1).bit_length()
        shape = (self.seq_threshold_3d, num_heads, NUM_PAR_SOFTMAX_SEGMENTS)
        self.segm_output = torch.empty(*shape, padded, dtype=torch.float32, device=device)
        self.segm_max = torch.empty(shape, dtype=torch.float32, device=device)
        self.segm_expsum = torch.empty(shape, dtype=torch.float32, device=device)

    def forward(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                out: torch.Tensor, batch: AttentionBatch, scale: float, kind,
                kv_cache_dtype: str = "auto", k_scale: torch.Tensor | None = None,
                v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Caches: [num_blocks, block_size, num_kv_heads, head_size] views, as
        impl's (the backend hands its kernel the same 4-D views)."""
        if kind.is_mla or kind.chunk_size or kind.sink_len:
            raise ValueError(f"{kind.name}: not through vLLM's unified Triton attention here")
        n = batch.num_actual_tokens
        num_kv_heads = key_cache.shape[2]
        dev = query.device
        descale = (batch.num_reqs, num_kv_heads)
        one = torch.ones(1, dtype=torch.float32, device=dev)
        fp8 = kv_cache_dtype != "auto"
        window = kind.sliding_window
        slopes, sinks = kind.alibi_slopes(query.shape[1]), kind.sink_logits(query.shape[1])
        self.unified_attention(
            q=query[:n], k=key_cache, v=value_cache, out=out[:n],
            cu_seqlens_q=batch.query_start_loc, max_seqlen_q=batch.max_query_len,
            seqused_k=batch.seq_lens, max_seqlen_k=batch.max_seq_len, softmax_scale=scale,
            causal=kind.causal,
            # The backend passes (window - 1, 0): keys p - W < t <= p.
            window_size=(window - 1, 0) if window else (-1, -1),
            block_table=batch.block_table, softcap=kind.softcap or 0, q_descale=None,
            k_descale=(k_scale if fp8 else one).expand(descale),
            v_descale=(v_scale if fp8 else one).expand(descale),
            seq_threshold_3D=self.seq_threshold_3d,
            num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
            softmax_segm_output=self.segm_output, softmax_segm_max=self.segm_max,
            softmax_segm_expsum=self.segm_expsum,
            alibi_slopes=None if slopes is None else slopes.to(dev),
            sinks=None if sinks is None else sinks.to(dev),
            kv_quant_mode=(self.quant_modes.FP8_PER_TENSOR if fp8
                           else self.quant_modes.NONE))
        return out
