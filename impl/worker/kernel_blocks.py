"""Manager blocks as the attention backend's kernel blocks
(specs/WORKER_BLOCK_TABLE.md, "Kernel blocks").

A backend that needs blocks of K tokens, smaller than the manager's B, reads
each manager block b as the k = B / K kernel blocks b * s + j, j < k (s = k,
or the stride of a packed cache whose other layers sit between blocks).
"""

from __future__ import annotations

import numpy as np


def kernel_blocks_per_block(block_size: int, kernel_block_size: int) -> int:
    if kernel_block_size <= 0 or block_size % kernel_block_size:
        raise ValueError(f"{block_size}-token blocks do not split into "
                         f"{kernel_block_size}-token kernel blocks")
    return block_size // kernel_block_size


def kernel_block_table(table: np.ndarray, block_size: int, kernel_block_size: int,
                       stride: int = 0) -> np.ndarray:
    """int32 [rows, width * k]: every entry of `table` expanded to its k
    kernel blocks, in order."""
    k = kernel_blocks_per_block(block_size, kernel_block_size)
    step = stride or k
    # One int32 buffer, filled in place: rows run to thousands of entries.
    out = np.empty((table.shape[0], table.shape[1], k), dtype=np.int32)
    np.multiply(table[:, :, None], step, out=out, casting="unsafe")
    out += np.arange(k, dtype=np.int32)
    return out.reshape(table.shape[0], table.shape[1] * k)
