"""A tiny random Qwen2 model, written locally: no model hub, no weights on disk.

vLLM builds its configs from a model folder; this one holds only a
`config.json`. Engines load it with load_format="dummy" (random weights) and
skip_tokenizer_init=True (prompts are token ids). vLLM 0.32's CPU attention
needs head_size >= 32 and block sizes that are multiples of 32.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TinyModel:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1000
    intermediate_size: int = 512
    max_position_embeddings: int = 32768

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def config(self) -> dict:
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            **asdict(self),
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "sliding_window": None,
            "use_sliding_window": False,
        }

    def write(self, folder: str | None = None) -> str:
        """Write config.json into `folder` (a new temporary one by default)."""
        path = Path(folder or tempfile.mkdtemp(prefix="kvconform-tiny-qwen2-"))
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config(), indent=1))
        return str(path)
