"""The offload tier behind one small protocol (specs/KV_OFFLOAD.md): impl's
CPU offload manager and vLLM's, driven by the same operations, answering plain
JSON data (keys as hex) so both sides compare with ==.

An operation is a tuple `(op, *args)`; requests are named by strings and each
backend keeps one request context per name. `run(op)` answers the operation;
an AssertionError or ValueError raised by the manager is answered as
{"raises": type name} (both managers refuse the same misuse).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

POLICIES = ("lru", "arc")


@dataclass(slots=True, frozen=True)
class OffloadConfig:
    num_chunks: int
    cache_policy: str = "lru"
    enable_events: bool = True
    store_threshold: int = 1
    max_tracker_size: int = 64_000


def key_of(block_hash: int, group: int) -> bytes:
    """The offload key of a small integer hash in a group (both sides use
    vLLM's layout: hash bytes, then the group as 4 big-endian bytes)."""
    return block_hash.to_bytes(8, "big") + group.to_bytes(4, "big")


def keys_hex(keys) -> list[str]:
    return [bytes(k).hex() for k in keys]


def event_json(keys, removed: bool, medium: str, metadata_only: bool) -> dict:
    """An offload event; metadata_only only where set (0.33's failed stores)."""
    out = {"keys": keys_hex(keys), "removed": removed, "medium": medium}
    if metadata_only:
        out["metadata_only"] = True
    return out


def stats_json(usage: float, write: float, read: float, sizes: list[int],
               skipped: int | None) -> dict:
    out = {"usage": round(usage, 9), "write_usage": round(write, 9),
           "read_usage": round(read, 9), "allocation_sizes": list(sizes)}
    if skipped is not None:
        out["stores_skipped"] = skipped
    return out


class OffloadBackend(ABC):
    name = "?"

    def __init__(self, config: OffloadConfig) -> None:
        self.config = config
        self.contexts: dict[str, Any] = {}

    def ctx(self, req: str):
        found = self.contexts.get(req)
        if found is None:
            found = self.contexts[req] = self.new_context(req)
        return found

    def run(self, op: tuple) -> Any:
        name, *args = op
        try:
            return getattr(self, f"op_{name}")(*args)
        except (AssertionError, ValueError) as e:
            return {"raises": type(e).__name__}

    # --- what each side implements ---

    @abstractmethod
    def new_context(self, req: str): ...

    @abstractmethod
    def op_new_request(self, req: str) -> Any: ...

    @abstractmethod
    def op_lookup(self, req: str, key: bytes) -> str: ...

    @abstractmethod
    def op_prepare_load(self, req: str, keys: list[bytes]) -> list[int]: ...

    @abstractmethod
    def op_touch(self, req: str, keys: list[bytes]) -> None: ...

    @abstractmethod
    def op_complete_load(self, req: str, keys: list[bytes]) -> None: ...

    @abstractmethod
    def op_prepare_store(self, req: str, keys: list[bytes]) -> dict | None: ...

    @abstractmethod
    def op_complete_store(self, req: str, keys: list[bytes], success: bool) -> None: ...

    @abstractmethod
    def op_finished(self, req: str) -> None: ...

    @abstractmethod
    def op_schedule_end(self, new: list[str], preempted: list[str]) -> None: ...

    @abstractmethod
    def op_take_events(self) -> list[dict]: ...

    @abstractmethod
    def op_reset(self) -> None: ...

    @abstractmethod
    def op_stats(self) -> dict: ...

    def op_position(self, req: str, key: bytes, end_token: int) -> None:
        self.ctx(req).set_offload_key_position(key, end_token)

    @abstractmethod
    def held(self) -> dict[bytes, tuple[int, int]]:
        """key -> (chunk_id, ref_cnt) of every chunk the policy holds."""
