"""The part of a request the KV cache manager reads (vLLM's v1 Request, trimmed)."""

from dataclasses import dataclass, field
from enum import Enum


class RequestStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    # Admitted, its KV cache being loaded by a connector.
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    # Ended: what HiSparse may still publish of it depends on it (spec §14.4).
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_IGNORED = "finished_ignored"
    FINISHED_ERROR = "finished_error"
    FINISHED_REPETITION = "finished_repetition"


@dataclass(frozen=True, slots=True)
class LoRA:
    name: str
    int_id: int
    path: str = ""


@dataclass(frozen=True, slots=True)
class MMFeature:
    """A multimodal item in the prompt: what it is and the tokens it fills."""

    identifier: str
    offset: int
    length: int


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    lora: LoRA | None = None
    cache_salt: str | None = None
    # Sorted by offset and disjoint, as vLLM's hashing assumes.
    mm_features: tuple[MMFeature, ...] = ()
    # Prompt embeddings as raw bytes, `embeds_row_bytes` per token; the token
    # ids of such a prompt are placeholders.
    prompt_embeds: bytes | None = None
    embeds_row_bytes: int = 0
    skip_reading_prefix_cache: bool = False
    session_id: str | None = None
    # "full": the KV events also re-announce the blocks a hit reuses (vLLM
    # reads it from the sampling params' extra arguments); else "incremental".
    kv_cache_report_mode: str = "incremental"
    num_computed_tokens: int = 0
    # Scheduled tokens whose output is not in yet (async scheduling): their
    # step may still read blocks the computed count says are behind a window.
    num_in_flight_tokens: int = 0
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # Where this request's prefix stops being shared with cached siblings
    # (the lookup's third answer, stored by the scheduler); 0: none known.
    shared_prefix_boundary: int = 0
    # One chained hash per full hash block of all_token_ids.
    block_hashes: list = field(default_factory=list)
    # Digest of the embedding rows of a block, by (start, end), computed once.
    embeds_digests: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def is_finished(self) -> bool:
        return self.status.name.startswith("FINISHED")
