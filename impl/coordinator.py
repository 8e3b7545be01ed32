"""Coordinators: fan one request's KV cache calls out to every group's manager.

vLLM: KVCacheCoordinator and its subclasses. All groups share one block pool.
- no-prefix-cache: caching off, any number of groups (cross attention, Mamba
  "none" mode and plain models alike);
- unitary: one group; hits are whole blocks of that group;
- hybrid: several groups; a hit is the longest prefix every group agrees on,
  found by letting each kind cut the candidate length until none cuts it more.

Groups may have different block sizes: requests are hashed every
`hash_block_size` tokens (their GCD), the scheduler works in multiples of
`scheduler_block_size` (their LCM), and hits land on multiples of the latter,
or of the hash block size when fine-grained hits are on (a Mamba "align" group
with blocks larger than the hash block, 0.32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheSpec, MambaSpec
from impl.managers import SingleTypeKVCacheManager, manager_class_for, max_admission_blocks_per_request
from impl.managers.base import cdiv
from impl.managers.cross_attention import CrossAttentionManager
from impl.profiles import ExternalBlocksOrder, VersionProfile
from impl.request import Request

BlocksPerGroup = tuple[Sequence[KVCacheBlock], ...]


class KVCacheCoordinator:
    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        profile: VersionProfile,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        events_use_int_hashes: bool = True,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        scheduler_block_size: int | None = None,
        max_model_len: int = 1 << 30,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.profile = profile
        self.hash_block_size = hash_block_size
        self.dcp_world_size = dcp_world_size
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            profile=profile,
            events_use_int_hashes=events_use_int_hashes,
        )
        groups = kv_cache_config.kv_cache_groups
        self.scheduler_block_size = scheduler_block_size or (
            groups[0].kv_cache_spec.block_size if groups else hash_block_size
        )
        in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            manager_class_for(group.kv_cache_spec)(
                group.kv_cache_spec,
                self.block_pool,
                enable_caching,
                group_id,
                self.scheduler_block_size,
                dcp_world_size,
                pcp_world_size,
                max_admission_blocks_per_request(group.kv_cache_spec, in_flight, max_model_len),
            )
            for group_id, group in enumerate(groups)
        )
        self._is_cross = tuple(
            isinstance(m, CrossAttentionManager) for m in self.single_type_managers
        )
        self._any_cross = any(self._is_cross)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: BlocksPerGroup,
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        total = 0
        for i, manager in enumerate(self.single_type_managers):
            if self._is_cross[i]:
                # One static allocation for the encoder tokens.
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens,
                    apply_admission_cap,
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model, apply_admission_cap,
                    prefill_end,
                )
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: BlocksPerGroup,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        managers = self.single_type_managers
        if any(request_id in m.num_cached_block for m in managers):
            # Running requests get no new hits: nothing to adopt.
            return
        if self.profile.external_blocks_order is ExternalBlocksOrder.AFTER_ALL_HITS:
            # Touch every group's hits before any group allocates external
            # blocks, so one group's allocation cannot evict another's hit.
            for i, manager in enumerate(managers):
                manager.add_local_computed_blocks(
                    request_id, new_computed_blocks[i], num_local_computed_tokens,
                    num_external_computed_tokens,
                )
            if num_external_computed_tokens > 0:
                for manager in managers:
                    manager.allocate_external_computed_blocks(
                        request_id, num_local_computed_tokens, num_external_computed_tokens
                    )
            return
        for i, manager in enumerate(managers):
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens,
                num_external_computed_tokens,
            )
            if num_external_computed_tokens > 0:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int,
        num_encoder_tokens: int = 0,
    ) -> tuple[list[KVCacheBlock], ...]:
        if not self._any_cross:
            return tuple(
                m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
                for m in self.single_type_managers
            )
        return tuple(
            m.allocate_new_blocks(
                request_id, num_encoder_tokens if cross else num_tokens, num_tokens_main_model
            )
            for m, cross in zip(self.single_type_managers, self._is_cross)
        )

    def get_num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        """The prefix of the computed tokens this group may cache."""
        return num_computed_tokens

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for group_id, manager in enumerate(self.single_type_managers):
            if manager.enable_caching:
                manager.cache_blocks(
                    request, self.get_num_cacheable_tokens(num_computed_tokens, group_id)
                )

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers
        )

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        pending: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        for manager in self.single_type_managers:
            pending.extend(manager.take_pending_cow_copies())
        return pending

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, False, hash_block_size, **kwargs)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in self.single_type_managers), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One KV cache group; hits are whole blocks of that group."""

    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 enable_caching: bool, hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, enable_caching, hash_block_size,
                         **kwargs)
        (manager,) = self.single_type_managers
        self.manager = manager
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.block_size = manager.block_size
        if enable_caching and hash_block_size != self.block_size:
            raise ValueError(
                f"a single group needs hash_block_size ({hash_block_size}) == "
                f"block_size ({self.block_size})"
            )

    # One group: call its manager directly instead of fanning out (hot path).

    def get_num_blocks_to_allocate(
        self, request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
        total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
        apply_admission_cap=False, prefill_end=0,
    ) -> int:
        if self._any_cross:
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
                apply_admission_cap, prefill_end,
            )
        return self.manager.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[0], total_computed_tokens,
            num_local_computed_tokens, num_tokens_main_model, apply_admission_cap,
            prefill_end,
        )

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model,
                            num_encoder_tokens=0):
        if self._any_cross:
            return (self.manager.allocate_new_blocks(
                request_id, num_encoder_tokens, num_tokens_main_model),)
        return (self.manager.allocate_new_blocks(request_id, num_tokens,
                                                 num_tokens_main_model),)

    def cache_blocks(self, request, num_computed_tokens) -> None:
        if self.manager.enable_caching:
            self.manager.cache_blocks(request, num_computed_tokens)

    def remove_skipped_blocks(self, request_id, num_computed_tokens,
                              num_prompt_tokens=None) -> None:
        self.manager.remove_skipped_blocks(request_id, num_computed_tokens,
                                           num_prompt_tokens)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        manager = self.manager
        return manager.find_longest_cache_hit(
            block_hashes,
            max_cache_hit_length,
            (0,),
            self.block_pool,
            self.kv_cache_spec,
            self.block_size,
            self.block_size,
            manager.dcp_world_size,
        )


@dataclass(slots=True)
class SpecGroup:
    """Groups with equal specs, looked up together in one pass."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]


def partial_hash_hits_enabled(
    specs: Sequence[KVCacheSpec],
    manager_classes: Sequence[type[SingleTypeKVCacheManager]],
    hash_block_size: int,
    dcp_world_size: int,
) -> bool:
    """Whether hits may end inside blocks: a Mamba "align" group with blocks
    larger than the hash block, and every other cacheable group able to look
    up at hash granularity (or already at it)."""
    if not any(
        isinstance(s, MambaSpec) and s.mamba_cache_mode == "align" and (
            s.block_size > hash_block_size if dcp_world_size == 1
            else s.block_size >= hash_block_size
        )
        for s in specs
    ):
        return False
    for spec, cls in zip(specs, manager_classes):
        dcp_block = spec.block_size * (dcp_world_size if spec.dcp_sharded else 1)
        if (spec.prefix_cacheable and not cls.supports_fine_grained_hash_lookup
                and dcp_block != hash_block_size):
            return False
    return True


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, kv_cache_config: KVCacheConfig, profile: VersionProfile,
                 enable_caching: bool, hash_block_size: int, **kwargs) -> None:
        super().__init__(kv_cache_config, profile, enable_caching, hash_block_size,
                         **kwargs)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        for spec, manager in zip(specs, self.single_type_managers):
            if spec.prefix_cacheable and manager.block_size % hash_block_size:
                raise ValueError(
                    f"every group's block size must be a multiple of hash_block_size "
                    f"({hash_block_size}); got {manager.block_size}"
                )
        self.enable_partial_hash_hits = profile.partial_block_hits and (
            partial_hash_hits_enabled(
                specs, [type(m) for m in self.single_type_managers], hash_block_size,
                self.dcp_world_size,
            )
        )
        self.alignment_tokens = (
            hash_block_size if self.enable_partial_hash_hits else self.scheduler_block_size
        )
        for manager in self.single_type_managers:
            manager.cache_hit_alignment_tokens = self.alignment_tokens
        self.attention_groups = self._split_into_spec_groups(specs)

    def _split_into_spec_groups(self, specs: list[KVCacheSpec]) -> list[SpecGroup]:
        groups: list[SpecGroup] = []
        for i, spec in enumerate(specs):
            if not spec.prefix_cacheable:
                continue
            cls = type(self.single_type_managers[i])
            for group in groups:
                if group.spec == spec and group.manager_cls is cls:
                    group.group_ids.append(i)
                    break
            else:
                groups.append(SpecGroup(spec, [i], cls))
        # Full attention first: its left-to-right scan bounds the others.
        groups.sort(key=lambda g: not isinstance(g.spec, FullAttentionSpec))
        return groups

    def get_num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        # Hits land on aligned boundaries only, so caching beyond the last one
        # would be wasted (0.32).
        if self.enable_partial_hash_hits or not self.profile.hybrid_caches_scheduler_aligned:
            return num_computed_tokens
        return num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        num_groups = len(self.single_type_managers)
        hit_length = max_cache_hit_length
        hit_blocks: list[list[KVCacheBlock] | None] = [None] * num_groups
        hit_lengths = [0] * num_groups
        # One full-attention kind plus one other converge in one pass.
        simple = len(self.attention_groups) == 2 and isinstance(
            self.attention_groups[0].spec, FullAttentionSpec
        )
        managers = self.single_type_managers
        while True:
            curr = hit_length
            for group in self.attention_groups:
                first = group.group_ids[0]
                manager = managers[first]
                if isinstance(group.spec, FullAttentionSpec) and hit_blocks[first] is not None:
                    # Full attention is downward-closed: trim, do not look up again.
                    curr = min(curr, hit_lengths[first])
                    continue
                blocks, curr = group.manager_cls.find_longest_cache_hit(
                    block_hashes, curr, group.group_ids, self.block_pool, group.spec,
                    self.alignment_tokens, manager.block_size, manager.dcp_world_size,
                )
                for group_id, group_blocks in zip(group.group_ids, blocks):
                    hit_blocks[group_id] = group_blocks
                    hit_lengths[group_id] = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for group in self.attention_groups:
            if not isinstance(group.spec, FullAttentionSpec):
                continue
            num_blocks = cdiv(hit_length, managers[group.group_ids[0]].block_size)
            for group_id in group.group_ids:
                if hit_blocks[group_id] is not None:
                    del hit_blocks[group_id][num_blocks:]
        return tuple(b if b is not None else [] for b in hit_blocks), hit_length


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    profile: VersionProfile,
    enable_caching: bool,
    hash_block_size: int,
    **kwargs,
) -> KVCacheCoordinator:
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, profile, hash_block_size, **kwargs
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, profile, enable_caching, hash_block_size, **kwargs
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, profile, enable_caching, hash_block_size, **kwargs
    )
