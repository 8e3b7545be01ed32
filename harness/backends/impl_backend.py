"""The backend over kvconform's own clean-room KV cache manager (impl/)."""

from __future__ import annotations

from harness.backends.base import Backend, BackendError, BlockIds, kv_event_json
from harness.core.cache_config import CacheConfig
from harness.core.events import AddRequest, Allocate
from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.hisparse.coordinator import get_hisparse_coordinator
from impl.invariants import InvariantChecker, InvariantViolation
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import KVCacheConfig, KVCacheGroupSpec
from impl.profiles import VersionProfile
from impl.request import Request, RequestStatus


def build_kv_cache_config(config: CacheConfig) -> KVCacheConfig:
    groups = tuple(
        # A HiSparse source group's blocks live in the host pool.
        KVCacheGroupSpec((f"layer.{i}",), config.kv_cache_spec(g), config.group_role(g),
                         g.role == "hisparse_source", is_eagle_group=g.is_eagle_group)
        for i, g in enumerate(config.groups)
    )
    return KVCacheConfig(config.num_blocks, groups,
                         prefix_cache_retention_interval=config.prefix_cache_retention_interval,
                         hisparse_host_num_blocks=config.hisparse_host_num_blocks)


class ImplBackend(Backend):
    name = "impl"
    status_waiting = RequestStatus.WAITING
    status_running = RequestStatus.RUNNING
    status_waiting_remote = RequestStatus.WAITING_FOR_REMOTE_KVS
    status_preempted = RequestStatus.PREEMPTED
    status_finished = RequestStatus.FINISHED_STOPPED

    def __init__(
        self, config: CacheConfig, profile: VersionProfile, check: bool = False
    ) -> None:
        super().__init__(config, profile)
        if config.hisparse and not profile.hisparse:
            raise BackendError(f"vLLM {profile.name} has no HiSparse groups", "cache.groups")
        scheduler_block_size, hash_block_size = config.block_sizes(profile)
        self.manager = KVCacheManager(
            build_kv_cache_config(config),
            max_model_len=config.max_model_len,
            hash_block_size=hash_block_size,
            profile=profile,
            enable_caching=config.enable_caching,
            log_stats=config.log_stats,
            enable_kv_cache_events=config.enable_kv_cache_events,
            events_use_int_hashes=config.events_use_int_hashes,
            watermark=config.watermark,
            dcp_world_size=config.dcp_world_size,
            pcp_world_size=config.pcp_world_size,
            scheduler_block_size=scheduler_block_size,
            max_in_flight_tokens=config.max_in_flight_tokens,
            num_hash_lookahead_tokens=config.num_hash_lookahead_tokens,
            enable_mamba_shared_prefix_checkpoint=config.enable_mamba_shared_prefix_checkpoint,
            use_eagle=config.use_eagle,
            num_prefill_lookahead=config.num_prefill_lookahead,
        )
        self.hasher = RequestBlockHasher.for_profile(
            hash_block_size,
            get_hash_fn(config.hash_algo),
            bytes.fromhex(config.none_hash) if config.none_hash is not None
            else none_hash(profile, config.hash_algo, config.hash_seed),
            profile,
            config.num_hash_lookahead_tokens,
        )
        if config.hisparse:
            self.hisparse = get_hisparse_coordinator(self.manager)
        self._no_blocks = self.manager.empty_kv_cache_blocks
        self._hash_block_size = hash_block_size
        self._lookahead = config.num_hash_lookahead_tokens
        self._one_group = len(self._no_blocks.blocks) == 1
        # Run the invariant checker after every event (slow; for the fuzzer).
        self.checker = InvariantChecker() if check else None
        # Its KV events reconciled with its pool too (specs/ORACLES.md §2).
        self.reconciler = self.event_reconciler(_violation) if check else None
        self._num_run = 0
        if check:
            self.run = self._run_checked

    def start(self) -> None:
        """The checker's one full check of the fresh pool belongs to start-up
        too; from then on it is incremental. A violation it finds is left for
        the first event to report, as a divergence."""
        super().start()
        if self.checker is not None:
            try:
                self.checker.check(self.manager)
            except InvariantViolation:
                pass

    def _run_checked(self, event):
        req = getattr(event, "req", None)
        answer = Backend.run(self, event)
        self.checker.check(self.manager)
        if self.reconciler is not None:
            self.reconciler.after(self._num_run, self.reannounces(req))
        self._num_run += 1
        return answer

    def _new_request(self, ev: AddRequest) -> Request:
        embeds = None
        if ev.prompt_embeds is not None:
            embeds = ev.prompt_embeds.to_bytes(len(ev.prompt))
        request = Request(
            request_id=ev.req,
            all_token_ids=[0] * len(ev.prompt) if embeds is not None else list(ev.prompt),
            num_prompt_tokens=len(ev.prompt),
            lora=ev.lora,
            cache_salt=ev.cache_salt,
            mm_features=tuple(ev.mm),
            prompt_embeds=embeds,
            embeds_row_bytes=4 * ev.prompt_embeds.dim if ev.prompt_embeds else 0,
            skip_reading_prefix_cache=ev.skip_reading_prefix_cache,
            session_id=ev.session_id,
            kv_cache_report_mode=ev.kv_cache_report_mode,
        )
        self.hasher.update(request)
        return request

    def _get_computed_blocks(self, request: Request, max_cache_hit_length=None):
        blocks, hit_tokens, boundary = self.manager.get_computed_blocks(request,
                                                                        max_cache_hit_length)
        return blocks, hit_tokens, [[b.block_id for b in g] for g in blocks.blocks], boundary

    def _get_computed_blocks_for_connector(self, request: Request):
        blocks, hit_tokens, boundary, diverged = self.manager.get_computed_blocks_for_connector(
            request)
        return (blocks, hit_tokens, [[b.block_id for b in g] for g in blocks.blocks], boundary,
                diverged)

    def _truncate_computed_blocks(self, blocks, num_computed_tokens: int):
        cut = self.manager.truncate_computed_blocks(blocks, num_computed_tokens)
        return cut, [[b.block_id for b in g] for g in cut.blocks]

    def _allocate_slots(self, request, ev: Allocate, blocks, hit_tokens) -> BlockIds | None:
        new = self.manager.allocate_slots(
            request,
            ev.num_new_tokens,
            hit_tokens,
            blocks,
            ev.num_lookahead_tokens,
            ev.num_external_computed_tokens,
            ev.delay_cache_blocks,
            ev.num_encoder_tokens,
            ev.full_sequence_must_fit,
            ev.reserved_blocks,
            ev.has_scheduled_reqs,
        )
        if new is None:
            return None
        if new is self._no_blocks:
            return [[]] if self._one_group else [[] for _ in new.blocks]
        return [[b.block_id for b in g] for g in new.blocks]

    def _free_request(self, request: Request) -> None:
        self.manager.free(request)

    def append_tokens(self, req: str, tokens: list[int]) -> list[bytes]:
        request = self._request(req)
        ids = request.all_token_ids
        ids.extend(tokens)
        if (len(request.block_hashes) + 1) * self._hash_block_size + self._lookahead > len(ids):
            return ()  # no block filled: the common case, answered without a call
        return self.hasher.update(request)

    def cache_blocks(self, req: str, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self._request(req), num_computed_tokens)

    def record_stats(self, req: str, num_hits: int) -> None:
        self.manager.record_prefix_cache_stats(self._request(req), num_hits)

    def estimate_cached_tokens(self, req: str) -> int:
        return self.manager.estimate_cached_tokens(self._request(req))

    def get_block_ids_for_computed_tokens(self, req: str,
                                          num_computed_tokens: int) -> list[list[int]]:
        self._request(req)  # a request it does not know is refused, not answered empty
        return self.manager.get_block_ids_for_computed_tokens(req, num_computed_tokens)

    def get_num_common_prefix_blocks(self, req: str) -> list[int]:
        self._request(req)
        return self.manager.get_num_common_prefix_blocks(req)

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def evict_blocks(self, block_ids: list[int]) -> None:
        self.manager.evict_blocks(block_ids)

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def take_block_copies(self) -> list[tuple[int, int]]:
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            self.manager.block_pool.free_blocks(retained)
        return copies

    def _offloads_supported(self) -> None:
        # (0.28's drain, take_partial_tail_offloads, is no trace op.)
        if not self.profile.boundary_state_offloads.offers_keyed_states:
            raise BackendError(f"vLLM {self.profile.name} hands no boundary states to "
                               "connectors", "op")

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        self._offloads_supported()
        return self.manager.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, req: str) -> list[tuple[int, int, int]]:
        self._offloads_supported()
        if not self.profile.boundary_state_offloads.finalizes:
            raise BackendError(f"vLLM {self.profile.name} has no finalize_partial_tail_offloads",
                               "op")
        return self.manager.finalize_partial_tail_offloads(self._request(req))

    def free_queue(self) -> list[int]:
        return self.manager.block_pool.free_block_queue.block_ids()

    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def usage(self) -> float:
        return self.manager.usage

    def take_stats(self) -> dict | None:
        stats = self.manager.make_prefix_cache_stats()
        return None if stats is None else stats.as_dict()

    def take_events(self) -> list[dict]:
        return [
            kv_event_json(type(e).__name__, {f: getattr(e, f) for f in e.__slots__})
            for e in self.manager.take_events()
        ]


def _violation(message: str, block: int | None) -> InvariantViolation:
    return InvariantViolation(f"KV events: {message}")
