"""Version profiles: every behaviour of vLLM's KV cache that differs between releases.

A profile is data, not code. The impl and the vLLM adapter read its fields; nobody
writes `if version == ...` anywhere else. To support a new vLLM release, add a
profile here (and its row in specs/PROFILES.md) after checking each field against
that release's source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FreeOrder(str, Enum):
    """Where blocks released by `free_blocks` re-enter the free queue.

    Callers pass blocks in eviction-priority order (a request's blocks reversed,
    so its tail is evicted first).
    """

    # 0.17: every released block is appended to the tail (LRU end).
    APPEND_ALL = "append_all"
    # 0.32: released blocks without a hash (or all, with caching off) are
    # prepended to the head so they are reused first (LIFO, GPU locality);
    # hashed blocks are appended (FIFO, so the cache evicts in LRU order).
    UNHASHED_FIRST = "unhashed_first"


class NoneHashSeed(str, Enum):
    """How the parent hash of a request's first block (NONE_HASH) is seeded."""

    # 0.17: hash_fn(PYTHONHASHSEED) if set, else 32 random bytes.
    SEED_OR_RANDOM = "seed_or_random"
    # 0.32: hash_fn(PYTHONHASHSEED) if set, else hash_fn("vllm-none-hash") for the
    # cryptographic algorithms and a random seed for xxhash ones.
    SEED_OR_FIXED_FOR_CRYPTO = "seed_or_fixed_for_crypto"


class StatsRecordedAt(str, Enum):
    """When a prefix-cache lookup is counted in PrefixCacheStats."""

    # 0.17: inside get_computed_blocks, so a lookup whose allocation fails counts.
    LOOKUP = "lookup"
    # 0.32: the scheduler calls record_prefix_cache_stats once the request is
    # admitted (allocation succeeded); get_computed_blocks records nothing.
    ADMISSION = "admission"


@dataclass(frozen=True, slots=True)
class VersionProfile:
    name: str
    # Exact releases whose source this profile was checked against.
    checked_against: tuple[str, ...]
    free_order: FreeOrder
    none_hash_seed: NoneHashSeed
    # Extra hash keys as ("lora", name, path), ("mm", id, offset),
    # ("cache_salt", salt), ("prompt_embeds", digest) (0.32) instead of the bare
    # lora name, mm identifier, salt and digest (0.17).
    tagged_extra_keys: bool
    stats_recorded_at: StatsRecordedAt
    # BlockStored carries group_idx, kv_cache_spec_kind, sliding window and
    # session_id; BlockRemoved carries group_idx (0.32, not 0.17).
    kv_events_carry_group: bool
    # allocate_slots takes num_new_tokens == 0 when only prefix-hit tokens are
    # adopted (0.32); 0.17 raises unless external tokens are adopted.
    allocate_adopts_hit_without_new_tokens: bool
    # allocate_slots' admission controls: full_sequence_must_fit, reserved_blocks
    # and the watermark (0.32; 0.17 has none of them).
    has_admission_controls: bool
    # vLLM API shape, read only by the vLLM adapter.
    get_computed_blocks_arity: int
    manager_takes_scheduler_block_size: bool


PROFILES: dict[str, VersionProfile] = {
    "0.17": VersionProfile(
        name="0.17",
        checked_against=("0.17.1",),
        free_order=FreeOrder.APPEND_ALL,
        none_hash_seed=NoneHashSeed.SEED_OR_RANDOM,
        tagged_extra_keys=False,
        stats_recorded_at=StatsRecordedAt.LOOKUP,
        kv_events_carry_group=False,
        allocate_adopts_hit_without_new_tokens=False,
        has_admission_controls=False,
        get_computed_blocks_arity=2,
        manager_takes_scheduler_block_size=False,
    ),
    "0.32": VersionProfile(
        name="0.32",
        checked_against=("0.32.0",),
        free_order=FreeOrder.UNHASHED_FIRST,
        none_hash_seed=NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO,
        tagged_extra_keys=True,
        stats_recorded_at=StatsRecordedAt.ADMISSION,
        kv_events_carry_group=True,
        allocate_adopts_hit_without_new_tokens=True,
        has_admission_controls=True,
        get_computed_blocks_arity=3,
        manager_takes_scheduler_block_size=True,
    ),
}


class UnsupportedVersion(ValueError):
    """A vLLM version with no profile."""


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:[.+\-].*)?$")


def profile_key(version: str) -> str:
    """'0.32.0', '0.32.0+cpu', 'v0.32' -> '0.32'. Patch releases share a profile."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise UnsupportedVersion(f"'{version}' is not a vLLM version")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def get_profile(version: str) -> VersionProfile:
    key = profile_key(version)
    try:
        return PROFILES[key]
    except KeyError:
        supported = ", ".join(sorted(PROFILES))
        raise UnsupportedVersion(
            f"vLLM {version} has no profile (supported: {supported})"
        ) from None
