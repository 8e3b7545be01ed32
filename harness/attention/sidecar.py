"""Attention tensors recorded from a real engine: the trace's safetensors sidecar.

The contract (specs/ATTENTION.md, "Recorded tensors"): one attention layer's
inputs and output per forward pass, keyed by the pass's step number n (the
number of `step` events before it, minus one):

  step.<n>.query            [num_tokens, num_heads, head_size]
  step.<n>.key, .value      [num_tokens, num_kv_heads, head_size]
  step.<n>.output           [num_tokens, num_heads, head_size]   (optional)
  step.<n>.query_start_loc  int32 [num_reqs + 1]

and in the safetensors metadata (string values): `step.<n>.req_ids`, a JSON
list of the batch's request ids in row order, plus optionally `layer`,
`num_heads`, `scale`, `sliding_window`. Rows past query_start_loc[-1] are
padding. Tensors load lazily, one step at a time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch


class SidecarError(ValueError):
    """The sidecar is missing or does not follow the contract."""


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@dataclass(slots=True)
class RecordedRows:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor | None


class RecordedTensors:
    def __init__(self, path: str) -> None:
        from safetensors import safe_open

        if not os.path.exists(path):
            raise SidecarError(f"{path}: no such tensors sidecar")
        self.path = path
        try:
            self._file = safe_open(path, framework="pt")
        except Exception as e:  # noqa: BLE001 - safetensors' own error types vary by version
            raise SidecarError(f"{path}: not a safetensors file ({_first_line(e)})") from None
        self.metadata: dict[str, str] = self._file.metadata() or {}
        self._keys = set(self._file.keys())
        self._steps: dict[int, tuple[dict[str, tuple[int, int]], dict[str, torch.Tensor]]] = {}

    def meta_int(self, name: str) -> int | None:
        value = self.metadata.get(name)
        return None if value in (None, "", "null") else int(value)

    def meta_float(self, name: str) -> float | None:
        value = self.metadata.get(name)
        return None if value in (None, "", "null") else float(value)

    def has_step(self, step: int) -> bool:
        return f"step.{step}.query" in self._keys

    def _load(self, step: int):
        if step not in self._steps:
            prefix = f"step.{step}."
            try:
                tensors = {name: self._file.get_tensor(prefix + name)
                           for name in ("query", "key", "value", "query_start_loc")}
                req_ids = json.loads(self.metadata[prefix + "req_ids"])
            except (KeyError, json.JSONDecodeError) as e:
                raise SidecarError(f"{self.path}: step {step}: missing or bad {e}") from None
            if prefix + "output" in self._keys:
                tensors["output"] = self._file.get_tensor(prefix + "output")
            qsl = tensors["query_start_loc"].tolist()
            if len(qsl) != len(req_ids) + 1:
                raise SidecarError(f"{self.path}: step {step}: {len(req_ids)} req_ids but "
                                   f"query_start_loc has {len(qsl)} entries")
            spans = {r: (qsl[i], qsl[i + 1]) for i, r in enumerate(req_ids)}
            # Only the latest step stays loaded: passes are replayed in order.
            self._steps = {step: (spans, tensors)}
        return self._steps[step]

    def rows(self, step: int, req_id: str, num_tokens: int) -> RecordedRows:
        """The rows of one request's query tokens in pass `step`."""
        spans, t = self._load(step)
        if req_id not in spans:
            raise SidecarError(f"{self.path}: step {step} has no rows for request '{req_id}'")
        start, end = spans[req_id]
        if end - start != num_tokens:
            raise SidecarError(f"{self.path}: step {step}: request '{req_id}' has "
                               f"{end - start} rows, the trace schedules {num_tokens}")
        out = t.get("output")
        return RecordedRows(t["query"][start:end], t["key"][start:end],
                            t["value"][start:end],
                            None if out is None else out[start:end])
