"""What one attention layer computes: the kinds vLLM serves, as parameters.

Every kind is plain causal attention over a paged KV cache plus some of:

- `sliding_window` W: the query at position p sees keys p - W < t <= p;
- `chunk_size` C (chunked local attention, Llama 4): keys of the query's own
  chunk, (p // C) * C <= t <= p;
- `causal=False` (cross attention: decoder queries over the encoder's keys;
  encoders): every query sees the whole sequence;
- `alibi`: logits plus slope_h * (t - p), the slopes of the ALiBi paper;
- `softcap` c: logits become c * tanh(logit / c) (Gemma 2), before ALiBi;
- `sinks`: one learned logit per head added to the softmax denominator, with
  no value (gpt-oss; vLLM's `s_aux`);
- `sink_len` S (vLLM's static sink tokens, SinkFullAttentionSpec): S learned
  key/value tokens in the blocks after the null block, seen by every query;
- `mla_rope_dim` R (MLA, DeepSeek V2/V3): the cache holds one latent row per
  token, kv_lora_rank + R wide; the key is the whole row, the value its first
  kv_lora_rank elements; one kv head shared by every query head.

`KINDS` names one of each, as the kernel tests, the trace differential and
ci/gpu_check.py use them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True, slots=True)
class AttentionKind:
    name: str = "full"
    causal: bool = True
    sliding_window: int | None = None
    chunk_size: int | None = None
    alibi: bool = False
    softcap: float | None = None
    sinks: bool = False
    sink_len: int = 0
    mla_rope_dim: int = 0

    def __post_init__(self) -> None:
        if not self.causal and (self.sliding_window or self.chunk_size or self.alibi):
            raise ValueError(f"{self.name}: windows, chunks and ALiBi need causal attention")
        if self.sink_len and (self.alibi or self.sliding_window or self.chunk_size):
            raise ValueError(f"{self.name}: static sinks go with full attention only")

    @property
    def is_mla(self) -> bool:
        return self.mla_rope_dim > 0

    def head_size_v(self, head_size: int) -> int:
        """Width of the value (and output) rows."""
        return head_size - self.mla_rope_dim if self.is_mla else head_size

    def alibi_slopes(self, num_heads: int) -> torch.Tensor | None:
        """The ALiBi paper's geometric slopes (float32 [num_heads]), extended
        to head counts that are not powers of two as the paper does."""
        if not self.alibi:
            return None
        closest = 2 ** math.floor(math.log2(num_heads))
        base = 2.0 ** (-8.0 / closest)
        slopes = [base ** (i + 1) for i in range(closest)]
        if closest < num_heads:
            extra = 2.0 ** (-4.0 / closest)
            slopes += [extra ** (2 * i + 1) for i in range(num_heads - closest)]
        return torch.tensor(slopes, dtype=torch.float32)

    def sink_logits(self, num_heads: int) -> torch.Tensor | None:
        """Per-head sink logits (float32 [num_heads]): fixed values spread over
        the range real models learn, so some heads' sinks dominate and some
        barely count."""
        if not self.sinks:
            return None
        return torch.linspace(-2.0, 3.0, num_heads, dtype=torch.float32)

    def with_window(self, window: int | None) -> AttentionKind:
        return replace(self, sliding_window=window)


KINDS = {
    "full": AttentionKind(),
    "sliding_window": AttentionKind("sliding_window", sliding_window=24),
    "chunked_local": AttentionKind("chunked_local", chunk_size=32),
    "cross": AttentionKind("cross", causal=False),
    "alibi": AttentionKind("alibi", alibi=True),
    "softcap": AttentionKind("softcap", softcap=2.0),
    "sinks": AttentionKind("sinks", sinks=True),
    "static_sink": AttentionKind("static_sink", sink_len=32),
    "mla": AttentionKind("mla", mla_rope_dim=64),
}
