"""Capture: record what a real vLLM scheduler asks of its KV cache manager.

Every source ends in the same recorder (`recorder.py`), which instruments a live
vLLM KVCacheManager and writes each call and vLLM's answer as trace events
(specs/TRACE_FORMAT.md, specs/CAPTURE.md):

- scheduler-driven workloads (`scheduler_capture.py`): vLLM's real Scheduler,
  no model, seeded fake model outputs, workload presets from traces/workloads/;
- a tiny real engine on CPU (`engine_capture.py`), optionally with one layer's
  attention tensors in a safetensors sidecar (`attention_tensors.py`);
- a vLLM general plugin (`plugin.py`) for running servers, into rotating parts
  (`segments.py`);
- KV-event streams (`kv_event_stream.py`, `kv_event_trace.py`);
- and `anonymize.py`, a keyed, prefix-preserving token remap.

Around them: `presets.py` / `synth.py` (workload presets and their traffic),
`fake_model.py`, `tiny_model.py`, `header.py` (trace headers from a live
scheduler), `sinks.py` (trace files), `overhead.py` (what recording costs),
`overlay_platform.py` (vLLM 0.17.1 through its source overlay), `cli.py`.

This package and harness/backends/ are the only places that import vllm.
"""
