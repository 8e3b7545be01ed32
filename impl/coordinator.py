"""Coordinators: fan one request's KV cache calls out to every group's manager.

vLLM: KVCacheCoordinator and its subclasses. All groups share one block pool.
The unitary coordinator serves models with a single KV cache group; the
no-prefix-cache one serves any number of groups when caching is off.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheConfig
from impl.managers import manager_class_for
from impl.profiles import VersionProfile
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
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            profile,
            enable_kv_cache_events=enable_kv_cache_events,
            events_use_int_hashes=events_use_int_hashes,
        )
        self.single_type_managers = tuple(
            manager_class_for(group.kv_cache_spec)(
                group.kv_cache_spec,
                self.block_pool,
                enable_caching,
                group_id,
                dcp_world_size=dcp_world_size,
            )
            for group_id, group in enumerate(kv_cache_config.kv_cache_groups)
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: BlocksPerGroup,
        total_computed_tokens: int,
    ) -> int:
        return sum(
            manager.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks[i], total_computed_tokens
            )
            for i, manager in enumerate(self.single_type_managers)
        )

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
        # Touch every group's hits before any group allocates external blocks,
        # so one group's allocation cannot evict another group's hit.
        for i, manager in enumerate(managers):
            manager.add_local_computed_blocks(
                request_id,
                new_computed_blocks[i],
                num_local_computed_tokens,
                num_external_computed_tokens,
            )
        if num_external_computed_tokens > 0:
            for manager in managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens)
            for m in self.single_type_managers
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            if manager.enable_caching:
                manager.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers
        )

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
        self, request_id, num_tokens, new_computed_blocks, total_computed_tokens
    ) -> int:
        return self.manager.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[0], total_computed_tokens
        )

    def allocate_new_blocks(self, request_id, num_tokens):
        return (self.manager.allocate_new_blocks(request_id, num_tokens),)

    def cache_blocks(self, request, num_computed_tokens) -> None:
        self.manager.cache_blocks(request, num_computed_tokens)

    def remove_skipped_blocks(self, request_id, num_computed_tokens) -> None:
        self.manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return self.manager.find_longest_cache_hit(
            block_hashes,
            max_cache_hit_length,
            (0,),
            self.block_pool,
            self.kv_cache_spec,
            alignment_tokens=self.block_size,
            dcp_world_size=self.manager.dcp_world_size,
        )


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
    raise NotImplementedError("the hybrid coordinator (several groups) is not implemented yet")
