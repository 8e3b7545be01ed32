"""swap_blocks: move whole blocks between two caches, typically GPU <-> host
(vLLM: cache_ops.swap_blocks, used to swap out preempted requests and by KV
offloading).

This is not a Triton kernel on purpose: a Triton program cannot address host
memory, and vLLM itself issues one copy-engine transfer per block. Blocks are
gathered on the source device, moved in one transfer (asynchronously from
pinned host memory), and scattered on the destination.
"""

from __future__ import annotations

import torch


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy src[s] to dst[d] for every (s, d) row of block_mapping [n, 2].

    src and dst are caches of the same layout and element type with blocks on
    dim 0 (a layer's key or value view, or a block-contiguous raw view); they
    may live on different devices.
    """
    if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
        raise ValueError(f"cannot swap {src.dtype}{tuple(src.shape)} blocks into "
                         f"{dst.dtype}{tuple(dst.shape)}")
    if block_mapping.numel() == 0:
        return
    if src.dtype.itemsize == 1 and src.dtype.is_floating_point:
        # index_select/index_copy_ have no fp8 kernels; the bytes are the same.
        src, dst = src.view(torch.uint8), dst.view(torch.uint8)
    mapping = block_mapping.to(torch.int64).cpu()
    dsts = mapping[:, 1]
    if dsts.unique().numel() != dsts.numel():
        raise ValueError("destination blocks must be distinct")
    src_ids = mapping[:, 0].to(src.device)
    dst_ids = dsts.to(dst.device)
    moved = src.index_select(0, src_ids)
    non_blocking = moved.device.type == "cpu" and dst.device.type == "cuda"
    if non_blocking:
        moved = moved.pin_memory()
    dst.index_copy_(0, dst_ids, moved.to(dst.device, non_blocking=non_blocking))
