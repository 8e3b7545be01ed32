"""Test-by-test findings for impl failures no adapter can name by itself
(an assertion that differs), each after reading the test and impl.

A key is a test name (with or without its parameters); the verdict is
FAILED with a feature impl lacks, FAILED with a divergence to fix, or
NOT_APPLICABLE with the vLLM-only thing the test asserts on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    verdict: str
    reason: str
    feature: str | None = None


_NA, _FAIL = "not_applicable", "failed"

FINDINGS: dict[str, Finding] = {
    "test_generate_block_hash_extra_keys_prompt_embeds_cached": Finding(
        _NA, "counts calls of vLLM's tensor_data helper (monkeypatched on vLLM's module)"),
    "test_block_stored_event_group_idx_out_of_bounds": Finding(
        _NA, "asserts on the warning vLLM's logger prints"),
    "test_mla_with_incompatible_swa_uses_one_full_allocation_group": Finding(
        _NA, "asserts on the warning vLLM's logger prints (impl groups the layers the same; "
             "the grouping asserts before it pass on impl)"),
    "test_free_kv_cache_block_queue_append_n": Finding(
        _FAIL, "divergence: append_n onto a queue whose tail link was cut raises "
               "AttributeError in impl; vLLM raises an AssertionError naming the broken link"),
    "test_free_kv_cache_block_queue_operations": Finding(
        _NA, "asserts on the text of vLLM's error message for an empty free queue (impl "
             "raises the same ValueError in its own words: clean room)"),
    "test_unidentifiable_draft_with_mamba_warns": Finding(
        _NA, "asserts on the warning vLLM's logger prints when no draft group is found"),
    "test_non_mtp_eagle_hybrid_still_warns": Finding(
        _NA, "asserts on the warning vLLM's logger prints when no draft group is found"),
    # tests/v1/worker/ (issue 22): tests that pass on vLLM without a
    # KV-cache answer impl could give, or one impl does not model.
    "test_cp_checks_allow_a_replicated_draft_backend_without_dcp": Finding(
        _NA, "checks the attention backends' capability flags of the model's layers "
             "(check_attention_cp_compatibility over a monkeypatched layer lookup)"),
    "test_mrv2_kv_pool_only_wraps_backing_allocation": Finding(
        _NA, "which of the new model runner's init_kv_cache calls run inside the allocation "
             "context (every callee monkeypatched on vLLM's modules)"),
    "test_mrv1_kv_pool_only_wraps_backing_allocation": Finding(
        _NA, "which of the model runner's KV tensor calls run inside the allocation context "
             "(every callee monkeypatched on vLLM's modules)"),
    "test_kv_wake_does_not_run_model_runner_recovery": Finding(
        _NA, "the worker's wake-up from sleep mode (saved buffers, no KV cache answer)"),
    # vLLM 0.30.0 (issue 23): read in its source, not modelled yet.
    "test_cpu_manager": Finding(
        _FAIL, "divergence: 0.30's CPU offload manager (no per-request access records) "
               "picks its stores otherwise; impl models 0.32's tier (offload_cpu_tier is "
               "false for 0.30)"),
    "test_large_dsv4_launch_geometry": Finding(
        _NA, "the launch geometry of vLLM's KV block zeroing kernel (KVBlockZeroer's segment "
             "table and Triton grid): impl has no zeroing kernel to plan"),
}


def lookup(test_name: str) -> Finding | None:
    if test_name in FINDINGS:
        return FINDINGS[test_name]
    return FINDINGS.get(test_name.split("[", 1)[0])
