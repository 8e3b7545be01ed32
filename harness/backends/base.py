"""The driver protocol every backend speaks (specs/ARCHITECTURE.md).

A backend is built from a CacheConfig and a version profile, then executes events
one at a time; `run(event)` returns the event's answer as a JSON-able dict. The
answer shapes are defined here, once, so impl and vLLM answers compare with ==.
Subclasses provide the primitive operations on their own KV cache manager.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from harness.backends.free_queue_digest import free_queue_digest
from harness.backends.kv_event_reconcile import EventReconciler
from harness.core.cache_config import CacheConfig
from harness.core.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    CacheBlocks,
    Checkpoint,
    EstimateCachedTokens,
    Event,
    EvictBlocks,
    FinalizePartialTailOffloads,
    Free,
    GetBlockIdsForComputedTokens,
    GetNumCommonPrefixBlocks,
    HiSparseAck,
    HiSparseStep,
    Lookup,
    Preempt,
    RecordStats,
    ResetPrefixCache,
    Step,
    TakeBlockCopies,
    TakeBoundaryStateOffloads,
    TruncateComputedBlocks,
)
from harness.core.exit_codes import ExitCode
from harness.core.kinds import kind_row
from impl.profiles import VersionProfile

BlockIds = list[list[int]]
_NO_HIT = (None, 0)
POOL_FREE, POOL_FREE_CACHED, POOL_NULL, POOL_SHARED = -1, -2, -3, -4



class BackendError(Exception):
    """An event the driver protocol cannot execute (e.g. an unknown request
    id); `field` is the event's field at fault."""

    def __init__(self, message: str, field: str = "req") -> None:
        super().__init__(message)
        self.field = field


# Values answers keep as they are; a list of only these is copied in one step
# (KV events carry lists of token ids and int hashes at every step).
_AS_IS = frozenset({int, str, float, bool, type(None)})


def jsonable(value: Any) -> Any:
    """bytes -> hex, tuples -> lists, recursively: the form answers are kept in."""
    cls = value.__class__
    if cls in _AS_IS:
        return value
    if cls is bytes:
        return value.hex()
    if cls is list or cls is tuple or isinstance(value, (list, tuple)):
        if _AS_IS.issuperset(map(type, value)):
            return list(value)
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def kv_event_json(type_name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A KV cache event as a dict; fields that are None are left out, so that a
    field one version lacks and another leaves unset compare equal."""
    out: dict[str, Any] = {"type": type_name}
    for key, value in fields.items():
        if value is not None:
            out[key] = jsonable(value)
    return out


def block_state_dict(block_id: int, ref_cnt: int, block_hash: bytes | None, is_null: bool) -> dict:
    """A block as divergence reports show it; the hash (without its group id
    suffix) abbreviated to 12 hex digits."""
    return {
        "block_id": block_id,
        "ref_cnt": ref_cnt,
        "hash": block_hash[:-4].hex()[:12] if block_hash else None,
        "free": ref_cnt == 0 and not is_null,
    }


class BackendStopped(Exception):
    """The backend cannot go on (a foreign process that died, hung or broke
    its protocol; a trace outside its capabilities): the run ends with this
    one line, never a divergence. run_event lets it through."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Backend(ABC):
    name: str = ""
    # The backend's RequestStatus values the scheduler sets.
    status_waiting: Any = None
    status_running: Any = None
    status_waiting_remote: Any = None
    status_preempted: Any = None
    status_finished: Any = None
    # The manager's HiSparse coordinator (vLLM's or impl's: the same calls),
    # None for a model without HiSparse groups.
    hisparse: Any = None

    def __init__(self, config: CacheConfig, profile: VersionProfile) -> None:
        self.config = config
        self.profile = profile
        self.requests: dict[str, Any] = {}
        # A lookup's hit, adopted by the request's next allocate.
        self._pending_hit: dict[str, tuple[Any, int]] = {}
        self._handlers = {
            AddRequest: self._on_add_request,
            Lookup: self._on_lookup,
            TruncateComputedBlocks: self._on_truncate_computed_blocks,
            Allocate: self._on_allocate,
            AppendTokens: self._on_append_tokens,
            CacheBlocks: self._on_cache_blocks,
            RecordStats: self._on_record_stats,
            EstimateCachedTokens: self._on_estimate_cached_tokens,
            GetBlockIdsForComputedTokens: self._on_get_block_ids_for_computed_tokens,
            GetNumCommonPrefixBlocks: self._on_get_num_common_prefix_blocks,
            Free: self._on_free,
            Preempt: self._on_preempt,
            ResetPrefixCache: self._on_reset,
            EvictBlocks: self._on_evict,
            Step: self._on_step,
            TakeBlockCopies: self._on_take_block_copies,
            Checkpoint: self._on_checkpoint,
            TakeBoundaryStateOffloads: self._on_take_boundary_state_offloads,
            FinalizePartialTailOffloads: self._on_finalize_partial_tail_offloads,
            HiSparseStep: self._on_hisparse_step,
            HiSparseAck: self._on_hisparse_ack,
        }
        self._report_boundary = config.reports_shared_prefix_boundary

    def run(self, event: Event) -> dict[str, Any]:
        """Execute one event and return its answer."""
        return self._handlers[type(event)](event)

    # -- answers ------------------------------------------------------------------

    def _on_add_request(self, ev: AddRequest) -> dict:
        return {"block_hashes": [h.hex() for h in self.add_request(ev)]}

    def _on_lookup(self, ev: Lookup) -> dict:
        block_ids, hit_tokens, diverged = self._look_up(ev.req, ev.max_cache_hit_length,
                                                        ev.for_connector)
        answer = {"hit_tokens": hit_tokens, "block_ids": block_ids}
        if self._report_boundary:
            boundary = self.requests[ev.req].shared_prefix_boundary
            if boundary:
                answer["shared_prefix_boundary"] = boundary
        if ev.for_connector:
            answer["hit_diverged"] = diverged
        return answer

    def _on_truncate_computed_blocks(self, ev: TruncateComputedBlocks) -> dict:
        if ev.req not in self._pending_hit:
            self._request(ev.req)  # an unknown request says so first
            raise BackendError(f"request '{ev.req}' has no pending lookup hit to truncate",
                               "req")
        blocks, _ = self._pending_hit[ev.req]
        cut, block_ids = self._truncate_computed_blocks(blocks, ev.num_computed_tokens)
        self._pending_hit[ev.req] = (cut, ev.num_computed_tokens)
        return {"block_ids": block_ids}

    def _on_allocate(self, ev: Allocate) -> dict:
        block_ids = self.allocate(ev)
        return {"refused": True} if block_ids is None else {"block_ids": block_ids}

    def _on_append_tokens(self, ev: AppendTokens) -> dict:
        return {"block_hashes": [h.hex() for h in self.append_tokens(ev.req, ev.tokens)]}

    def _on_cache_blocks(self, ev: CacheBlocks) -> dict:
        request = self._request(ev.req)
        self._check_cacheable(ev)
        self.cache_blocks(ev.req, ev.num_computed_tokens)
        if request.status == self.status_waiting_remote:
            # The scheduler caches a request's blocks when its KV load finishes,
            # and puts it back to waiting.
            request.status = self.status_waiting
        return {}

    def _check_cacheable(self, ev: CacheBlocks) -> None:
        """vLLM's cache_blocks hashes the request's first full blocks: it
        fails (IndexError) on tokens beyond the blocks the request holds."""
        if not self.config.enable_caching:
            return
        groups = self.config.groups
        for g, manager in enumerate(self.manager.coordinator.single_type_managers):
            # Kinds whose cache_blocks keys nothing (a ring buffer, HiSparse's
            # device-only groups) hold any number of blocks.
            if kind_row(groups[g].kind).never_keyed:
                continue
            held = len(manager.req_to_blocks.get(ev.req, ()))
            full = ev.num_computed_tokens // manager.block_size
            if full > held:
                raise BackendError(
                    f"vLLM rejects this: {ev.num_computed_tokens} tokens fill {full} blocks "
                    f"of group {g}, but request '{ev.req}' holds {held}", "num_computed_tokens")

    def _on_record_stats(self, ev: RecordStats) -> dict:
        self.record_stats(ev.req, ev.num_hits)
        return {}

    def _on_free(self, ev: Free) -> dict:
        self.free(ev.req)
        return {}

    def _on_preempt(self, ev: Preempt) -> dict:
        self.preempt(ev.req)
        return {}

    def _on_reset(self, ev: ResetPrefixCache) -> dict:
        return {"ok": self.reset_prefix_cache()}

    def _on_evict(self, ev: EvictBlocks) -> dict:
        self.evict_blocks(ev.block_ids)
        return {}

    def _on_step(self, ev: Step) -> dict:
        self.new_step_starts()
        return {}

    # The scheduler's read-only queries of the manager: the same call on every
    # backend's manager, refused (on every side alike) where the release has
    # no such method.
    def _on_estimate_cached_tokens(self, ev: EstimateCachedTokens) -> dict:
        if self.profile.estimate_cached_tokens is None:
            raise BackendError(f"vLLM {self.profile.name} has no estimate_cached_tokens "
                               "(0.26+)", "op")
        return {"num_tokens": self.estimate_cached_tokens(ev.req)}

    def _on_get_block_ids_for_computed_tokens(self, ev: GetBlockIdsForComputedTokens) -> dict:
        if not self.profile.block_ids_for_computed_tokens:
            raise BackendError(f"vLLM {self.profile.name} has no "
                               "get_block_ids_for_computed_tokens (0.25+)", "op")
        ids = self.get_block_ids_for_computed_tokens(ev.req, ev.num_computed_tokens)
        return {"block_ids": [list(g) for g in ids]}

    def _on_get_num_common_prefix_blocks(self, ev: GetNumCommonPrefixBlocks) -> dict:
        return {"blocks": list(self.get_num_common_prefix_blocks(ev.req))}

    def _on_take_block_copies(self, ev: TakeBlockCopies) -> dict:
        return {"copies": [list(pair) for pair in self.take_block_copies()]}

    def _on_take_boundary_state_offloads(self, ev: TakeBoundaryStateOffloads) -> dict:
        offers = self.take_boundary_state_offloads()
        return {"offloads": {req: [list(offer) for offer in offers[req]] for req in offers}}

    def _on_finalize_partial_tail_offloads(self, ev: FinalizePartialTailOffloads) -> dict:
        return {"offloads": [list(o) for o in self.finalize_partial_tail_offloads(ev.req)]}

    def _on_checkpoint(self, ev: Checkpoint) -> dict:
        out: dict[str, Any] = {}
        for f in ev.fields:
            if f == "free_queue":
                out[f] = self.free_queue()
            elif f == "free_queue_digest":
                out[f] = self.free_queue_digest()
            elif f == "num_free":
                out[f] = self.num_free_blocks()
            elif f == "usage":
                out[f] = self.usage()
            elif f == "stats":
                out[f] = self.take_stats()
            elif f == "events":
                out[f] = self.take_events()
            elif f == "hisparse":
                coordinator = self._hisparse_coordinator("fields")
                out[f] = {"host_free_queue": self.host_free_queue(),
                          "pending_work": coordinator.has_pending_work(),
                          "pending_reclamation": coordinator.has_pending_reclamation()}
        return out

    # -- HiSparse: what its connector asks and hears (specs/KV_CACHE_MANAGER.md §14) --

    def _hisparse_coordinator(self, field: str = "op"):
        if self.hisparse is None:
            raise BackendError("the model has no HiSparse groups", field)
        return self.hisparse

    def _on_hisparse_step(self, ev: HiSparseStep) -> dict:
        coordinator = self._hisparse_coordinator()
        scheduled = [(req, start, count) for req, start, count in ev.scheduled]
        requests = [self._request(req) for req, _, _ in scheduled]
        coordinator.advance_scheduled([
            (req, min(start + count, request.num_tokens))
            for (req, start, count), request in zip(scheduled, requests)])
        command = coordinator.build_offload_command()
        copies = coordinator.take_host_block_copies()
        mirrors = {req: coordinator.build_row_mirrors([(req, start, count)])
                   for req, start, count in scheduled}
        return {
            "transfers": None if command is None else [
                {"transfer_id": t.transfer_id, "host_block_id": t.host_block_id,
                 "resident_block_ids": list(t.resident_block_ids),
                 "after_forward": t.after_forward, "restore": t.restore}
                for t in command.page_transfers],
            "host_copies": [[c.src_block_id, c.dst_block_id] for c in copies],
            "mirrors": {req: [[list(m.source_starts), m.destination_start, m.num_rows]
                              for m in found] for req, found in mirrors.items()},
            "all_resident": coordinator.all_context_pages_resident(scheduled),
            "residency": {req: {"pages": list(u.pages), "block_ids": [list(g) for g in u.block_ids]}
                          for req, u in coordinator.take_residency_updates(
                              [req for req, _, _ in scheduled]).items()},
        }

    def _on_hisparse_ack(self, ev: HiSparseAck) -> dict:
        coordinator = self._hisparse_coordinator()
        failed = set(ev.failed_imports)
        for req in ev.finished_imports:
            coordinator.finish_host_import(req, failed=req in failed)
        coordinator.release_completed_host_copies(list(ev.copies_done))
        coordinator.update_spills({t: n for t, n in ev.enqueued},
                                  {t: n for t, n in ev.completed})
        return {}

    # -- scheduler-owned request state, the same for every backend ---------------

    def _request(self, req: str):
        try:
            return self.requests[req]
        except KeyError:
            raise BackendError(f"no request '{req}'") from None

    def add_request(self, ev: AddRequest) -> list[bytes]:
        if ev.req in self.requests:
            raise BackendError(f"request '{ev.req}' already exists")
        request = self._new_request(ev)
        self.requests[ev.req] = request
        return list(request.block_hashes)

    def lookup(self, req: str, max_cache_hit_length: int | None = None
               ) -> tuple[BlockIds, int]:
        return self._look_up(req, max_cache_hit_length)[:2]

    def _look_up(self, req: str, max_cache_hit_length: int | None,
                 for_connector: bool = False) -> tuple[BlockIds, int, bool]:
        request = self._request(req)
        if request.num_computed_tokens:
            # vLLM's scheduler looks up only requests with nothing computed
            # (new or preempted ones); a lookup now would hand allocate blocks
            # the request already holds.
            raise BackendError(f"vLLM rejects this: request '{req}' is running "
                               f"({request.num_computed_tokens} computed tokens); only waiting "
                               "requests are looked up")
        diverged = False
        if for_connector:
            if max_cache_hit_length is not None:
                raise BackendError("a connector's lookup takes no max_cache_hit_length",
                                   "max_cache_hit_length")
            blocks, hit_tokens, block_ids, boundary, diverged = (
                self._get_computed_blocks_for_connector(request))
        else:
            blocks, hit_tokens, block_ids, boundary = self._get_computed_blocks(
                request, max_cache_hit_length)
        self._pending_hit[req] = (blocks, hit_tokens)
        # The scheduler keeps the lookup's shared-prefix boundary on the
        # request (sparse retention keeps a checkpoint there).
        request.shared_prefix_boundary = boundary
        return block_ids, hit_tokens, diverged

    def allocate(self, ev: Allocate) -> BlockIds | None:
        request = self._request(ev.req)
        blocks, hit_tokens = self._pending_hit.pop(ev.req, _NO_HIT)
        block_ids = self._allocate_slots(request, ev, blocks, hit_tokens)
        if block_ids is None:
            return None
        # What the scheduler does once a request is scheduled.
        request.num_computed_tokens += (
            hit_tokens + ev.num_external_computed_tokens + ev.num_new_tokens
        )
        request.status = self.status_waiting_remote if ev.delay_cache_blocks else (
            self.status_running
        )
        return block_ids

    def free(self, req: str) -> None:
        request = self._request(req)
        # Finished, as the scheduler marks a request before freeing it
        # (HiSparse publishes what a finished request leaves behind).
        request.status = self.status_finished
        self._free_request(request)
        del self.requests[req]
        self._pending_hit.pop(req, None)

    def preempt(self, req: str) -> None:
        request = self._request(req)
        self._free_request(request)
        self._pending_hit.pop(req, None)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = self.status_preempted

    # -- primitives on the backend's own manager and requests -----------------------

    @abstractmethod
    def _new_request(self, ev: AddRequest):
        """A request object whose block hashes are computed."""

    @abstractmethod
    def _get_computed_blocks(self, request, max_cache_hit_length: int | None = None
                             ) -> tuple[Any, int, BlockIds, int]:
        """(blocks to pass to allocate, hit tokens, hit block ids per group,
        shared-prefix boundary (0 where the release has none)); the hit at
        most `max_cache_hit_length` tokens when given."""

    def _get_computed_blocks_for_connector(self, request
                                           ) -> tuple[Any, int, BlockIds, int, bool]:
        """_get_computed_blocks' four values as a KV connector's lookup gives
        them, and whether full attention's hit ran deeper than another group's."""
        raise BackendError(f"{self.name} has no KV connector lookup", "for_connector")

    def _truncate_computed_blocks(self, blocks, num_computed_tokens: int
                                  ) -> tuple[Any, BlockIds]:
        """A lookup's blocks cut at `num_computed_tokens`, and their ids."""
        raise BackendError(f"{self.name} cannot truncate a lookup's hit", "op")

    @abstractmethod
    def _allocate_slots(self, request, ev: Allocate, blocks, hit_tokens: int) -> BlockIds | None:
        ...

    @abstractmethod
    def _free_request(self, request) -> None: ...

    @abstractmethod
    def append_tokens(self, req: str, tokens: list[int]) -> list[bytes]: ...

    @abstractmethod
    def cache_blocks(self, req: str, num_computed_tokens: int) -> None: ...

    @abstractmethod
    def record_stats(self, req: str, num_hits: int) -> None: ...

    @abstractmethod
    def reset_prefix_cache(self) -> bool: ...

    @abstractmethod
    def evict_blocks(self, block_ids: list[int]) -> None: ...

    @abstractmethod
    def new_step_starts(self) -> None: ...

    @abstractmethod
    def estimate_cached_tokens(self, req: str) -> int: ...

    @abstractmethod
    def get_block_ids_for_computed_tokens(self, req: str,
                                          num_computed_tokens: int) -> list[list[int]]: ...

    @abstractmethod
    def get_num_common_prefix_blocks(self, req: str) -> list[int]: ...

    @abstractmethod
    def take_block_copies(self) -> list[tuple[int, int]]:
        """Drain pending copy-on-write copies and release the blocks they kept
        referenced, as the scheduler does after each schedule pass."""

    @abstractmethod
    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Drain the boundary states offered since the last call."""

    @abstractmethod
    def finalize_partial_tail_offloads(self, req: str) -> list[tuple[int, int, int]]:
        """A finishing request's prompt-tail states still in its blocks."""

    @abstractmethod
    def free_queue(self) -> list[int]: ...

    def free_queue_digest(self) -> str:
        """The free queue's order in 16 hex digits, O(1) once tracked."""
        return free_queue_digest(self.manager.block_pool.free_block_queue)

    def start(self) -> None:
        """What the backend does once before a run's first event, so that no
        event pays for it: the free-queue digest walks the queue once (from
        then on a checkpoint of it is O(1))."""
        self.free_queue_digest()

    def host_free_queue(self) -> list[int]:
        """HiSparse's host pool free queue, head first."""
        pool = self._hisparse_coordinator("fields").get_host_block_pool()
        return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]

    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def usage(self) -> float: ...

    @abstractmethod
    def take_stats(self) -> dict | None: ...

    @abstractmethod
    def take_events(self) -> list[dict]: ...

    # -- inspection, for divergence reports ------------------------------------------
    # Both managers keep vLLM's shape (`manager.get_block_ids`,
    # `manager.block_pool.blocks[i]` with ref_cnt / block_hash / is_null).

    def block_table(self, req: str) -> BlockIds:
        """The block ids a live request holds, per group ([] per group if none)."""
        return [list(g) for g in self.manager.get_block_ids(req)]

    def block_state(self, block_id: int) -> dict:
        """{"block_id", "ref_cnt", "hash" (abbreviated hex or None), "free"}."""
        b = self.manager.block_pool.blocks[block_id]
        return block_state_dict(block_id, b.ref_cnt, b.block_hash, b.is_null)

    def pool_codes(self, request_index: dict[str, int]) -> list[int]:
        """The pool at a glance, one code per block: POOL_NULL, POOL_FREE,
        POOL_FREE_CACHED, POOL_SHARED (held by several requests), or the index
        of the one request holding it (indices assigned in `request_index`)."""
        blocks = self.manager.block_pool.blocks
        codes = [POOL_FREE_CACHED if b.block_hash is not None else POOL_FREE for b in blocks]
        for group in self.manager.coordinator.single_type_managers:
            if group.block_pool is not self.manager.block_pool:
                continue  # HiSparse's source group: host blocks, another pool
            for req, held in group.req_to_blocks.items():
                k = request_index.setdefault(req, len(request_index))
                for b in held:
                    if b.is_null:
                        continue
                    codes[b.block_id] = k if codes[b.block_id] < 0 else POOL_SHARED
        codes[self.manager.block_pool.null_block.block_id] = POOL_NULL
        return codes

    def event_reconciler(self, violation, entries_attr: str = "_cache",
                         strict: bool = False) -> EventReconciler | None:
        """The KV events reconciled with this backend's pool after every
        event (specs/ORACLES.md §2), where the config publishes events and
        caches; None elsewhere, and for HiSparse's two pools. `strict`: the
        known upstream bugs the profile records fail too (their reproducers)."""
        config = self.config
        if not (config.enable_kv_cache_events and config.enable_caching) or config.hisparse:
            return None
        profile = self.profile
        return EventReconciler(
            self.manager.block_pool, self.manager.coordinator.single_type_managers,
            [kind_row(g.kind).prefix_scan for g in config.groups],
            config.events_use_int_hashes,
            profile is None or profile.kv_event_fields.carries_group, violation,
            removed_per_copy=not strict and (profile is None
                                             or profile.kv_events_removed_per_copy),
            announces_skipped=not strict and (
                profile is None or profile.full_report_announces_skipped_blocks),
            entries_attr=entries_attr)

    def reannounces(self, req: str | None) -> bool:
        """Whether a call on `req` may announce its hits again as KV events
        (kv_cache_report_mode full)."""
        request = self.requests.get(req) if req is not None else None
        return getattr(request, "kv_cache_report_mode", "incremental") == "full"

    def pending_kv_events(self) -> list | None:
        """The KV events the manager has queued and not handed out yet (its
        pool's queue; vLLM's shape), read without draining them: reports count
        evictions with it. None when the config publishes no KV events."""
        if not self.config.enable_kv_cache_events:
            return None
        return self.manager.block_pool.kv_event_queue

    def close(self) -> None:
        """Release what the backend holds (nothing by default)."""
