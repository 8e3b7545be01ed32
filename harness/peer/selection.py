"""Which of vLLM's test files `kvconform peer` runs, and why.

Under the sdist's tests/v1/core: the issue's five files are the KV cache
manager's unit tests; the extras also drive vLLM's KV cache classes directly
(not through the Scheduler or an engine). Under tests/v1/kv_offload/cpu: the
offload tier's manager and policies; under
tests/v1/kv_connector/unit/offloading_connector: the OffloadingConnector's
scheduler side and events over impl's KV cache. Under tests/v1/worker: the worker's
block tables, slot mappings and context-parallel lengths (issue 22). The
files left out, with the reason, are listed for the report.
"""

from __future__ import annotations

CORE = "tests/v1/core"

REQUIRED = (
    "test_prefix_caching.py",
    "test_kv_cache_utils.py",
    "test_single_type_kv_cache_manager.py",
    "prefix_cache/test_partial_prefix_cache_hits.py",
    "prefix_cache/test_partial_prefix_cache_primitives.py",
)

EXTRA = {
    "test_mamba_align_chunk_split.py":
        "builds KVCacheManager over Mamba 'align' groups directly; the Scheduler's chunk "
        "split tests run on impl's checkpoint helpers (rebind.rebind_vllm_callers)",
    "test_kv_cache_metrics.py": "vLLM's block residency metrics collector over KVCacheBlocks "
                                "(impl's collector through adapters/metrics.py; the tests "
                                "patch time.monotonic_ns, which impl reads too)",
}

LEFT_OUT = {
    "test_scheduler.py": "the Scheduler, which builds vLLM's own KVCacheManager",
    "test_async_scheduler.py": "the Scheduler (async scheduling)",
    "test_deferred_block_free.py": "the Scheduler's deferred frees; the KV cache part is "
                                   "covered by test_prefix_caching's pop_blocks_for_free tests",
    "test_swa_inflight_window_free.py": "the Scheduler",
    "test_prefix_replay.py": "the Scheduler",
    "test_worker_slot_overflow.py": "the Scheduler",
    "test_priority_preemption_bug.py": "the Scheduler",
    "test_priority_scheduler_random.py": "the Scheduler",
    "prefix_cache/test_mamba_eagle_resume_checkpoint.py": "the Scheduler",
    "test_contiguous_kv_packing.py": "packed grouping beyond impl's model: its allocation "
        "(allocate_kv_cache) runs on impl, but on 0.32.0 only 11 of the 28 tests that pass "
        "on vLLM pass on impl: 7 need TP-replicated Mamba state groups (MambaSpec."
        "tp_replicated), 1 SWA bounded replay, 3 match vLLM's error texts, and 6 call "
        "vLLM's private packing helpers (_get_per_layer_spec, _pool_bytes_per_block, ...)",
    "test_kv_sharing.py": "the worker's KV sharing helper",
    "test_encoder_cache_manager.py": "the encoder cache, not the KV cache",
    "test_output.py": "scheduler output types",
    "test_repetition_detection.py": "sampling",
    "test_reset_prefix_cache_e2e.py": "a real engine (model weights)",
    "test_scheduler_e2e.py": "a real engine (model weights)",
    "prefix_cache/test_hybrid_prefix_cache_hit_rate.py": "a real engine (model weights)",
}


# The CPU offload tier's manager and policy tests (issue 21); the rest of
# tests/v1/kv_offload/ is the worker (GPU copies, shared memory) and tiering.
# The OffloadingConnector's scheduler side and its KV events: vLLM's
# connector and Scheduler code, with impl's KV cache manager, offload tier,
# hashing and manager classes under it (rebind.rebind_vllm_callers).
OFFLOADING_CONNECTOR = "tests/v1/kv_connector/unit/offloading_connector"
OFFLOAD = ("tests/v1/kv_offload/cpu/test_manager.py",
           "tests/v1/kv_offload/cpu/policies/test_factory.py",
           f"{OFFLOADING_CONNECTOR}/test_scheduler.py",
           f"{OFFLOADING_CONNECTOR}/test_events.py")
OFFLOAD_LEFT_OUT = {
    "tests/v1/simple_kv_offload/test_scheduler.py, test_kv_events.py": "the simple CPU "
        "offload's scheduler side: its CPU pool and GPU pinning are vLLM's (impl has no "
        "model of them yet; on 0.32.0, 4 of its 94 tests that pass on vLLM run on impl)",
    f"{OFFLOADING_CONNECTOR}/test_worker*.py, test_canonical_mapping.py": "the worker "
        "side (GPU copies, canonical tensor mapping)",
}


# The worker's block tables, slot mappings and context-parallel lengths
# (issue 22), in tests/v1/worker/. On a CPU build of vLLM the GPU-only tests
# of these files skip on vLLM itself and are in no count.
WORKER = "tests/v1/worker"
WORKER_FILES = (
    "test_gpu_block_table.py",
    "test_cp_utils.py",
    "test_gpu_kpool_tail_slot_mapping.py",
    "test_kv_block_zeroer.py",
    "test_kv_cache_allocation_scope.py",
)
# The InputBatch tests that move rows of its block table (condense, swap):
# the batch's block table is impl's there (rebind.rebind_vllm_callers).
INPUT_BATCH_BLOCK_TABLE = (
    "test_sampling_metadata_in_input_batch",
    "test_swap_states_in_input_batch",
    "test_condense_clears_stale_allowed_token_ids_mask",
    "test_swap_states_preserves_allowed_token_ids_mask",
)
WORKER_LEFT_OUT = {
    "test_gpu_input_batch.py (the other tests)": "pooling, prompt-embedding and spec-token "
        "buffers of the InputBatch; its block table only takes empty rows there",
    "test_gpu_input_batch_v2.py, test_gpu_model_runner*.py": "the model runners (a model, "
        "a device)",
    "test_gpu_pcp_manager.py": "the new model runner's prefill context-parallel token split "
        "(PCPManager, its input buffers and CUDA graph descriptors), not the block table",
}


def worker_paths() -> list[str]:
    batch = f"{WORKER}/test_gpu_input_batch.py"
    return ([f"{WORKER}/{name}" for name in WORKER_FILES]
            + [f"{batch}::{name}" for name in INPUT_BATCH_BLOCK_TABLE])


def test_paths() -> list[str]:
    return ([f"{CORE}/{name}" for name in (*REQUIRED, *EXTRA)] + list(OFFLOAD)
            + worker_paths())
