"""Coordinators: one request's calls, fanned out to every group's manager
(vLLM's name: KVCacheCoordinator and its kinds); specs/KV_CACHE_MANAGER.md §10.

Every group draws from one block pool. Which coordinator a model gets:
- prefix caching off, any number of groups: no lookups at all;
- one group: its own lookup, hits in whole blocks;
- several groups (hybrid): a hit is a prefix every group can serve, found by
  letting each kind shorten the candidate until none does.

Groups may differ in block size: requests are hashed every `hash_block_size`
tokens (the GCD), the scheduler works in `scheduler_block_size` (the LCM),
and hybrid hits land on multiples of the latter, or of the hash block size
when hits inside blocks are on (0.32, a Mamba "align" group).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.eagle import draft_group_ids, dropping_group_ids, eagle_proof_margin
from impl.group_rules import partial_hash_hits_enabled
from impl.hisparse.coordinator import attach_hisparse
from impl.kv_cache_metrics import KVCacheMetricsCollector
from impl.kv_cache_spec import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
)
from impl.managers import SingleTypeKVCacheManager, manager_class_for
from impl.managers.base import BlockTable, CopyPair
from impl.managers.cross_attention import CrossAttentionManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.mamba import MambaManager
from impl.math_utils import cdiv
from impl.profiles import ExternalBlocksOrder, VersionProfile
from impl.request import Request
from impl.retention import replay_boundaries, thinned_kinds, validate_retention_interval

PerGroup = tuple[Sequence[KVCacheBlock], ...]
_NO_HIT_BLOCKS: tuple = ()


class KVCacheCoordinator:
    # Whether hits may end inside blocks (only a hybrid coordinator decides).
    enable_partial_hash_hits = False

    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 enable_caching: bool, hash_block_size: int, *,
                 enable_kv_cache_events: bool = False, events_use_int_hashes: bool = True,
                 dcp_world_size: int = 1, pcp_world_size: int = 1,
                 scheduler_block_size: int | None = None, max_model_len: int = 1 << 30,
                 max_in_flight_tokens: int | None = None, use_eagle: bool = False,
                 num_prefill_lookahead: int = 0, num_hash_lookahead_tokens: int = 0,
                 metrics_collector: KVCacheMetricsCollector | None = None) -> None:
        self.kv_cache_config, self.profile = kv_cache_config, profile
        self.hash_block_size, self.dcp_world_size = hash_block_size, dcp_world_size
        self.pcp_world_size = pcp_world_size
        self.block_pool = BlockPool(kv_cache_config.num_blocks, enable_caching, hash_block_size,
                                    enable_kv_cache_events, profile=profile,
                                    events_use_int_hashes=events_use_int_hashes,
                                    num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                                    metrics_collector=metrics_collector)
        groups = kv_cache_config.kv_cache_groups
        specs = [group.kv_cache_spec for group in groups]
        self.scheduler_block_size = scheduler_block_size or (
            specs[0].block_size if specs else hash_block_size)
        in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        # EAGLE / MTP (specs §15): the draft groups, and those whose hits
        # drop their last unit (the same in 0.32; 0.33 needs use_eagle).
        self.eagle_group_ids = draft_group_ids(groups, use_eagle)
        self.drop_eagle_group_ids = dropping_group_ids(self.eagle_group_ids, use_eagle, profile,
                                                       len(groups))
        # Multi-module MTP writes the tokens after a chunk's end again next
        # step: that many trailing computed tokens are not final (§16.1).
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        if enable_caching and self.eagle_group_ids and (
                self.scheduler_block_size < num_prefill_lookahead):
            raise ValueError(f"prefix caching with {num_prefill_lookahead} prefill lookahead "
                             f"tokens needs scheduler blocks of at least that many tokens, "
                             f"not {self.scheduler_block_size}: the dropped tail must hold them")
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            manager_class_for(group.kv_cache_spec, group.role)(
                group.kv_cache_spec, self.block_pool, enable_caching, group_id,
                self.scheduler_block_size, dcp_world_size, pcp_world_size,
                group.kv_cache_spec.max_admission_blocks_per_request(in_flight, max_model_len),
                needs_kv_cache_zeroing=kv_cache_config.needs_kv_cache_zeroing)
            for group_id, group in enumerate(groups))
        # HiSparse's groups share one coordinator of their own (None without).
        self.hisparse = attach_hisparse(kv_cache_config, self.single_type_managers,
                                        max_model_len, self.num_reprefillable_tokens,
                                        profile.hisparse_residency)
        if use_eagle:
            for manager in self.single_type_managers:
                if isinstance(manager, MambaManager):
                    manager.drop_eagle_checkpoint_block = True
        self.group_block_sizes = tuple(m.block_size for m in self.single_type_managers)
        # Cross-attention groups are sized by the encoder's tokens.
        self._encoder_sized = tuple(isinstance(m, CrossAttentionManager)
                                    for m in self.single_type_managers)
        self._has_encoder_groups = any(self._encoder_sized)
        # Sparse checkpoints of sliding-window and Mamba groups (§9.2.1).
        interval = kv_cache_config.prefix_cache_retention_interval
        if interval is not None and not profile.prefix_cache_retention:
            raise ValueError(f"vLLM {profile.name} has no prefix_cache_retention_interval")
        shape = profile.prefix_cache_retention
        validate_retention_interval(interval, self.scheduler_block_size, specs, shape)
        self.retention_interval = interval
        # The groups the interval thins: the kinds the release does not thin
        # key densely. The interval itself is read at each cache step, as
        # vLLM reads its coordinator's (a caller may set it afterwards).
        thinned = thinned_kinds(shape)
        self._thinned_groups = tuple(isinstance(m.kv_cache_spec, thinned)
                                     for m in self.single_type_managers)

    # -- allocation ---------------------------------------------------------------

    def get_num_blocks_to_allocate(
            self, request_id: str, num_tokens: int, new_computed_blocks: PerGroup,
            num_encoder_tokens: int, total_computed_tokens: int, num_local_computed_tokens: int,
            num_tokens_main_model: int, apply_admission_cap: bool = False,
            prefill_end: int = 0) -> int:
        if self.retention_interval != 0:
            # Dense or periodic retention keeps every chunk's checkpoint: only
            # retention 0 confines Mamba checkpoints to the prefill's end.
            prefill_end = 0
        needed = 0
        for manager, hit, encoder in zip(self.single_type_managers, new_computed_blocks,
                                         self._encoder_sized):
            if encoder:
                # One allocation at admission, for the encoder output.
                needed += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, _NO_HIT_BLOCKS, 0, 0,
                    num_encoder_tokens, apply_admission_cap)
            else:
                needed += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, hit, total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model, apply_admission_cap,
                    prefill_end)
        return needed

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: PerGroup,
                                     num_local_computed_tokens: int,
                                     num_external_computed_tokens: int,
                                     skip_zeroing_group_ids: Sequence[int] = ()) -> None:
        """A new request takes its hit in every group, and blocks for the
        tokens a connector will load (not zeroed in the groups whose load
        writes them); a running request takes nothing."""
        managers = self.single_type_managers
        for manager in managers:
            if request_id in manager.num_cached_block:
                return
        external = num_external_computed_tokens > 0
        if self.profile.external_blocks_order is ExternalBlocksOrder.AFTER_ALL_HITS:
            # Every hit is held before any group allocates, so one group's
            # allocation cannot evict another group's hit.
            for manager, hit in zip(managers, new_computed_blocks):
                manager.add_local_computed_blocks(request_id, hit, num_local_computed_tokens,
                                                  num_external_computed_tokens)
            if external:
                for group_id, manager in enumerate(managers):
                    manager.allocate_external_computed_blocks(
                        request_id, num_local_computed_tokens, num_external_computed_tokens,
                        group_id not in skip_zeroing_group_ids)
            return
        for group_id, (manager, hit) in enumerate(zip(managers, new_computed_blocks)):
            manager.add_local_computed_blocks(request_id, hit, num_local_computed_tokens,
                                              num_external_computed_tokens)
            if external:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens,
                    group_id not in skip_zeroing_group_ids)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int,
                            num_encoder_tokens: int = 0) -> tuple[BlockTable, ...]:
        if not self._has_encoder_groups:
            return tuple(manager.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
                         for manager in self.single_type_managers)
        return tuple(
            manager.allocate_new_blocks(request_id, num_encoder_tokens if encoder else num_tokens,
                                        num_tokens_main_model)
            for manager, encoder in zip(self.single_type_managers, self._encoder_sized))

    # -- keying and releasing ---------------------------------------------------------

    def get_num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        """How many of the computed tokens this group may key: not those a
        prefill lookahead writes again."""
        final = num_computed_tokens - self.num_reprefillable_tokens
        return final if final > 0 else 0
    def _replay_boundaries(self, request: Request) -> tuple[int, ...]:
        """Only a retention interval reads them (§10): dense caching keeps
        every reachable checkpoint anyway."""
        if self.retention_interval is None:
            return ()
        return replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                 bool(self.eagle_group_ids), self.profile.prefix_cache_retention)

    def _group_interval(self, group_id: int) -> int | None:
        return self.retention_interval if self._thinned_groups[group_id] else None

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        boundaries = self._replay_boundaries(request)
        for group_id, manager in enumerate(self.single_type_managers):
            if manager.enable_caching:
                manager.cache_blocks(
                    request, self.get_num_cacheable_tokens(num_computed_tokens, group_id),
                    self._group_interval(group_id), boundaries)

    def _each(self, method: str, *args) -> None:
        """Call `method` with `args` on every group's manager."""
        for manager in self.single_type_managers:
            getattr(manager, method)(*args)

    def free(self, request_id: str) -> None:
        self._each("free", request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request in every group; its blocks, group after group
        in table order, for the caller to free later (specs §16.3)."""
        blocks: list[KVCacheBlock] = []
        for manager in self.single_type_managers:
            blocks += manager.pop_blocks_for_free(request_id)
        return blocks

    def emit_cached_block_events(self, request: Request, hit: PerGroup) -> None:
        """Announce a hit's blocks again, group by group (specs §16.2)."""
        groups = self.kv_cache_config.kv_cache_groups
        for group_id, blocks in enumerate(hit):
            if blocks:
                self.block_pool.emit_cached_block_events(
                    request, len(blocks), groups[group_id].kv_cache_spec.block_size, group_id)

    def take_new_block_ids(self) -> list[int]:
        ids: list[int] = []
        for manager in self.single_type_managers:
            ids += manager.take_new_block_ids()
        return ids

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        self._each("remove_skipped_blocks", request_id, num_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id: str) -> tuple[BlockTable, ...]:
        return tuple(manager.req_to_blocks.get(request_id) or []
                     for manager in self.single_type_managers)

    def take_pending_cow_copies(self) -> list[CopyPair]:
        return [pair for m in self.single_type_managers for pair in m.take_pending_cow_copies()]

    def reset_prefix_cache(self) -> bool:
        if self.hisparse is None:
            return self.block_pool.reset_prefix_cache()
        # Every pool is asked (HiSparse's host pool too); all must agree.
        pools = {id(m.block_pool): m.block_pool for m in self.single_type_managers}
        return all([pool.reset_prefix_cache() for pool in pools.values()])

    def new_step_starts(self) -> None:
        self._each("new_step_starts")

    def find_longest_cache_hit(self, block_hashes: Sequence, max_cache_hit_length: int
                               ) -> tuple[tuple[BlockTable, ...], int, int]:
        """(hit blocks per group, hit tokens, tokens of a shared prefix some
        group has not cached: how far the longest single kind reached past
        the agreed hit)."""
        raise NotImplementedError

    def take_pending_boundary_state_offloads(self) -> list:
        return [offer for m in self.single_type_managers
                for offer in m.take_pending_boundary_state_offloads()]


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off: lookups find nothing, whatever the groups."""

    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, False, hash_block_size, **kwargs)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in self.single_type_managers), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group: every call goes straight to its manager (the hot path of
    every non-hybrid model)."""

    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 enable_caching: bool, hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, enable_caching, hash_block_size, **kwargs)
        (only,) = self.single_type_managers
        self.manager = only
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.block_size = only.block_size
        if enable_caching and only.block_size != hash_block_size:
            raise ValueError(f"one group is hashed at its own block size; got hash blocks of "
                             f"{hash_block_size} for blocks of {only.block_size}")
        # Plain full attention: the lookup is one scan of the map.
        self._scan = isinstance(only, FullAttentionManager)
        only.use_eagle = self._drops = 0 in self.drop_eagle_group_ids

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   num_encoder_tokens, total_computed_tokens,
                                   num_local_computed_tokens, num_tokens_main_model,
                                   apply_admission_cap=False, prefill_end=0) -> int:
        if self._has_encoder_groups:
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
                apply_admission_cap, prefill_end)
        return self.manager.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[0], total_computed_tokens,
            num_local_computed_tokens, num_tokens_main_model, apply_admission_cap, prefill_end)

    def allocate_new_computed_blocks(self, request_id, new_computed_blocks,
                                     num_local_computed_tokens, num_external_computed_tokens,
                                     skip_zeroing_group_ids=()):
        only = self.manager
        if request_id in only.num_cached_block:
            return
        only.add_local_computed_blocks(request_id, new_computed_blocks[0],
                                       num_local_computed_tokens, num_external_computed_tokens)
        if num_external_computed_tokens > 0:
            only.allocate_external_computed_blocks(request_id, num_local_computed_tokens,
                                                   num_external_computed_tokens,
                                                   0 not in skip_zeroing_group_ids)

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model,
                            num_encoder_tokens=0):
        tokens = num_encoder_tokens if self._has_encoder_groups else num_tokens
        return (self.manager.allocate_new_blocks(request_id, tokens, num_tokens_main_model),)

    def cache_blocks(self, request, num_computed_tokens) -> None:
        if self.manager.enable_caching:
            self.manager.cache_blocks(
                request, max(0, num_computed_tokens - self.num_reprefillable_tokens),
                self._group_interval(0), self._replay_boundaries(request))

    def remove_skipped_blocks(self, request_id, num_computed_tokens,
                              num_prompt_tokens=None) -> None:
        self.manager.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        only = self.manager
        if self._scan:
            size = self.block_size
            run = self.block_pool.cached_block_hash_to_block.prefix_run(
                block_hashes[:max_cache_hit_length // size], b"\0\0\0\0")  # group 0
            if self._drops and run:
                run.pop()  # an EAGLE drafter recomputes the last block
            return (run,), len(run) * size, 0
        # One group: no other group can lag behind it. The group's DCP
        # geometry, but the process's PCP size (as vLLM passes them: a
        # replicated sliding window under PCP is refused).
        blocks, hit = only.find_longest_cache_hit(
            block_hashes, max_cache_hit_length, (0,), self.block_pool, self.kv_cache_spec,
            self.block_size, only.dcp_world_size, self.pcp_world_size,
            drop_eagle_block=self._drops)
        return blocks, hit, 0


@dataclass(slots=True)
class SpecGroup:
    """Groups of one spec and manager kind: looked up in one pass. They drop
    the last unit of a hit for EAGLE together, if any of them does."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool = False


def _fine_grained_hits(profile: VersionProfile, specs: Sequence[KVCacheSpec],
                       manager_classes: Sequence[type[SingleTypeKVCacheManager]],
                       hash_block_size: int, dcp_world_size: int) -> bool:
    """Whether a hybrid model's hits may land on hash blocks (the release
    has them, and its gating lets these groups)."""
    return profile.partial_block_hits and partial_hash_hits_enabled(
        specs, manager_classes, hash_block_size, dcp_world_size, profile.partial_hit_gating)


def resolve_cache_hit_alignment_tokens(kv_cache_config: KVCacheConfig,
                                       profile: VersionProfile, enable_caching: bool,
                                       scheduler_block_size: int, hash_block_size: int,
                                       dcp_world_size: int = 1) -> int:
    """The granularity hits land on, as the hybrid coordinator built for this
    config would set it, without building one (the scheduler asks)."""
    groups = kv_cache_config.kv_cache_groups
    if not enable_caching or len(groups) <= 1:
        return scheduler_block_size
    specs = [group.kv_cache_spec for group in groups]
    classes = [manager_class_for(group.kv_cache_spec, group.role) for group in groups]
    if _fine_grained_hits(profile, specs, classes, hash_block_size, dcp_world_size):
        return hash_block_size
    return scheduler_block_size


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 enable_caching: bool, hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, enable_caching, hash_block_size, **kwargs)
        specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
        managers = self.single_type_managers
        if not profile.single_spec_hybrid and len({(type(m), spec) for spec, m
                                                   in zip(specs, managers)}) < 2:
            # Releases before 0.29 look groups of one spec up together and
            # need two such batches to build a hybrid coordinator.
            raise AssertionError("a hybrid coordinator needs groups of at least two "
                                 "distinct specs")
        for spec, manager in zip(specs, managers):
            if spec.prefix_cacheable and manager.block_size % hash_block_size:
                raise ValueError(f"a {manager.block_size}-token block is not a whole number "
                                 f"of {hash_block_size}-token hash blocks")
        _check_context_parallel_kinds(specs, self.dcp_world_size, self.pcp_world_size)
        self.enable_partial_hash_hits = _fine_grained_hits(
            profile, specs, [type(m) for m in managers], hash_block_size, self.dcp_world_size)
        self.alignment_tokens = (hash_block_size if self.enable_partial_hash_hits
                                 else self.scheduler_block_size)
        for manager in managers:
            manager.cache_hit_alignment_tokens = self.alignment_tokens
        self.attention_groups = self._spec_groups(specs)
        first = self.attention_groups[0] if self.attention_groups else None
        # The full-attention group a connector's lookup reports (None: none).
        self.full_attention_group_id = (
            first.group_ids[0] if first is not None and isinstance(first.spec, FullAttentionSpec)
            else None)
        self._caches_aligned = (profile.hybrid_caches_scheduler_aligned
                                and not self.enable_partial_hash_hits)

    def _spec_groups(self, specs: list[KVCacheSpec]) -> list[SpecGroup]:
        batches: list[SpecGroup] = []
        drops = self.drop_eagle_group_ids
        for group_id, spec in enumerate(specs):
            if not spec.prefix_cacheable:
                continue
            manager = self.single_type_managers[group_id]
            cls = type(manager)
            same = next((b for b in batches if b.manager_cls is cls and b.spec == spec
                         and managers_pool(self, b) is manager.block_pool), None)
            if same is None:
                batches.append(SpecGroup(spec, [group_id], cls, group_id in drops))
            else:
                same.group_ids.append(group_id)
                same.use_eagle = same.use_eagle or group_id in drops
        # Full attention first: its scan from the left bounds everyone else's.
        batches.sort(key=lambda b: not isinstance(b.spec, FullAttentionSpec))
        # Groups looked up together drop together, so they key alike too.
        for batch in batches:
            if batch.use_eagle:
                for group_id in batch.group_ids:
                    self.single_type_managers[group_id].use_eagle = True
        return batches

    def _aligned(self, num_tokens: int) -> int:
        """The longest prefix of `num_tokens` a later hit can end on."""
        if not self._caches_aligned:
            return num_tokens
        return num_tokens - num_tokens % self.scheduler_block_size

    def get_num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        aligned = self._aligned(num_computed_tokens)
        manager = self.single_type_managers[group_id]
        if manager.use_eagle and aligned > 0:
            # An EAGLE lookup matches one block beyond an aligned length and
            # drops it: that block must be keyed too, once it is final.
            final = max(0, num_computed_tokens - self.num_reprefillable_tokens)
            return min(final, self._aligned(final) + manager.block_size)
        return aligned

    def _margin(self, batch: SpecGroup) -> int:
        """Tokens a dropping batch looks beyond the candidate (its drop unit)."""
        manager = self.single_type_managers[batch.group_ids[0]]
        return eagle_proof_margin(
            manager.block_size, self.hash_block_size,
            self.enable_partial_hash_hits and batch.manager_cls.supports_fine_grained_hash_lookup)

    def _lookup(self, batch: SpecGroup, block_hashes, max_length: int, drop: bool,
                bound: int):
        manager = self.single_type_managers[batch.group_ids[0]]
        if drop and not isinstance(batch.spec, MambaSpec):
            # Look one drop unit further, so the drop lands on the candidate
            # (Mamba lookups drop nothing: no margin), up to the lookup's
            # bound or, in releases that allow it, the hashed tokens.
            cap = (len(block_hashes) * self.hash_block_size
                   if self.profile.eagle_margin_to_hashed_tokens else bound)
            max_length = min(max_length + self._margin(batch), cap)
        # The group's own pool: HiSparse's source group looks up the host pool.
        return batch.manager_cls.find_longest_cache_hit(
            block_hashes, max_length, batch.group_ids, manager.block_pool, batch.spec,
            self.alignment_tokens, manager.dcp_world_size, manager.pcp_world_size,
            drop_eagle_block=drop)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        managers = self.single_type_managers
        found: list[list | None] = [None] * len(managers)
        lengths = [0] * len(managers)
        batches = self.attention_groups
        # One full-attention kind plus one other agree after a single pass.
        one_pass = len(batches) == 2 and isinstance(batches[0].spec, FullAttentionSpec)
        # Batches whose EAGLE drop holds for the current candidate: each
        # drops once per candidate, not on every pass (that would spiral).
        verified: set[int] = set()
        agreed = max_cache_hit_length
        longest = 0
        while True:
            candidate = agreed
            for index, batch in enumerate(batches):
                lead = batch.group_ids[0]
                if isinstance(batch.spec, FullAttentionSpec) and found[lead] is not None:
                    # A full-attention hit holds for every shorter length:
                    # trim it later rather than look it up again.
                    candidate = min(candidate, lengths[lead])
                    continue
                drop = batch.use_eagle and index not in verified
                blocks, length = self._lookup(batch, block_hashes, candidate, drop,
                                              max_cache_hit_length)
                if drop:
                    verified.add(index)
                elif length < candidate:
                    verified.clear()
                candidate = length
                for group_id, group_blocks in zip(batch.group_ids, blocks):
                    found[group_id] = group_blocks
                    lengths[group_id] = length
                if candidate > longest:
                    longest = candidate
            if candidate >= agreed or one_pass:
                agreed = min(agreed, candidate)
                break
            agreed = candidate
        for batch in batches:
            lead = managers[batch.group_ids[0]]
            if isinstance(batch.spec, FullAttentionSpec) and not lead.retains_longer_hit:
                keep = cdiv(agreed, lead.block_size)
                for group_id in batch.group_ids:
                    if found[group_id] is not None:
                        del found[group_id][keep:]
        return (tuple([] if blocks is None else blocks for blocks in found), agreed,
                longest - agreed)

    def find_longest_cache_hit_per_group(self, block_hashes, max_cache_hit_length):
        """Each spec batch looked up on its own (a connector's view): the
        blocks per group and each group's hit length."""
        found: list[list] = [[] for _ in self.single_type_managers]
        lengths = [0] * len(found)
        for batch in self.attention_groups:
            blocks, length = self._lookup(batch, block_hashes, max_cache_hit_length,
                                          batch.use_eagle, max_cache_hit_length)
            for group_id, group_blocks in zip(batch.group_ids, blocks):
                found[group_id] = group_blocks
                lengths[group_id] = length
        return tuple(found), tuple(lengths)


def managers_pool(coordinator: KVCacheCoordinator, batch: SpecGroup) -> BlockPool:
    """The pool a batch of groups is looked up in (HiSparse's host group has its own)."""
    return coordinator.single_type_managers[batch.group_ids[0]].block_pool


def _check_context_parallel_kinds(specs: Sequence[KVCacheSpec], dcp_world_size: int,
                                  pcp_world_size: int) -> None:
    """Which kinds a hybrid model may mix under context parallelism: blocks
    of sharded windows or states cannot be split across ranks, replicated
    ones (a draft model beside a sharded target) can be kept whole."""
    for spec in specs:
        whole = not spec.dcp_sharded
        if pcp_world_size > 1 and not (isinstance(spec, FullAttentionSpec)
                                       or (isinstance(spec, AttentionSpec) and whole)):
            raise AssertionError(f"prefill context parallelism over a hybrid model takes "
                                 f"full or replicated attention, not {type(spec).__name__}")
        if dcp_world_size > 1 and not (isinstance(spec, FullAttentionSpec) or whole):
            raise AssertionError(f"decode context parallelism over a hybrid model takes full "
                                 f"attention, Mamba or replicated attention, not "
                                 f"{type(spec).__name__}")


def get_kv_cache_coordinator(kv_cache_config: KVCacheConfig, profile: VersionProfile,
                             enable_caching: bool, hash_block_size: int,
                             **kwargs) -> KVCacheCoordinator:
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(kv_cache_config, profile, hash_block_size, **kwargs)
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(kv_cache_config, profile, True, hash_block_size,
                                         **kwargs)
    return HybridKVCacheCoordinator(kv_cache_config, profile, True, hash_block_size, **kwargs)
