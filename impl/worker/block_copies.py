"""Copy-on-write copies of whole blocks in the KV tensors
(specs/WORKER_BLOCK_TABLE.md, "Block copies").

A KV tensor's first dimension counts kernel blocks: num_blocks manager blocks
of k kernel blocks each. A pair (src, dst) copies every kernel block of
manager block src over those of dst; all pairs read the blocks as they were
before any pair was applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def copy_kv_cache_blocks_inplace(kv_caches: Iterable[torch.Tensor], num_blocks: int,
                                 copies: Sequence[tuple[int, int]]) -> None:
    if not copies:
        return
    pairs = torch.tensor([list(p) for p in copies], dtype=torch.int64)
    done: set[tuple[str, int]] = set()
    for cache in kv_caches:
        # Layers that share one KV tensor are copied once.
        key = (str(cache.device), cache.data_ptr())
        if key in done:
            continue
        done.add(key)
        per_block, rest = divmod(cache.shape[0], num_blocks)
        if rest:
            raise ValueError(f"a KV tensor of {cache.shape[0]} kernel blocks does not hold "
                             f"{num_blocks} blocks")
        src, dst = pairs.to(cache.device).unbind(1)
        blocks = cache.unflatten(0, (num_blocks, per_block))
        blocks[dst] = blocks[src].clone()  # read every source before writing
