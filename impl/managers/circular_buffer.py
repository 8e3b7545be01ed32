"""Circular buffer (vLLM's name: CircularBufferManager); specs/KV_CACHE_MANAGER.md §9.8.

The K-pool tail of compressed sparse attention keeps the raw keys of the
token group still being compressed in a ring of `block_size` rows, written
round and round. However long the request, the ring is one block, taken at
its first allocation and held until it is freed. Nothing in it outlives its
request, so nothing is keyed, hit, skipped or zeroed: most calls do nothing,
whatever they are told (hence the ignored arguments).
"""

from impl.managers.base import BlockTable, HitResult, SingleTypeKVCacheManager


class CircularBufferManager(SingleTypeKVCacheManager):
    def __init__(self, *args, needs_kv_cache_zeroing: bool = False, **kwargs) -> None:
        # (Zeroing does not apply: a ring is only read where its request wrote.)
        super().__init__(*args, **kwargs)

    def _take_ring(self, request_id: str) -> BlockTable:
        """The request's ring, on its first call only (else nothing new)."""
        table = self.req_to_blocks.setdefault(request_id, [])
        if table:
            return []
        ring = self.block_pool.get_new_blocks(1)
        table += ring
        return ring

    def get_num_blocks_to_allocate(self, request_id: str, *_ignored, **_also) -> int:
        holds = self.req_to_blocks.get(request_id)
        return 0 if holds else 1

    def allocate_new_blocks(self, request_id: str, *_ignored, **_also) -> BlockTable:
        return self._take_ring(request_id)

    def allocate_external_computed_blocks(self, request_id: str, *_ignored, **_also) -> None:
        self._take_ring(request_id)

    def add_local_computed_blocks(self, *_ignored, **_also) -> None:
        """A hit in other groups brings nothing to the ring."""

    def cache_blocks(self, *_ignored, replay_boundaries=(), **_also) -> None:
        """Never keyed (whatever a replay would need: the ring is not kept)."""

    def remove_skipped_blocks(self, *_ignored, **_also) -> None:
        """The ring is read until the request ends."""

    @property
    def records_new_block_ids(self) -> bool:  # for zeroing: never
        return False

    def take_new_block_ids(self) -> list[int]:  # nothing recorded, ever
        return []

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids,
                               *_ignored, **_also) -> HitResult:
        nothing = tuple([] for _ in kv_cache_group_ids)
        return nothing, 0
