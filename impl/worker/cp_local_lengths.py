"""How many of a sequence's tokens each decode context-parallel rank holds
(specs/WORKER_BLOCK_TABLE.md, "Per-rank lengths").

Under the slot mapping's round robin, position p lives on rank (p // I) % W:
a sequence of L tokens leaves every rank whole rounds of I tokens, and the
tokens of the last, unfinished round go to the ranks in order.
"""

from __future__ import annotations

import numpy as np


def dcp_local_seq_lens(seq_lens, world_size: int = 1, rank: int | None = None,
                       interleave: int = 1) -> np.ndarray:
    """int32: the tokens of each length that rank `rank` stores; with no
    rank, a last axis of `world_size` entries, one per rank."""
    if world_size < 1 or interleave < 1:
        raise ValueError(f"a world of {world_size} ranks with an interleave of {interleave}")
    lens = np.asarray(seq_lens, dtype=np.int64)
    round_tokens = world_size * interleave
    whole = (lens // round_tokens) * interleave  # every rank's share of whole rounds
    left = lens - whole * world_size  # the unfinished round's tokens
    if rank is None:
        ranks = np.arange(world_size, dtype=np.int64)
        whole, left = whole[..., None], left[..., None]
    else:
        if not 0 <= int(rank) < world_size:
            raise ValueError(f"rank {rank} is not a rank of a world of {world_size}")
        ranks = np.int64(rank)
    return (whole + np.clip(left - ranks * interleave, 0, interleave)).astype(np.int32)


def skips_context_attention(context_lens) -> bool:
    """Whether a batch can leave out attention over cached context on every
    rank: only when no request has any context. Decided from the global
    lengths, never a rank's share: a rank holding none of a request's
    context still joins the ranks' exchange."""
    lens = np.asarray(context_lens)
    return not lens.size or int(lens.max()) == 0
