"""What both sides of the sizing differential answer, in one plain form
(specs/SIZING.md): JSON data that compares with `==`.

    {"max_model_len": N,
     "workers": [{"num_blocks", "kv_tp_replicas",
                  "groups": [{"layers": [...], "spec": SPEC}],
                  "tensors": [{"size", "layers", "layer_stride", "block_stride", "offset"}]}],
     "scheduler": {"num_blocks", "groups": [SPEC], "block_sizes": [scheduler, hash],
                   "capacity": {"tokens", "concurrency"}}}

A stage that raises ends the answer with `"refused": {"at": stage, "error":
the exception's builtin class}` (messages are each side's own words).
"""

from __future__ import annotations

import math

from harness.core.sizing_shape import SizingShape

# The stages of a sizing run, in order.
STAGES = ("configs", "scheduler", "block_sizes", "capacity")
# The spec fields an answer carries where the spec has them (names both
# sides' spec classes use; dtype sizes in bytes).
SPEC_FIELDS = ("num_kv_heads", "head_size", "head_size_v", "dtype_size", "sliding_window",
               "attention_chunk_size", "sink_len", "extra_retained_tokens", "page_size_padded",
               "kv_quant_mode", "max_tp_shards", "dcp_sharded", "shapes", "dtype_sizes",
               "mamba_cache_mode", "num_speculative_blocks")
# How sizing refuses a shape (vLLM asserts, raises ValueError for too little
# memory, NotImplementedError for pages it cannot unify); a refusal is
# named by one of these (each side's own subclasses compare equal). Anything
# else vLLM raises is the harness's or the environment's problem, not an answer.
REFUSALS = (NotImplementedError, ValueError, AssertionError)


def refusal(stage: str, e: BaseException) -> dict:
    name = next((c.__name__ for c in REFUSALS if isinstance(e, c)), type(e).__name__)
    return {"at": stage, "error": name}


def plain(value):
    """Tuples as lists, enums by their value, recursively."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "value") and not isinstance(value, (int, float, str, bool)):
        return plain(value.value)
    if isinstance(value, float):
        return round(value, 9) if math.isfinite(value) else str(value)
    return value


def capacity(tokens: int, concurrency: float) -> dict:
    return {"tokens": int(tokens), "concurrency": plain(float(concurrency))}


def in_flight_tokens(shape: SizingShape) -> int:
    """The tokens in flight both sides plan with (vLLM's engine derives it
    from its scheduler before sizing: fixed, whatever auto-fit decides)."""
    return shape.max_in_flight_tokens or shape.max_model_len
