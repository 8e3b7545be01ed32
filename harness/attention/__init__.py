"""The attention-output differential (specs/ATTENTION.md).

- `differential.py`: `check_attention(trace_path, AttentionOptions()) ->
  AttentionOutcome` (exit code an `ExitCode`), what `kvconform diff`, the gate
  and `pytest traces/` run for traces with a `model` header;
- `steps.py`: per-step batches, block tables and slot mappings from a trace,
  and the rows as the trace's own answers give them;
- `ledger.py`: the block ledger (slots, table entries, identities and bytes);
- `layer_check.py`: one layer, batch by batch: impl vs float64 vs vLLM;
- `kinds.py`: every attention kind vLLM serves, as parameters; `impl_call.py`
  runs impl's kernels for any of them;
- `reference.py`, `tolerances.py` (the error model), `compare.py`, `seeded.py`,
  `sidecar.py`, `kernel_cases.py` (kernel inputs for the tests and gpu_check).

The vLLM side lives with the other vLLM adapters, downstream of nothing here:
harness/backends/vllm_cpu_attention.py (with vllm_cpu_attn_layout.py) and
vllm_triton_attention.py. This package imports them; they never import it.
"""
