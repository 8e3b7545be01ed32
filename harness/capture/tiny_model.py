"""A tiny random model, written locally: no model hub.

vLLM builds its configs from a model folder; this one holds a `config.json`
and, for engines whose attention tensors matter, seeded O(1) weights
(seeded_weights.py; without them engines use load_format="dummy") and
skip_tokenizer_init=True (prompts are token ids). vLLM 0.32's CPU attention
needs head_size >= 32 and block sizes that are multiples of 32.

By default a Qwen2 (full attention on every layer). With `sliding_window`
set, a hybrid: the layers alternate sliding-window and full attention
(`layer_types`), so vLLM's hybrid allocator builds two KV cache groups. That
model is a Llama (same shapes: 0.32's LlamaAttention passes each layer its own
window from `layer_types`); vLLM 0.32's Qwen2 cannot mix the two (Qwen2Model
asserts `max_window_layers == num_hidden_layers` when `layer_types` differ,
and its attention takes no per-layer window).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True, slots=True)
class TinyModel:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1000
    intermediate_size: int = 512
    max_position_embeddings: int = 32768
    # Hybrid: the window (tokens) of the sliding-window layers; None: none.
    sliding_window: int | None = None

    @classmethod
    def hybrid(cls, sliding_window: int, vocab_size: int = 1000,
               num_hidden_layers: int = 4) -> TinyModel:
        """Sliding-window layers (0, 2, ...) mixed with full attention (1, 3, ...)."""
        return cls(vocab_size=vocab_size, num_hidden_layers=num_hidden_layers,
                   sliding_window=sliding_window)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def layer_types(self) -> list[str] | None:
        if self.sliding_window is None:
            return None
        return [SLIDING if i % 2 == 0 else FULL for i in range(self.num_hidden_layers)]

    @property
    def architecture(self) -> str:
        return "Qwen2" if self.sliding_window is None else "Llama"

    def describe(self) -> str:
        if self.sliding_window is None:
            return "random Qwen2"
        sliding = [i for i, t in enumerate(self.layer_types) if t == SLIDING]
        return (f"random {self.num_hidden_layers}-layer Llama, sliding window "
                f"{self.sliding_window} on layers {', '.join(map(str, sliding))}, full "
                "attention on the others")

    def config(self) -> dict:
        shape = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
        }
        common = {
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        if self.sliding_window is None:
            return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **shape,
                    **common, "sliding_window": None, "use_sliding_window": False}
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **shape,
                **common, "sliding_window": self.sliding_window,
                "layer_types": self.layer_types}

    def write(self, folder: str | None = None, weights_seed: int | None = None) -> str:
        """Write config.json into `folder` (a new temporary one by default),
        and with weights_seed seeded O(1) weights (seeded_weights.py)."""
        prefix = f"kvconform-tiny-{self.architecture.lower()}-"
        path = Path(folder or tempfile.mkdtemp(prefix=prefix))
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config(), indent=1))
        if weights_seed is not None:
            from harness.capture.seeded_weights import write_seeded_weights

            write_seeded_weights(self, str(path), weights_seed)
        return str(path)
