"""Seeded random weights for the tiny engine model, scaled so that a layer's
queries, keys, values and attention outputs are O(1).

vLLM's dummy loader fills every weight uniformly in [-1e-3, 1e-3]: the
attention tensors it produces are ~1e-3, below any bf16 tolerance, so a
recorded output said nothing (an all-zero output passed). These weights are
written as a safetensors file into the model folder and loaded as real
weights, in the engine core's process too:

- embeddings N(0, 1) and norm weights 1, so each layer's normed input has RMS 1;
- q_proj N(0, (Q_STD^2) / hidden): queries of standard deviation Q_STD, which
  with unit keys gives logits of standard deviation Q_STD (peaked enough that
  an output row is a mix of a few values: |output| ~ 0.2 to 1);
- k_proj, v_proj N(0, 1 / hidden): unit keys and values; biases 0;
- o_proj, the MLP and lm_head scaled by 1 / sqrt(fan_in), so the residual
  stream and the sampled tokens stay well conditioned.
"""

from __future__ import annotations

import math

import torch

Q_STD = 2.0
WEIGHTS_FILE = "model.safetensors"


def seeded_state_dict(model, seed: int) -> dict[str, torch.Tensor]:
    """HF-named bf16 weights of a TinyModel (Qwen2 or Llama layout)."""
    g = torch.Generator().manual_seed(seed)
    h, inter, vocab = model.hidden_size, model.intermediate_size, model.vocab_size
    d = model.head_size
    q_out, kv_out = model.num_attention_heads * d, model.num_key_value_heads * d

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) * std).to(torch.bfloat16)

    ones = torch.ones(h, dtype=torch.bfloat16)
    sd = {"model.embed_tokens.weight": normal(vocab, h, 1.0),
          "model.norm.weight": ones.clone(),
          "lm_head.weight": normal(vocab, h, 1 / math.sqrt(h))}
    for i in range(model.num_hidden_layers):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": ones.clone(),
            p + "post_attention_layernorm.weight": ones.clone(),
            p + "self_attn.q_proj.weight": normal(q_out, h, Q_STD / math.sqrt(h)),
            p + "self_attn.k_proj.weight": normal(kv_out, h, 1 / math.sqrt(h)),
            p + "self_attn.v_proj.weight": normal(kv_out, h, 1 / math.sqrt(h)),
            p + "self_attn.o_proj.weight": normal(h, q_out, 1 / math.sqrt(q_out)),
            p + "mlp.gate_proj.weight": normal(inter, h, 1 / math.sqrt(h)),
            p + "mlp.up_proj.weight": normal(inter, h, 1 / math.sqrt(h)),
            p + "mlp.down_proj.weight": normal(h, inter, 1 / math.sqrt(inter)),
        }
        if model.architecture == "Qwen2":  # q/k/v carry biases
            for name, n in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
                sd[p + f"self_attn.{name}.bias"] = torch.zeros(n, dtype=torch.bfloat16)
    return sd


def write_seeded_weights(model, folder: str, seed: int) -> str:
    from safetensors.torch import save_file

    path = f"{folder}/{WEIGHTS_FILE}"
    save_file(seeded_state_dict(model, seed), path, metadata={"format": "pt"})
    return path


def describe(seed: int) -> str:
    return (f"seeded normal weights (seed {seed}): embeddings N(0, 1), queries std "
            f"{Q_STD:g}, keys and values std 1")
