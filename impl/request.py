"""The request as the KV cache manager sees it (vLLM: v1 Request, KV-relevant part)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RequestStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"


@dataclass(frozen=True, slots=True)
class LoRA:
    name: str
    int_id: int
    path: str = ""


@dataclass(frozen=True, slots=True)
class MMFeature:
    """A multimodal placeholder: its content identifier and token range."""

    identifier: str
    offset: int
    length: int


@dataclass(slots=True)
class Request:
    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    lora: LoRA | None = None
    cache_salt: str | None = None
    # Sorted by offset, non-overlapping (vLLM assumes the same).
    mm_features: tuple[MMFeature, ...] = ()
    # Raw bytes of the prompt embeddings, `embeds_row_bytes` bytes per token.
    prompt_embeds: bytes | None = None
    embeds_row_bytes: int = 0
    skip_reading_prefix_cache: bool = False
    session_id: str | None = None
    num_computed_tokens: int = 0
    # Tokens scheduled whose output is not processed yet (async scheduling).
    num_in_flight_tokens: int = 0
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # Hashes of the full hash-size blocks of all_token_ids, chained.
    block_hashes: list = None  # type: ignore[assignment]
    # Cache of per-block prompt-embeds digests, keyed by (start, end).
    embeds_digests: dict = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.block_hashes is None:
            self.block_hashes = []
        if self.embeds_digests is None:
            self.embeds_digests = {}

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)
