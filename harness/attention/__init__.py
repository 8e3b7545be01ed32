"""The attention-output differential (DESIGN.md §7, specs/ATTENTION.md).

- `differential.py`: `check_attention(trace_path, AttentionOptions()) ->
  AttentionOutcome`, what `kvconform diff` runs for traces with a `model` header;
- `steps.py`: per-step batches, block tables and slot mappings from a trace;
- `layer_check.py`: one layer, batch by batch: impl vs float64 reference vs vLLM;
- `reference.py`, `seeded.py`, `sidecar.py`, `compare.py`, `tolerances.py`;
- `cpu_attn_layout.py`: vLLM CPU cache layout <-> [block, offset, head, dim];
- `kernel_cases.py`: paged-attention inputs for the kernel tests and gpu_check;
- the vLLM attention adapters live with the other vLLM adapters:
  harness/backends/vllm_cpu_attention.py and vllm_triton_attention.py (nothing
  here imports vllm).
"""
