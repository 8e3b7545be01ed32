"""Sparse prefix-cache checkpoints of sliding-window and Mamba groups; spec §9.2.1, §10.

Such groups need only a few blocks (a window's tail, one state) to serve a
hit at a boundary, so they may keep checkpoints sparsely. The interval says
which boundaries stay: None every reachable one, 0 only the ones a later
request is known to resume at (replay boundaries, shared-prefix junctions),
a positive multiple of the scheduler block size one per interval as well.
"""

from collections.abc import Sequence

from impl.kv_cache_spec import KVCacheSpec, MambaSpec, SlidingWindowSpec


def validate_retention_interval(interval: int | None, scheduler_block_size: int,
                                specs: Sequence[KVCacheSpec]) -> None:
    """ValueError for an interval vLLM refuses when it builds the coordinator."""
    if interval is None:
        return
    if not any(isinstance(spec, (SlidingWindowSpec, MambaSpec)) for spec in specs):
        if interval == 0:
            return
        raise ValueError(
            f"prefix_cache_retention_interval={interval}: the model has no sliding-window "
            "or Mamba group for it to thin out (only 0 or None apply)")
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(
            f"prefix_cache_retention_interval={interval} must be non-negative and a "
            f"multiple of scheduler_block_size ({scheduler_block_size})")


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int,
                      use_eagle: bool) -> tuple[int, ...]:
    """Where a later request replaying this prompt can resume: a resend stops
    one token short of the prompt; with EAGLE a resend and a longer sibling
    land on different scheduler blocks, each one block back (the dropped
    block), so both are kept."""
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    unit = scheduler_block_size
    resend = (num_prompt_tokens - 1) // unit * unit - unit
    longer = num_prompt_tokens // unit * unit - unit
    return tuple(sorted({resend if resend > 0 else 0, longer if longer > 0 else 0}))
