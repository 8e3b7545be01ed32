"""impl's CPU offload manager behind the offload protocol."""

from __future__ import annotations

from harness.backends.offload_base import (
    OffloadBackend,
    OffloadConfig,
    event_json,
    keys_hex,
    stats_json,
)
from impl.kv_offload.context import RequestContext
from impl.kv_offload.manager import CPUOffloadingManager
from impl.profiles import VersionProfile


class ImplOffloadBackend(OffloadBackend):
    name = "impl"

    def __init__(self, config: OffloadConfig, profile: VersionProfile) -> None:
        super().__init__(config)
        self.manager = CPUOffloadingManager(
            num_chunks=config.num_chunks, cache_policy=config.cache_policy,
            enable_events=config.enable_events, store_threshold=config.store_threshold,
            max_tracker_size=config.max_tracker_size,
            request_ranked_lru=profile.offload_request_ranked_lru,
            announce_failed_stores=profile.offload_failed_store_events)

    def new_context(self, req: str):
        return RequestContext(req_id=req)

    def op_new_request(self, req):
        return self.manager.on_new_request(self.ctx(req)).policy.name

    def op_lookup(self, req, key):
        return self.manager.lookup(key, self.ctx(req)).name

    def op_load_source(self, req, key):
        return self.manager.get_load_source(key, self.ctx(req))

    def op_prepare_load(self, req, keys):
        return self.manager.prepare_load(keys, self.ctx(req))

    def op_touch(self, req, keys):
        self.manager.touch(keys, self.ctx(req))

    def op_complete_load(self, req, keys):
        self.manager.complete_load(keys, self.ctx(req))

    def op_prepare_store(self, req, keys):
        plan = self.manager.prepare_store(keys, self.ctx(req))
        if plan is None:
            return None
        return {"keys_to_store": keys_hex(plan.keys_to_store), "chunk_ids": list(plan.chunk_ids),
                "evicted_keys": keys_hex(plan.evicted_keys)}

    def op_complete_store(self, req, keys, success):
        self.manager.complete_store(keys, self.ctx(req), success=success)

    def op_finished(self, req):
        self.manager.on_request_finished(self.ctx(req))

    def op_schedule_end(self, new, preempted):
        self.manager.on_schedule_end((tuple(new), tuple(preempted)))

    def op_take_events(self):
        return [event_json(e.keys, e.removed, e.medium, e.metadata_only)
                for e in self.manager.take_events()]

    def op_reset(self):
        self.manager.reset_cache()

    def op_stats(self):
        s = self.manager.get_stats()
        return stats_json(s.usage, s.write_usage, s.read_usage, s.allocation_sizes,
                          s.stores_skipped)

    def held(self):
        policy = self.manager.policy
        chunks = policy.held if hasattr(policy, "held") else {**policy.t1, **policy.t2}
        return {k: (c.chunk_id, c.ref_cnt) for k, c in chunks.items()}
