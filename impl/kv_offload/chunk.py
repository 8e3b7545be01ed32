"""One slot of the CPU buffer and who uses it."""

# ref_cnt while the slot's store is still in flight: not readable yet.
STORING = -1


class Chunk:
    """`chunk_id` is the slot; `ref_cnt` is STORING, 0 (stored, idle, evictable)
    or the number of loads reading it (pinned)."""

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = STORING

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"Chunk(id={self.chunk_id}, ref_cnt={self.ref_cnt})"
