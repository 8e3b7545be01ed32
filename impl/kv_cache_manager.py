"""What the scheduler talks to (vLLM's name: KVCacheManager); specs/KV_CACHE_MANAGER.md §11.

A facade over the coordinator: the prefix lookup, slot allocation, release,
keying, reset, hit statistics, KV events and pending block copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from impl.block import BlockList, KVCacheBlock
from impl.coordinator import HybridKVCacheCoordinator, PerGroup, get_kv_cache_coordinator
from impl.kv_cache_metrics import KVCacheMetricsCollector
from impl.kv_cache_spec import KVCacheConfig, MambaSpec
from impl.kv_events import BlockStored, KVCacheEvent
from impl.managers.base import SingleTypeKVCacheManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.mamba import MambaManager
from impl.math_utils import cdiv
from impl.prefix_cache_stats import PrefixCacheStats
from impl.profiles import CachedTokensEstimate, StatsRecordedAt, VersionProfile
from impl.request import Request, RequestStatus

_NEEDS_WATERMARK = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
Ids = list[int]
# Block ids per group: what the scheduler writes into its block tables.
GroupIds = tuple[Ids, ...]


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks per KV cache group, as the scheduler gets them."""

    blocks: PerGroup

    def get_block_ids(self, allow_none: bool = False, *,
                      group_ids: Sequence[int] | None = None) -> GroupIds | None:
        """Ids per group (only `group_ids`, in that order, when given); None
        instead of all-empty groups when `allow_none`."""
        groups = self.blocks if group_ids is None else [self.blocks[g] for g in group_ids]
        if allow_none and not any(groups):
            return None
        return tuple([block.block_id for block in group] for group in groups)

    def get_unhashed_block_ids(self) -> Ids:
        """Ids of the blocks without a key, of a model with one group."""
        if len(self.blocks) != 1:
            raise AssertionError(f"unhashed ids of one group asked of {len(self.blocks)}")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[Ids]:
        """Per group, ids of the blocks without a key (null padding left out)."""
        return [[b.block_id for b in group if b.block_hash is None and not b.is_null]
                for group in self.blocks]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self.blocks))

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([*mine, *theirs]
                                   for mine, theirs in zip(self.blocks, other.blocks)))


# A connector's lookup: blocks, hit tokens, shared-prefix boundary, whether
# some group hit less.
ConnectorHit = tuple[KVCacheBlocks, int, int, bool]


# get_computed_blocks: hit blocks, hit tokens, shared-prefix boundary.
LookupAnswer = tuple[KVCacheBlocks, int, int]


@dataclass(eq=False)
class KVCacheManager:
    kv_cache_config: KVCacheConfig
    max_model_len: int
    hash_block_size: int
    profile: VersionProfile
    enable_caching: bool = True
    log_stats: bool = False
    enable_kv_cache_events: bool = False
    # KV events carry 64-bit int hashes (vLLM's default) or the raw bytes.
    events_use_int_hashes: bool = True
    # Blocks kept free when admitting a waiting request, as a pool fraction.
    watermark: float = 0.0
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    scheduler_block_size: int | None = None
    # Tokens that may be scheduled but not settled (caps windowed admission);
    # None: max_model_len.
    max_in_flight_tokens: int | None = None
    # Tokens after a block its hash covers (profile.hash_lookahead_tokens).
    num_hash_lookahead_tokens: int = 0
    # Mamba "align" states also at shared-prefix junctions (takes effect
    # with EAGLE groups and hits inside blocks only, §11).
    enable_mamba_shared_prefix_checkpoint: bool = False
    # A speculative-decoding drafter reads the tail of each hit (specs §15);
    # the flag as given (the coordinator decides which groups drop).
    use_eagle: bool = False
    # Tokens after a chunk's end that multi-module MTP writes again (§16.1):
    # the last lookahead - 1 computed tokens are not final.
    num_prefill_lookahead: int = 0
    # Block residency sampling (spec §16.8), handed to the pool; the
    # scheduler builds one only with KV cache metrics on.
    metrics_collector: KVCacheMetricsCollector | None = None

    def __post_init__(self) -> None:
        config, profile = self.kv_cache_config, self.profile
        if self.num_hash_lookahead_tokens and not profile.hash_lookahead_tokens:
            raise TypeError("this release hashes no lookahead tokens")
        self.prefix_cache_stats = PrefixCacheStats() if self.log_stats else None
        coordinator = self.coordinator = get_kv_cache_coordinator(
            config, profile, self.enable_caching, self.hash_block_size,
            enable_kv_cache_events=self.enable_kv_cache_events,
            events_use_int_hashes=self.events_use_int_hashes,
            dcp_world_size=self.dcp_world_size, pcp_world_size=self.pcp_world_size,
            scheduler_block_size=self.scheduler_block_size, max_model_len=self.max_model_len,
            max_in_flight_tokens=self.max_in_flight_tokens, use_eagle=self.use_eagle,
            num_prefill_lookahead=self.num_prefill_lookahead,
            num_hash_lookahead_tokens=self.num_hash_lookahead_tokens,
            metrics_collector=self.metrics_collector)
        self.block_pool = coordinator.block_pool
        # Junction checkpoints need EAGLE's replay points and hits inside
        # blocks; the scheduler stops chunks at junctions by this same flag.
        # Not with multi-module MTP: what gets keyed then lags the chunk end
        # by the re-prefilled tokens, so a junction stop would key nothing.
        junctions = self.mamba_shared_prefix_checkpoint = (
            self.enable_mamba_shared_prefix_checkpoint and bool(coordinator.eagle_group_ids)
            and coordinator.enable_partial_hash_hits
            and coordinator.num_reprefillable_tokens == 0)
        for mamba in (m for m in coordinator.single_type_managers if junctions):
            if isinstance(mamba, MambaManager):
                mamba.shared_prefix_checkpoint = True
        groups = config.kv_cache_groups
        self.num_kv_cache_groups = len(groups)
        # Prompt-tail copies handed to a connector and pinned until their
        # request is freed (0.28's take_partial_tail_offloads), per request.
        self._partial_tail_pins: dict[str, list[KVCacheBlock]] = {}
        self.watermark_blocks = int(self.watermark * config.num_blocks)
        # One shared "nothing" answer, so no-block answers allocate nothing.
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))
        # What BlockStored events say about their group (0.22+).
        self._group_labels = tuple((g.kv_cache_spec.kind, g.kv_cache_spec.sliding_window_of_events)
                                   for g in groups)
        self._count_at_lookup = profile.stats_recorded_at is StatsRecordedAt.LOOKUP
        # An allocation's cache step runs when some group takes it: with
        # prefix caching off, only a group that works there regardless (0.31's
        # HiSparse resident groups, §14.6).
        self._cache_step = self.enable_caching or any(
            m.enable_caching for m in coordinator.single_type_managers)
        self._adopt_without_new = profile.allocate_adopts_hit_without_new_tokens
        # A single full-attention group hashed at its block size: running
        # requests then take the short path of allocate_slots.
        managers = coordinator.single_type_managers
        only = managers[0] if len(managers) == 1 else None
        self._plain = (only if isinstance(only, FullAttentionManager) and not only.skips_tokens
                       and only.block_size == self.hash_block_size
                       and not coordinator.num_reprefillable_tokens
                       and not config.needs_kv_cache_zeroing else None)
        # Its running requests (num_cached_block), looked up on every call.
        self._plain_running = None if self._plain is None else self._plain.num_cached_block
        # Only some kinds act when a step starts (Mamba).
        self._step_hooks = tuple(
            m.new_step_starts for m in managers
            if type(m).new_step_starts is not SingleTypeKVCacheManager.new_step_starts)
        # Groups whose hit may run past the agreed one (HiSparse's host group):
        # allocate_slots keeps only what the hit and a load cover.
        self._longer_hit_groups = tuple(i for i, m in enumerate(managers)
                                        if m.retains_longer_hit)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # -- hit statistics ---------------------------------------------------------

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The counters since the last call, and fresh ones (None: stats off)."""
        if not self.log_stats:
            return None
        taken, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return taken

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request's lookup (the scheduler's call, 0.32)."""
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(request.num_tokens, num_hits,
                                           request.num_preemptions > 0)

    # -- lookup -------------------------------------------------------------------

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> LookupAnswer:
        """The request's longest cached prefix, at most `max_cache_hit_length`
        tokens (profile.max_cache_hit_length; by default never all of it: the
        last token is computed again for its logits), and the shared-prefix
        boundary: where the prefix some group has not cached yet ends (0:
        none), for the scheduler to keep a checkpoint at."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return (self.empty_kv_cache_blocks, 0, 0)
        num_tokens = len(request.all_token_ids)
        if max_cache_hit_length is None:
            max_cache_hit_length = num_tokens - 1
        elif not self.profile.max_cache_hit_length:
            raise TypeError("this release's lookup takes no max_cache_hit_length")
        blocks, hit, uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length)
        if self._count_at_lookup and self.log_stats:
            self.prefix_cache_stats.record(num_tokens, hit, request.num_preemptions > 0)
        if hit and request.kv_cache_report_mode == "full" and self.enable_kv_cache_events:
            # Consumers that asked for full reports learn of reused blocks too.
            self.coordinator.emit_cached_block_events(request, blocks)
        answer = KVCacheBlocks(blocks) if hit else self._answer(blocks)
        return answer, hit, (hit + uncached if uncached else 0)

    def get_computed_blocks_for_connector(self, request: Request,
                                          max_cache_hit_length: int | None = None
                                          ) -> ConnectorHit:
        """The lookup a KV connector schedules with (specs §16.5): for a
        hybrid of Mamba and full attention, full attention's own hit (the
        connector brings the Mamba state; no shared-prefix boundary) and
        whether some group hit less; otherwise the plain lookup."""
        coord = self.coordinator
        hybrid = (isinstance(coord, HybridKVCacheCoordinator)
                  and coord.full_attention_group_id is not None
                  and any(isinstance(g.kv_cache_spec, MambaSpec)
                          for g in self.kv_cache_config.kv_cache_groups))
        if not hybrid:
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0, False
        bound = (len(request.all_token_ids) - 1 if max_cache_hit_length is None
                 else max_cache_hit_length)
        blocks, lengths = coord.find_longest_cache_hit_per_group(request.block_hashes, bound)
        full = lengths[coord.full_attention_group_id]
        if max(lengths) > full:
            # Full attention lost blocks another group kept: only the agreed
            # lookup gives a boundary every group can serve.
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        return self.create_kv_cache_blocks(blocks), full, 0, min(lengths) < full

    # -- allocation --------------------------------------------------------------------

    def allocate_slots(
            self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
            new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
            num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
            num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
            reserved_blocks: int = 0, has_scheduled_reqs: bool = True,
            skip_zeroing_group_ids: Sequence[int] = ()) -> KVCacheBlocks | None:
        """Slots for the request's computed prefix plus `num_new_tokens` (and
        lookahead). None, with nothing taken, when the pool cannot give them.
        `skip_zeroing_group_ids`: groups whose external blocks a connector's
        load writes, so the worker must not zero them.

        The request's tokens, left to right: already computed | prefix hit |
        loaded by a connector | new | lookahead. The hit is taken, blocks
        are found for the rest, and the blocks the final tokens fill are keyed
        (unless a connector is still loading them).
        """
        if not (num_new_tokens or num_external_computed_tokens
                or (num_new_computed_tokens and self._adopt_without_new)):
            raise ValueError("an allocation must add tokens: num_new_tokens is 0 and "
                             "there is nothing to take over")
        running = self._plain_running
        request_id = request.request_id
        if (running is None or request_id not in running or new_computed_blocks is not None
                or num_external_computed_tokens or full_sequence_must_fit
                or (self.watermark_blocks and request.status is not RequestStatus.RUNNING)):
            return self._allocate(request, num_new_tokens, num_new_computed_tokens,
                                  new_computed_blocks, num_lookahead_tokens,
                                  num_external_computed_tokens, delay_cache_blocks,
                                  num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                                  has_scheduled_reqs, skip_zeroing_group_ids)
        # A running request of a single full-attention group (every decode
        # step of every request): no hit to take, nothing skipped, no
        # watermark, so the general path's fan-out is left out.
        plain = self._plain
        limit = self.max_model_len
        computed = request.num_computed_tokens
        if computed > limit:
            computed = limit
        slots = computed + num_new_tokens + num_lookahead_tokens
        if slots > limit:
            slots = limit
        table = plain.req_to_blocks[request_id]
        size = plain.block_size
        missing = -(-slots // size) - len(table)  # cdiv, written out: hot path
        pool = self.block_pool
        fresh = None
        if missing > 0:
            if missing > pool.free_block_queue.num_free_blocks - reserved_blocks:
                return None
            fresh = pool.get_new_blocks(missing)
            table += fresh
        elif reserved_blocks and pool.free_block_queue.num_free_blocks < reserved_blocks:
            return None
        if not delay_cache_blocks and self.enable_caching:
            final = computed + num_new_tokens
            total = len(request.all_token_ids)
            if final > total:
                final = total
            # Blocks filled since the last call are keyed (plain.cache_blocks).
            if final // size > running[request_id]:
                plain.cache_blocks(request, final)
        if fresh is None:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks((fresh,))

    def _allocate(self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                  num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                  num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                  has_scheduled_reqs, skip_zeroing_group_ids=()) -> KVCacheBlocks | None:
        request_id = request.request_id
        coord = self.coordinator
        no_hit = self.empty_kv_cache_blocks.blocks
        hit = no_hit if new_computed_blocks is None else new_computed_blocks.blocks
        if new_computed_blocks is not None and self._longer_hit_groups:
            # (A new tuple even for an empty hit: the hit is then taken, as in vLLM.)
            hit = self._trim_longer_hits(hit, num_new_computed_tokens
                                         + num_external_computed_tokens)
        local = request.num_computed_tokens + num_new_computed_tokens
        with_external = local + num_external_computed_tokens
        computed = min(with_external, self.max_model_len)
        headroom = 0
        if has_scheduled_reqs and request.status in _NEEDS_WATERMARK:
            headroom = self.watermark_blocks
        # Where the prefill ends (a resumed request recomputes its output too).
        num_tokens = len(request.all_token_ids)
        prefill_end = max(request.num_prompt_tokens, num_tokens - 1)
        free = self.block_pool.free_block_queue
        if full_sequence_must_fit:
            whole = min(num_tokens, self.max_model_len)
            needed = coord.get_num_blocks_to_allocate(
                request_id, whole, hit, num_encoder_tokens, computed, local, whole,
                apply_admission_cap=True, prefill_end=prefill_end)
            if needed + headroom > free.num_free_blocks:
                return None
        main_model = computed + num_new_tokens
        slots = min(main_model + num_lookahead_tokens, self.max_model_len)
        # Give back what the window has left first, so it can serve this
        # allocation; done even when the allocation is then refused.
        coord.remove_skipped_blocks(
            request_id, max(0, computed - request.num_in_flight_tokens),
            request.num_prompt_tokens)
        needed = coord.get_num_blocks_to_allocate(
            request_id, slots, hit, num_encoder_tokens, with_external, local, main_model,
            prefill_end=prefill_end)
        if needed + headroom > free.num_free_blocks - reserved_blocks:
            return None
        if hit is not no_hit or num_external_computed_tokens > 0:
            coord.allocate_new_computed_blocks(request_id, hit, local,
                                               num_external_computed_tokens,
                                               skip_zeroing_group_ids)
        fresh = coord.allocate_new_blocks(request_id, slots, main_model,
                                                num_encoder_tokens)
        if not delay_cache_blocks and self._cache_step:
            # Lookahead (draft) tokens may be rejected: only final ones are keyed.
            coord.cache_blocks(request, min(computed + num_new_tokens, num_tokens))
        return self._answer(fresh)

    def _trim_longer_hits(self, hit: PerGroup, num_reused: int) -> PerGroup:
        trimmed = list(hit)
        managers = self.coordinator.single_type_managers
        for group_id in self._longer_hit_groups:
            trimmed[group_id] = trimmed[group_id][:cdiv(num_reused,
                                                        managers[group_id].block_size)]
        return tuple(trimmed)

    def _answer(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks:
        for group in blocks:
            if group:
                return KVCacheBlocks(blocks)
        return self.empty_kv_cache_blocks

    # vLLM's public name for the same: the shared empty answer when no group
    # has a block.
    create_kv_cache_blocks = _answer

    # -- release and cache control --------------------------------------------------------

    def free(self, request: Request) -> None:
        pins = self._partial_tail_pins.pop(request.request_id, None)
        if pins:
            self.block_pool.free_blocks(pins)
        self.coordinator.free(request.request_id)

    def pop_blocks_for_free(self, request: Request) -> BlockList:
        """Forget the request without releasing its blocks: they are
        returned, in table order, for the caller to free once no step in
        flight can write them (reversed, tail first; specs §16.3)."""
        popped = self.coordinator.pop_blocks_for_free(request.request_id)
        # Pinned prompt-tail copies are released with the request's blocks.
        pins = self._partial_tail_pins.pop(request.request_id, None)
        return pins + popped if pins else popped

    def truncate_computed_blocks(self, blocks: KVCacheBlocks,
                                 num_computed_tokens: int) -> KVCacheBlocks:
        """A lookup's answer cut at `num_computed_tokens` (block-aligned in
        every cacheable group); nothing is touched or changed."""
        cut: list[BlockList] = []
        managers = self.coordinator.single_type_managers
        groups = self.kv_cache_config.kv_cache_groups
        for hit, manager, group in zip(blocks.blocks, managers, groups, strict=True):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable:
                if hit:
                    raise AssertionError("a lookup found blocks of a group that "
                                         "takes no part in prefix caching")
                cut.append([])
                continue
            size = manager.block_size
            if num_computed_tokens % size:
                raise AssertionError(f"{num_computed_tokens} tokens end inside a "
                                     f"{size}-token block")
            keep = num_computed_tokens // size
            if keep > len(hit) and not isinstance(spec, MambaSpec):
                raise AssertionError(f"{num_computed_tokens} tokens reach past the "
                                     f"{len(hit)} hit blocks of a group")
            cut.append(list(hit[:keep]))
        return self.create_kv_cache_blocks(tuple(cut))

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        self.coordinator.remove_skipped_blocks(request_id, num_computed_tokens,
                                               num_prompt_tokens)

    def take_new_block_ids(self) -> Ids:
        """Ids of blocks handed out since the last call that the worker must
        zero, group after group (specs §16.4)."""
        return self.coordinator.take_new_block_ids()

    def record_blocks_for_zeroing(self, request_id: str,
                                  start_token: int) -> None:
        """Zero the request's blocks from `start_token` on again (e.g. what a
        failed load left unwritten)."""
        managers = self.coordinator.single_type_managers
        for manager in managers:
            if not manager.records_new_block_ids:
                continue
            if start_token % manager.block_size:
                raise AssertionError(f"zeroing from token {start_token} would wipe part of "
                                     f"a {manager.block_size}-token block")
            table = manager.req_to_blocks.get(request_id, ())
            manager.new_block_ids += [b.block_id
                                      for b in table[start_token // manager.block_size:]]

    def get_num_common_prefix_blocks(self, running_request_id: str) -> Ids:
        """Per group, the leading blocks every request with blocks there
        shares (cascade attention; profile common_prefix_blocks). Without
        cascade attention (0.32+), or prefix caching, zeros."""
        managers = self.coordinator.single_type_managers
        if not (self.profile.common_prefix_blocks and self.enable_caching):
            return [0 for _ in managers]
        return [m.get_num_common_prefix_blocks(running_request_id) for m in managers]

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        done = self.coordinator.reset_prefix_cache()
        if done and self.log_stats:
            self.prefix_cache_stats.reset = True
        return done

    def new_step_starts(self) -> None:
        for hook in self._step_hooks:
            hook()

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[KVCacheBlock]]:
        """The copy-on-write copies due: (source id, copy id) pairs, and the
        blocks they keep held (source and copy of each pair), which the
        scheduler releases once the copies have run."""
        pairs = self.coordinator.take_pending_cow_copies()
        held = []
        for source, copy in pairs:
            held += (source, copy)
        return [(source.block_id, copy.block_id) for source, copy in pairs], held

    # -- boundary states for KV connectors (§9.4.3) ---------------------------------------

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The boundary states offered since the last call, per request:
        (group, block id, boundary tokens)."""
        return self._drain_offers(pin=False)

    def take_partial_tail_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """0.28's drain (only prompt-tail copies are offered then): each block
        is also pinned until its request is freed, as no table holds it."""
        if not self.profile.boundary_state_offloads.pins_partial_tails:
            raise AttributeError(f"vLLM {self.profile.name}'s KVCacheManager has no "
                                 "take_partial_tail_offloads")
        return self._drain_offers(pin=True)

    def _drain_offers(self, pin: bool) -> dict[str, list[tuple[int, int, int]]]:
        offers: dict[str, list[tuple[int, int, int]]] = {}
        for request_id, group_id, block, boundary in (
                self.coordinator.take_pending_boundary_state_offloads()):
            if pin:
                self.block_pool.touch((block,))
                self._partial_tail_pins.setdefault(request_id, []).append(block)
            offers.setdefault(request_id, []).append((group_id, block.block_id, boundary))
        return offers

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """A finishing request's prompt-tail states still in its own table
        blocks: (group, block id, boundary tokens)."""
        out = []
        for manager in self.coordinator.single_type_managers:
            tail = manager.finalize_partial_tail_offload(
                request.request_id, request.num_computed_tokens, request.num_in_flight_tokens)
            if tail is not None:
                group_id, block, boundary = tail
                out.append((group_id, block.block_id, boundary))
        return out

    # -- reading ------------------------------------------------------------------------------

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._answer(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> GroupIds:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str,
                                          num_computed_tokens: int) -> GroupIds:
        """The request's ids per group; groups whose tables follow its
        tokens cut to the blocks `num_computed_tokens` tokens occupy (spec
        §16.10: the spec's own block size, DCP or not)."""
        ids = self.get_block_ids(request_id)
        out = []
        for group, group_ids in zip(self.kv_cache_config.kv_cache_groups, ids):
            spec = group.kv_cache_spec
            if spec.clipped_to_computed_tokens:
                group_ids = group_ids[:cdiv(num_computed_tokens, spec.block_size)]
            out.append(group_ids)
        return tuple(out)

    def estimate_cached_tokens(self, request: Request) -> int:
        """The prefix every counting group has keyed blocks for: per group
        the longest key among the request's blocks, the least over groups
        (0 when no group counts). Which groups count is the release's
        (profile.estimate_cached_tokens; every non-encoder group before
        0.30)."""
        every_group = self.profile.estimate_cached_tokens is CachedTokensEstimate.ALL_BUT_ENCODER
        least = None
        for group, blocks in zip(self.kv_cache_config.kv_cache_groups,
                                 self.get_blocks(request.request_id).blocks):
            spec = group.kv_cache_spec
            counts = not spec.reads_encoder_tokens if every_group else spec.counts_cached_tokens
            if not counts:
                continue
            keyed = max((b.block_hash_num_tokens or 0 for b in blocks), default=0)
            least = keyed if least is None else min(least, keyed)
        return least or 0

    def take_events(self) -> list[KVCacheEvent]:
        drained = self.block_pool.take_events()
        if self.profile.kv_event_fields.carries_spec:
            labels = self._group_labels
            for event in drained:
                if type(event) is BlockStored and event.group_idx is not None:
                    event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = (
                        labels[event.group_idx])
        return drained
