"""KV cache events and how the pool's changes become them; specs/KV_CACHE_MANAGER.md §7.

The event classes keep the names and fields of vLLM's published events
(vllm.distributed.kv_events), which consumers outside vLLM parse.
"""

from dataclasses import dataclass
from typing import Any

from impl.block_hash import (
    block_extra_keys,
    event_extra_keys,
    external_block_hash,
    get_block_hash,
    get_group_id,
)
from impl.profiles import MMExtraKey, VersionProfile
from impl.request import Request

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # HiSparse's host pool


@dataclass(slots=True)
class BlockStored:
    block_hashes: list
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    session_id: str | None = None
    # Per stored block, the tokens after it its hash covers (lookahead hashing).
    lookahead_token_ids: list | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list
    medium: str | None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBuilder:
    """Turns what the pool did into events, in the shape the profile's vLLM
    publishes (int or byte hashes, group fields or not, tagged extra keys)."""

    __slots__ = ("as_int", "with_group", "with_session", "tagged", "mm_offset", "lookahead",
                 "medium")

    def __init__(self, profile: VersionProfile, as_int: bool, lookahead: int = 0,
                 medium: str = MEDIUM_GPU) -> None:
        self.as_int = as_int
        # Tokens after a block its hash (and so its event's extra keys) covers.
        self.lookahead = lookahead
        fields = profile.kv_event_fields
        self.with_group = fields.carries_group
        self.with_session = fields.carries_session
        self.tagged = profile.tagged_extra_keys
        self.mm_offset = profile.mm_extra_key is MMExtraKey.IDENTIFIER_OFFSET
        # Where the pool keeps its blocks, as events name it.
        self.medium = medium

    def removed(self, key: bytes) -> BlockRemoved:
        return BlockRemoved(
            [external_block_hash(get_block_hash(key), self.as_int)], self.medium,
            get_group_id(key) if self.with_group else None,
        )

    def stored(self, request: Request, hashes: list, parent, start: int, end: int,
               block_size: int, group_id: int, key_ranges: list[tuple[int, int]]
               ) -> BlockStored:
        """`hashes` newly findable, covering tokens [start, end); the extra
        keys of each stored block are read over its range in `key_ranges`."""
        as_int = self.as_int
        lora = request.lora
        tagged, mm_offset, ahead = self.tagged, self.mm_offset, self.lookahead
        # One walk over the multimodal items from the first stored block.
        first = key_ranges[0][0] if key_ranges else 0
        extras = [event_extra_keys(block_extra_keys(request, a, b + ahead, tagged, mm_offset,
                                                    first), tagged)
                  for a, b in key_ranges]
        tokens = request.all_token_ids
        lookahead = [tokens[b:b + ahead] for _, b in key_ranges] if ahead else None
        return BlockStored(
            block_hashes=[external_block_hash(h, as_int) for h in hashes],
            parent_block_hash=None if parent is None else external_block_hash(parent, as_int),
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=None if lora is None else lora.int_id,
            medium=self.medium,
            lora_name=None if lora is None else lora.name,
            # No list at all when no block was stored, as vLLM publishes it.
            extra_keys=extras or None,
            group_idx=group_id if self.with_group else None,
            session_id=request.session_id if self.with_session else None,
            lookahead_token_ids=lookahead,
        )
