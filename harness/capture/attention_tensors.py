"""One attention layer's inputs, outputs and metadata per step, for attention replay.

Wraps the forward of vLLM's CPU attention backend (CPUAttentionBackendImpl) in
this process; for the chosen layer it keeps, per forward pass, the new tokens'
query/key/value, the attention output, the request ids in row order (from the
model runner's input batch) and the metadata the kernel ran with. They are
saved as a safetensors sidecar (never pickled) named by the trace header's
`tensors` field, in the layout of specs/ATTENTION.md ("Recorded tensors"),
which harness/attention/sidecar.py reads; specs/CAPTURE.md lists the extras.

The model runner must run in the scheduler's process (the tiny engine with
VLLM_ENABLE_V1_MULTIPROCESSING=0), so that pass n is the trace's: the number
of `step` events before it, minus one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Kept besides the contract's tensors: what the kernel was given, so a reader
# can check the metadata it derives from the trace's allocations.
_METADATA_TENSORS = ("seq_lens", "block_table", "slot_mapping")


@dataclass(slots=True)
class AttentionTensorCapture:
    layer_index: int = 0
    # Passes kept at most (the first ones); the sidecar grows with tokens x steps.
    max_steps: int = 16
    # The model runner's request ids in row order (set by engine capture).
    req_ids: Callable[[], list[str]] | None = None
    step: int = 0
    tensors: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    _original: Any = None
    _cls: Any = None

    def on_step(self, num_steps: int) -> None:
        """The recorder's step callback: `num_steps` step events so far."""
        self.step = num_steps - 1

    def install(self) -> None:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        cls = CPUAttentionBackendImpl
        original = cls.forward
        capture = self
        marker = f".layers.{self.layer_index}."

        def forward(impl, layer, query, key, value, kv_cache, attn_metadata, output, *args,
                    **kwargs):
            out = original(impl, layer, query, key, value, kv_cache, attn_metadata, output,
                           *args, **kwargs)
            name = getattr(layer, "layer_name", "")
            if (attn_metadata is not None and marker in f".{name}."
                    and capture.step not in capture.steps
                    and len(capture.steps) < capture.max_steps):
                capture._keep(name, impl, query, key, value, output, attn_metadata)
            return out

        cls.forward = forward
        self._cls, self._original = cls, original

    def uninstall(self) -> None:
        if self._cls is not None:
            self._cls.forward = self._original
            self._cls = None

    def _keep(self, name, impl, query, key, value, output, md) -> None:
        import torch

        n = md.num_actual_tokens
        prefix = f"step.{self.step}."
        num_heads, head_size = impl.num_heads, impl.head_size

        def keep(key_: str, t) -> None:
            self.tensors[prefix + key_] = t.detach().clone().contiguous()

        keep("query", query[:n].reshape(n, num_heads, head_size))
        keep("key", key[:n])
        keep("value", value[:n])
        keep("output", output[:n].reshape(n, num_heads, head_size))
        keep("query_start_loc", md.query_start_loc.to(torch.int32))
        for attr in _METADATA_TENSORS:
            keep(attr, getattr(md, attr))
        # Their scale, so a reader sees the signal is large enough to compare.
        self.metadata[prefix + "rms"] = json.dumps({
            k: round(float(self.tensors[prefix + k].float().pow(2).mean().sqrt()), 6)
            for k in ("query", "key", "value", "output")})
        num_reqs = md.query_start_loc.shape[0] - 1
        ids = self.req_ids()[:num_reqs] if self.req_ids is not None else []
        self.metadata[prefix + "req_ids"] = json.dumps(ids)
        self.steps.append(self.step)
        self.metadata.update(layer=name, num_heads=str(num_heads), scale=repr(float(impl.scale)))
        window = getattr(impl, "sliding_window", None)
        if isinstance(window, int) and window > 0:  # vLLM's CPU backend: -1 for none
            self.metadata["sliding_window"] = str(window)

    def save(self, path: str, model_shape: dict) -> None:
        from safetensors.torch import save_file

        metadata = {
            "format": "kvconform-attention/1",
            "steps": ",".join(str(s) for s in self.steps),
            "kv_cache_layout": "[num_blocks, num_kv_heads, block_size, 2 * head_size]",
            **{k: str(v) for k, v in model_shape.items()},
            **self.metadata,
        }
        save_file(self.tensors, path, metadata=metadata)
        os.chmod(path, 0o644)  # safetensors writes through a private temporary file
