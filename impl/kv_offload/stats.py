"""One get_stats() snapshot of the CPU tier."""

import dataclasses


@dataclasses.dataclass(slots=True)
class OffloadStats:
    usage: float
    write_usage: float
    read_usage: float
    allocation_sizes: list[int] = dataclasses.field(default_factory=list)
    # None when no store threshold is set (the counter is not reported then).
    stores_skipped: int | None = None
