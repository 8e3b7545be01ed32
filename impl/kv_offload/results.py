"""The manager's answers: a lookup's verdict, a store's plan, an event."""

import dataclasses
import enum


class LookupResult(enum.Enum):
    MISS = "miss"
    HIT = "hit"
    # Held, but its store is still in flight.
    HIT_PENDING = "hit_pending"
    # Ask again later (tiers with remote lookups; the CPU tier never says it).
    RETRY = "retry"


class OffloadPolicy(enum.Enum):
    # Store only blocks this request computed (not its prefix hits).
    CHUNK_LEVEL = "chunk"
    # Store every block of the request.
    REQUEST_LEVEL = "request"


@dataclasses.dataclass(slots=True)
class RequestOffloadingContext:
    policy: OffloadPolicy


@dataclasses.dataclass(slots=True)
class StorePlan:
    """prepare_store's answer: the keys to write, their slots (same order),
    and the keys evicted to make room (eviction order)."""

    keys_to_store: list[bytes] = dataclasses.field(default_factory=list)
    chunk_ids: list[int] = dataclasses.field(default_factory=list)
    evicted_keys: list[bytes] = dataclasses.field(default_factory=list)


MEDIUM_CPU = "CPU"
# The tier a CPU hit is counted under (get_load_source).
HIT_SOURCE_HOST = "host"


@dataclasses.dataclass(slots=True)
class OffloadEvent:
    keys: list[bytes]
    removed: bool
    medium: str = MEDIUM_CPU
    # A removal that frees the tier's record only (a failed store, 0.33): the
    # keys never were readable, so no eviction is announced to consumers.
    metadata_only: bool = False
