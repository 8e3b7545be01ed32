"""What the manager asks of a replacement policy. A policy holds the chunks
by key and decides evictions; the manager owns ref counts and slots."""

from collections.abc import Iterable, Sequence

from impl.kv_offload.chunk import Chunk


def prefix_order(key_groups: Sequence[Sequence[bytes]], ctx) -> list[bytes]:
    """All groups' keys joined; sorted by end-token position (stable) when the
    context knows every key's position, else left in the given order."""
    joined = [key for group in key_groups for key in group]
    where = {}
    for key in joined:
        pos = ctx.get_offload_key_position(key)
        if pos is None:
            return joined
        where[key] = pos
    joined.sort(key=where.__getitem__)
    return joined


class CachePolicy:
    """The protocol, with the defaults a policy may keep."""

    def __init__(self, cache_capacity: int):
        self.cache_capacity = cache_capacity

    def get(self, key: bytes) -> Chunk | None:
        raise NotImplementedError

    def insert(self, key: bytes, chunk: Chunk, req_context) -> None:
        raise NotImplementedError

    def remove(self, key: bytes) -> None:
        raise NotImplementedError

    def touch(self, keys: Iterable[bytes], req_context) -> None:
        raise NotImplementedError

    def on_store_miss(self, keys: Iterable[bytes], req_context) -> None:
        # A policy without its own notion of a miss sees it as a use.
        self.touch(keys, req_context)

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys,
                            req_context) -> None:
        for keys in key_groups:
            self.touch(keys, req_context)

    def on_request_access(self, keys: Iterable[bytes], req_context) -> None:
        # Keys a running request sees for the first time (0.33's managers say
        # so); a policy that ranks only at the end ignores them.
        return

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def mark_evictable(self, key: bytes) -> None:
        return

    def mark_non_evictable(self, key: bytes) -> None:
        return
