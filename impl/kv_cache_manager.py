"""The KV cache manager the scheduler talks to (vLLM: KVCacheManager).

A facade over the coordinator: prefix lookup (`get_computed_blocks`), slot
allocation (`allocate_slots`), release, caching, reset, stats and events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from impl.block import KVCacheBlock
from impl.coordinator import get_kv_cache_coordinator
from impl.kv_cache_spec import KVCacheConfig
from impl.kv_events import BlockStored, KVCacheEvent
from impl.managers.full_attention import FullAttentionManager
from impl.prefix_cache_stats import PrefixCacheStats
from impl.profiles import StatsRecordedAt, VersionProfile
from impl.request import Request, RequestStatus


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks per KV cache group: what the scheduler receives."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)


class KVCacheManager:
    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        hash_block_size: int,
        profile: VersionProfile,
        enable_caching: bool = True,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        events_use_int_hashes: bool = True,
        watermark: float = 0.0,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        scheduler_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.profile = profile
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config,
            profile,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events=enable_kv_cache_events,
            events_use_int_hashes=events_use_int_hashes,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            scheduler_block_size=scheduler_block_size,
            max_model_len=max_model_len,
            max_in_flight_tokens=max_in_flight_tokens,
        )
        self.block_pool = self.coordinator.block_pool
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )
        # Group metadata BlockStored events carry (kind, sliding window).
        self._event_group_metadata = tuple(
            (g.kv_cache_spec.kind, g.kv_cache_spec.sliding_window_of_events)
            for g in kv_cache_config.kv_cache_groups
        )
        self._record_at_lookup = profile.stats_recorded_at is StatsRecordedAt.LOOKUP
        # The one manager of a single full-attention group: running requests
        # then take a short path in allocate_slots.
        managers = self.coordinator.single_type_managers
        self._single = (
            managers[0]
            if len(managers) == 1 and isinstance(managers[0], FullAttentionManager)
            and managers[0].block_size == hash_block_size
            else None
        )

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # -- stats ------------------------------------------------------------------

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Snapshot and reset the stats (None when stats are off)."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request's lookup (the scheduler calls this, 0.32+)."""
        if not self.log_stats or not self._lookup_enabled(request):
            return
        self.prefix_cache_stats.record(
            request.num_tokens, num_hits, request.num_preemptions > 0
        )

    def _lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    # -- lookup -------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of the request, in whole blocks.

        Never the whole prompt: the last token is always recomputed to get its
        logits, so at most num_tokens - 1 tokens can hit.
        """
        if not self._lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0
        blocks, num_hit_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        if self._record_at_lookup and self.log_stats:
            self.prefix_cache_stats.record(
                request.num_tokens, num_hit_tokens, request.num_preemptions > 0
            )
        return self._blocks(blocks), num_hit_tokens

    # -- allocation -------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give the request slots for its computed prefix plus `num_new_tokens`
        (+ lookahead); None, changing nothing, if the pool cannot hold them.

        Layout of the request's tokens:
          | computed | new hit | external | new | lookahead |
        The hit blocks are adopted (touched), blocks for external/new/lookahead
        tokens are allocated, and the blocks that the computed prefix plus the
        new tokens fill are cached (unless caching is delayed for a KV load).
        """
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and (
            num_new_computed_tokens == 0
            or not self.profile.allocate_adopts_hit_without_new_tokens
        ):
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no "
                "computed tokens to adopt"
            )
        request_id = request.request_id
        single = self._single
        if (
            single is not None
            and new_computed_blocks is None
            and not num_external_computed_tokens
            and not full_sequence_must_fit
            and request_id in single.num_cached_block
            and (not self.watermark_blocks or request.status is RequestStatus.RUNNING)
        ):
            return self._allocate_running(
                single, request, num_new_tokens, num_lookahead_tokens,
                delay_cache_blocks, reserved_blocks,
            )
        new_computed = (
            new_computed_blocks.blocks
            if new_computed_blocks is not None
            else self.empty_kv_cache_blocks.blocks
        )
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(
            num_local_computed + num_external_computed_tokens, self.max_model_len
        )
        watermark = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark = self.watermark_blocks
        coordinator = self.coordinator
        free = self.block_pool.free_block_queue
        # Where the request's prefill ends (a resumed request replays its
        # output tokens too): Mamba checkpoints key on it.
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)

        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = coordinator.get_num_blocks_to_allocate(
                request_id, full, new_computed, num_encoder_tokens, total_computed,
                num_local_computed, full, apply_admission_cap=True, prefill_end=prefill_end,
            )
            if need + watermark > free.num_free_blocks:
                return None

        num_tokens_main_model = total_computed + num_new_tokens
        num_tokens_need_slot = min(
            num_tokens_main_model + num_lookahead_tokens, self.max_model_len
        )
        # Free what the window no longer reads before counting, so those blocks
        # can serve this allocation (done even if the allocation is refused).
        coordinator.remove_skipped_blocks(
            request_id, max(0, total_computed - request.num_in_flight_tokens),
            request.num_prompt_tokens,
        )
        need = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_computed, num_encoder_tokens,
            num_local_computed + num_external_computed_tokens, num_local_computed,
            num_tokens_main_model, prefill_end=prefill_end,
        )
        if need + watermark > free.num_free_blocks - reserved_blocks:
            return None

        if new_computed is not self.empty_kv_cache_blocks.blocks or (
            num_external_computed_tokens > 0
        ):
            coordinator.allocate_new_computed_blocks(
                request_id,
                new_computed,
                num_local_computed,
                num_external_computed_tokens,
            )
        new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, num_encoder_tokens
        )
        if delay_cache_blocks or not self.enable_caching:
            return self._blocks(new_blocks)
        # Cache only finalized tokens: lookahead/draft tokens may be rejected.
        coordinator.cache_blocks(
            request, min(total_computed + num_new_tokens, request.num_tokens)
        )
        return self._blocks(new_blocks)

    def _allocate_running(
        self,
        manager,
        request: Request,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool,
        reserved_blocks: int,
    ) -> KVCacheBlocks | None:
        """allocate_slots for a running request of one full-attention group: no
        hit to adopt, nothing skipped, no watermark; the same outcome as the
        general path with its fan-out and bookkeeping left out (hot: every decode
        step of every request comes here)."""
        total_computed = min(request.num_computed_tokens, self.max_model_len)
        num_tokens = min(
            total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )
        blocks = manager.req_to_blocks[request.request_id]
        num_new = -(-num_tokens // manager.block_size) - len(blocks)
        new: list[KVCacheBlock] = []
        if num_new > 0:
            pool = self.block_pool
            if num_new > pool.free_block_queue.num_free_blocks - reserved_blocks:
                return None
            new = pool.get_new_blocks(num_new)
            blocks.extend(new)
        elif reserved_blocks and self.block_pool.free_block_queue.num_free_blocks < reserved_blocks:
            return None
        if not delay_cache_blocks and self.enable_caching:
            manager.cache_blocks(
                request, min(total_computed + num_new_tokens, len(request.all_token_ids))
            )
        return KVCacheBlocks((new,)) if new else self.empty_kv_cache_blocks

    def _blocks(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # -- release and cache control ---------------------------------------------------

    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        if not self.coordinator.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def new_step_starts(self) -> None:
        self.coordinator.new_step_starts()

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[KVCacheBlock]]:
        """Drain the pending copy-on-write copies: (source id, copy id) pairs
        and the blocks they keep referenced, source and copy of each pair in
        turn. The scheduler frees those once the copies have run."""
        pending = self.coordinator.take_pending_cow_copies()
        copies = [(src.block_id, dst.block_id) for src, dst in pending]
        return copies, [block for pair in pending for block in pair]

    # -- views ---------------------------------------------------------------------

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def take_events(self) -> list[KVCacheEvent]:
        events = self.block_pool.take_events()
        if self.profile.kv_events_carry_group:
            meta = self._event_group_metadata
            for event in events:
                if isinstance(event, BlockStored) and event.group_idx is not None:
                    event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[
                        event.group_idx
                    ]
        return events
