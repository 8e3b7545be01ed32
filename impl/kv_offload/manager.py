"""The CPU offload manager (specs/KV_OFFLOAD.md): a pool of CPU slots, ref
counts (pins) over them, the store threshold, events and stats; which chunk
to drop is the policy's decision."""

from collections.abc import Collection, Iterator

from impl.kv_offload.access import RequestAccess
from impl.kv_offload.admission import OfferCounter
from impl.kv_offload.chunk import Chunk
from impl.kv_offload.keys import key_group_idx
from impl.kv_offload.policies.registry import PolicyRegistry
from impl.kv_offload.results import (
    HIT_SOURCE_HOST,
    LookupResult,
    OffloadEvent,
    OffloadPolicy,
    RequestOffloadingContext,
    StorePlan,
)
from impl.kv_offload.stats import OffloadStats


class CPUOffloadingManager:
    def __init__(self, num_chunks: int, cache_policy: str = "lru",
                 cache_policy_module_path: str | None = None, enable_events: bool = False,
                 store_threshold: int = 1, max_tracker_size: int = 64_000,
                 policies: type[PolicyRegistry] = PolicyRegistry,
                 request_ranked_lru: bool = False,
                 announce_failed_stores: bool = False) -> None:
        """request_ranked_lru and announce_failed_stores: 0.33's tier (the
        profile fields offload_request_ranked_lru, offload_failed_store_events)."""
        self.num_chunks = num_chunks
        policy_cls = policies.get_cache_policy_cls(cache_policy, cache_policy_module_path,
                                                   request_ranked_lru)
        self.policy = policy_cls(cache_capacity=num_chunks)
        # 0.33 tells the policy of each key a running request first sees.
        self.reports_accesses = request_ranked_lru
        self.announce_failed_stores = announce_failed_stores
        self.events: list[OffloadEvent] | None = [] if enable_events else None
        self.store_threshold = store_threshold
        # Offers are counted only when a threshold can hold a store back.
        self.offers = (OfferCounter(store_threshold, max_tracker_size)
                       if store_threshold >= 2 else None)
        self.handed_out = 0          # slots 0..handed_out-1 have been used once
        self.free_slots: list[int] = []  # freed slots, the last freed reused first
        self.num_evictable = 0       # held chunks with ref_cnt 0
        self.num_storing = 0         # held chunks whose store is in flight
        self.generation = 0
        self.skipped_stores = 0
        self.allocation_sizes: list[int] = []

    # --- slots ---

    def num_free_slots(self) -> int:
        return len(self.free_slots) + self.num_chunks - self.handed_out

    def _take_slots(self, keys: list[bytes]) -> list[Chunk]:
        fresh = min(len(keys), self.num_chunks - self.handed_out)
        chunks = [Chunk(self.handed_out + i) for i in range(fresh)]
        self.handed_out += fresh
        for _ in range(len(keys) - fresh):
            chunks.append(Chunk(self.free_slots.pop()))
        return chunks

    # --- the per-request record ---

    def _access(self, ctx) -> RequestAccess:
        record = ctx.get_state(RequestAccess)
        if record is None or not record.belongs_to(self, self.generation):
            record = RequestAccess(self, self.generation)
            ctx.set_state(record)
        return record

    def _note_access(self, keys, ctx, inserted=(), reused=()) -> None:
        record = self._access(ctx)
        first_seen = []
        for key in keys:
            if key in record.observed:
                continue
            assert not record.done, "a finished request observed a new offload key"
            record.by_group.setdefault(key_group_idx(key), []).append(key)
            record.observed.add(key)
            first_seen.append(key)
        if first_seen and self.reports_accesses:
            self.policy.on_request_access(first_seen, ctx)
        record.inserted.update(inserted)
        # Reading back what this request itself stored is no second access.
        record.reused.update(k for k in reused if k not in record.inserted)

    # --- the operations ---

    def on_new_request(self, req_context) -> RequestOffloadingContext:
        self._access(req_context)
        return RequestOffloadingContext(OffloadPolicy.CHUNK_LEVEL)

    def lookup(self, key: bytes, req_context) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def get_load_source(self, key: bytes, req_context) -> str:
        # Where a hit's data comes from, for the hit-source metrics: host memory.
        return HIT_SOURCE_HOST

    def prepare_load(self, keys: Collection[bytes], req_context) -> list[int]:
        ids = []
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None, f"load of an offload key not held: {key!r}"
            assert chunk.is_ready, f"load of an offload key still being stored: {key!r}"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
            ids.append(chunk.chunk_id)
        self._note_access(keys, req_context, reused=keys)
        return ids

    def touch(self, keys: Collection[bytes], req_context) -> None:
        self.policy.touch(keys, req_context)

    def complete_load(self, keys: Collection[bytes], req_context) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None, f"load completed for an offload key not held: {key!r}"
            assert chunk.ref_cnt > 0, f"load completed for an unpinned offload key: {key!r}"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(self, keys: Collection[bytes], req_context) -> StorePlan | None:
        offer = list(keys)
        if self.offers is not None:
            self.offers.record(offer)
        candidates, ready = [], []
        for key in offer:
            chunk = self.policy.get(key)
            if chunk is None:
                candidates.append(key)
            elif chunk.is_ready:
                ready.append(key)
        if self.offers is not None:
            admitted = [k for k in candidates if self.offers.admits(k)]
            self.skipped_stores += len(candidates) - len(admitted)
            candidates = admitted
        record = self._access(req_context)
        first_misses = [k for k in candidates if k not in record.missed]
        if first_misses:
            # Before insertion, so ARC still sees the ghost entries.
            self.policy.on_store_miss(first_misses, req_context)
            record.missed.update(first_misses)
        seen = set(candidates)
        seen.update(ready)
        self._note_access([k for k in offer if k in seen], req_context, reused=ready)
        if not candidates:
            return StorePlan()
        self.allocation_sizes.append(len(candidates))
        shortfall = len(candidates) - self.num_free_slots()
        evicted_keys: list[bytes] = []
        if shortfall > 0:
            if shortfall > self.num_evictable:
                return None
            # The offer's own keys stay, whatever their recency.
            victims = self.policy.evict(shortfall, set(offer))
            if victims is None:
                return None
            self.num_evictable -= len(victims)
            for key, chunk in victims:
                self.free_slots.append(chunk.chunk_id)
                evicted_keys.append(key)
            if self.events is not None:
                self.events.append(OffloadEvent(keys=evicted_keys, removed=True))
        chunks = self._take_slots(candidates)
        for key, chunk in zip(candidates, chunks):
            self.policy.insert(key, chunk, req_context)
        self.num_storing += len(candidates)
        record.inserted.update(candidates)
        return StorePlan(keys_to_store=candidates, chunk_ids=[c.chunk_id for c in chunks],
                         evicted_keys=evicted_keys)

    def complete_store(self, keys: Collection[bytes], req_context, success: bool = True) -> None:
        stored, dropped = [], []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or chunk.is_ready:
                continue
            self.num_storing -= 1
            if success:
                chunk.ref_cnt = 0
                self.num_evictable += 1
                self.policy.mark_evictable(key)
                stored.append(key)
            else:
                self.policy.remove(key)
                self.free_slots.append(chunk.chunk_id)
                dropped.append(key)
        if self.events is None:
            return
        if dropped and self.announce_failed_stores:
            self.events.append(OffloadEvent(keys=dropped, removed=True, metadata_only=True))
        if stored:
            self.events.append(OffloadEvent(keys=stored, removed=False))

    def on_request_finished(self, req_context) -> None:
        record = req_context.get_state(RequestAccess)
        if record is None or not record.belongs_to(self, self.generation) or record.done:
            return
        record.done = True
        groups = []
        for group in sorted(record.by_group):
            keys = record.by_group[group]
            where = {}
            for key in keys:
                pos = req_context.get_offload_key_position(key)
                if pos is None:
                    break
                where[key] = pos
            else:
                keys = sorted(keys, key=where.__getitem__)
            groups.append(tuple(keys))
        self.policy.on_request_finished(tuple(groups), record.inserted - record.reused,
                                        record.reused, req_context)

    def on_schedule_end(self, context=None) -> None:
        return

    def take_events(self) -> Iterator[OffloadEvent]:
        if self.events is None:
            return
        if not self.announce_failed_stores:
            yield from self.events
            self.events.clear()
            return
        # Taken whole first: a drain stopped half way must not see, later, a
        # failed store's keys that a new store holds again by then.
        taken, self.events = self.events, []
        for event in taken:
            if event.metadata_only:
                keys = [k for k in event.keys if self.policy.get(k) is None]
                if not keys:
                    continue
                event = OffloadEvent(keys, event.removed, event.medium, True)
            yield event

    def reset_cache(self):
        self.policy.clear()
        self.generation += 1
        self.num_evictable = 0
        self.num_storing = 0
        self.free_slots.clear()
        self.handed_out = 0

    def get_stats(self) -> OffloadStats:
        in_use = self.handed_out - len(self.free_slots) - self.num_evictable
        usage = in_use / self.num_chunks if self.num_chunks > 0 else 0.0
        write = self.num_storing / self.num_chunks if self.num_chunks > 0 else 0.0
        stats = OffloadStats(usage=usage, write_usage=write, read_usage=max(usage - write, 0.0),
                             allocation_sizes=self.allocation_sizes)
        self.allocation_sizes = []
        if self.offers is not None:
            stats.stores_skipped = self.skipped_stores
            self.skipped_stores = 0
        return stats
