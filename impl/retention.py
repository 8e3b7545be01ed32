"""Sparse prefix-cache checkpoints of sliding-window and Mamba groups; spec §9.2.1, §10.

Such groups need only a few blocks (a window's tail, one state) to serve a
hit at a boundary, so they may keep checkpoints sparsely. The interval says
which boundaries stay: None every reachable one, 0 only the ones a later
request is known to resume at (replay boundaries, shared-prefix junctions),
a positive multiple of the scheduler block size one per interval as well.
"""

from collections.abc import Sequence

from impl.kv_cache_spec import KVCacheSpec, MambaSpec, SlidingWindowSpec
from impl.profiles import PrefixCacheRetention


def thinned_kinds(shape: PrefixCacheRetention) -> tuple[type, ...]:
    """The spec types a retention interval thins out (0.23-0.27: sliding
    windows only; the others key densely)."""
    if shape.thins_mamba:
        return (SlidingWindowSpec, MambaSpec)
    return (SlidingWindowSpec,)


def validate_retention_interval(interval: int | None, scheduler_block_size: int,
                                specs: Sequence[KVCacheSpec],
                                shape: PrefixCacheRetention = PrefixCacheRetention.KV_CACHE_CONFIG
                                ) -> None:
    """ValueError for an interval vLLM refuses when it builds the coordinator."""
    if interval is None:
        return
    if not any(isinstance(spec, thinned_kinds(shape)) for spec in specs):
        # (0.29+ let 0 through: it changes nothing then.)
        if interval == 0 and shape.in_kv_cache_config:
            return
        kinds = "sliding-window or Mamba" if shape.thins_mamba else "sliding-window"
        raise ValueError(
            f"prefix_cache_retention_interval={interval}: the model has no {kinds} group "
            "for it to thin out" + (" (only 0 or None apply)" if shape.in_kv_cache_config
                                    else ""))
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(
            f"prefix_cache_retention_interval={interval} must be non-negative and a "
            f"multiple of scheduler_block_size ({scheduler_block_size})")


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int,
                      use_eagle: bool,
                      shape: PrefixCacheRetention = PrefixCacheRetention.KV_CACHE_CONFIG
                      ) -> tuple[int, ...]:
    """Where a later request replaying this prompt can resume: a resend stops
    one token short of the prompt; with EAGLE a resend and a longer sibling
    land on different scheduler blocks, each one block back (the dropped
    block), so both are kept (0.30+; before, the resend's boundary alone,
    which a group's EAGLE shift moves)."""
    if not use_eagle or not shape.keeps_eagle_replay_boundaries:
        return (num_prompt_tokens - 1,)
    unit = scheduler_block_size
    resend = (num_prompt_tokens - 1) // unit * unit - unit
    longer = num_prompt_tokens // unit * unit - unit
    return tuple(sorted({resend if resend > 0 else 0, longer if longer > 0 else 0}))
