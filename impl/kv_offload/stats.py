"""One get_stats() snapshot of the CPU tier."""

from dataclasses import field, dataclass


@dataclass(slots=True)
class OffloadStats:
    usage: float
    write_usage: float
    read_usage: float
    allocation_sizes: list[int] = field(default_factory=list)
    # None when no store threshold is set (the counter is not reported then).
    stores_skipped: int | None = None
