"""vLLM's CPU offload manager (vllm.v1.kv_offload.cpu.manager) behind the
offload protocol."""

from __future__ import annotations

from harness.backends.offload_base import (
    OffloadBackend,
    OffloadConfig,
    event_json,
    keys_hex,
    stats_json,
)


def missing_vllm_offload() -> str | None:
    """Why vLLM's CPU offload manager cannot be had here, or None."""
    try:
        import vllm.v1.kv_offload.cpu.manager  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


class VllmOffloadBackend(OffloadBackend):
    name = "vllm"

    def __init__(self, config: OffloadConfig) -> None:
        super().__init__(config)
        from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self._metrics = CPUOffloadingMetrics
        self.manager = CPUOffloadingManager(
            num_chunks=config.num_chunks, cache_policy=config.cache_policy,
            enable_events=config.enable_events, store_threshold=config.store_threshold,
            max_tracker_size=config.max_tracker_size)

    def new_context(self, req: str):
        from vllm.v1.kv_offload.base import ReqContext

        return ReqContext(req_id=req)

    def op_new_request(self, req):
        return self.manager.on_new_request(self.ctx(req)).policy.name

    def op_lookup(self, req, key):
        return self.manager.lookup(key, self.ctx(req)).name

    def op_load_source(self, req, key):
        return self.manager.get_load_source(key, self.ctx(req)).name.lower()

    def op_prepare_load(self, req, keys):
        return [int(x) for x in self.manager.prepare_load(keys, self.ctx(req)).block_ids]

    def op_touch(self, req, keys):
        self.manager.touch(keys, self.ctx(req))

    def op_complete_load(self, req, keys):
        self.manager.complete_load(keys, self.ctx(req))

    def op_prepare_store(self, req, keys):
        out = self.manager.prepare_store(keys, self.ctx(req))
        if out is None:
            return None
        return {"keys_to_store": keys_hex(out.keys_to_store),
                "chunk_ids": [int(x) for x in out.store_spec.block_ids],
                "evicted_keys": keys_hex(out.evicted_keys)}

    def op_complete_store(self, req, keys, success):
        self.manager.complete_store(keys, self.ctx(req), success=success)

    def op_finished(self, req):
        self.manager.on_request_finished(self.ctx(req))

    def op_schedule_end(self, new, preempted):
        from vllm.v1.kv_offload.base import ScheduleEndContext

        self.manager.on_schedule_end(
            ScheduleEndContext(new_req_ids=new, preempted_req_ids=preempted))

    def op_take_events(self):
        # metadata_only: 0.33's failed stores; older events lack the field.
        return [event_json(e.keys, e.removed, e.medium.value, getattr(e, "metadata_only", False))
                for e in self.manager.take_events()]

    def op_reset(self):
        self.manager.reset_cache()

    def op_stats(self):
        m = self._metrics
        stats = self.manager.get_stats()
        reduced = stats.reduce()
        # The histogram's samples themselves (reduce() keeps only count and sum).
        values = stats.data["data"].get(m.CPU_ALLOCATION_SIZE, {}).get((), [])
        return stats_json(reduced[m.CPU_CACHE_USAGE_PERC], reduced[m.CPU_CACHE_WRITE_USAGE_PERC],
                          reduced[m.CPU_CACHE_READ_USAGE_PERC], values,
                          reduced.get(m.STORES_SKIPPED))

    def held(self):
        policy = self.manager._policy
        chunks = policy.chunks if hasattr(policy, "chunks") else {**policy.t1, **policy.t2}
        return {k: (c.chunk_id, c.ref_cnt) for k, c in chunks.items()}
