"""vLLM's worker block tables (vllm.v1.worker.block_table), per-rank
context-parallel lengths and the worker's KV cache allocation
(vllm.v1.worker.utils.allocate_kv_cache) over impl/worker.

A table's arrays are impl's own: `block_table.np` is impl's int32 table, its
`cpu` and `gpu` tensors share that memory (the tests run on a CPU, where the
model runner's device copy is a copy of the same array), and
`num_blocks_per_row` is impl's count. A slot mapping is impl's, written into
the table's int64 slot buffer as vLLM's kernel does. An object's attribute
list (`dir`) is vLLM's public one, so a test comparing two tables field by
field compares impl's arrays.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.peer.lacks import require
from impl.worker import block_table as ibt
from impl.worker import cp_local_lengths as icp
from impl.worker import multi_group as img
from impl.worker import slot_mapping as ism


class _Buffer:
    """vLLM's CpuGpuBuffer over one impl array: equal when the contents are."""

    __slots__ = ("np", "cpu", "gpu")

    def __init__(self, array: np.ndarray) -> None:
        self.np = array
        self.cpu = torch.from_numpy(array)
        self.gpu = self.cpu

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        return self.gpu if n is None else self.gpu[:n]

    def __eq__(self, other) -> bool:
        return isinstance(other, _Buffer) and np.array_equal(self.np, other.np)

    __hash__ = None


def _mode(vllm_mode) -> ibt.SlotMappingMode:
    return ibt.SlotMappingMode(getattr(vllm_mode, "value", vllm_mode))


def _context_parallel(interleave: int) -> ism.ContextParallel:
    """This worker's decode context-parallel rank, as vLLM's table reads it
    (a world of one where no group was initialized, as in a unit test)."""
    from vllm.distributed.parallel_state import get_dcp_group

    try:
        group = get_dcp_group()
        world, rank = group.world_size, group.rank_in_group
    except AssertionError:
        world, rank = 1, 0
    return ism.ContextParallel(world, rank, interleave)


_PUBLIC = ("block_size", "max_num_reqs", "max_num_blocks_per_req", "max_num_batched_tokens",
           "pin_memory", "device", "block_table", "num_blocks_per_row", "slot_mapping",
           "cp_kv_cache_interleave_size", "slot_mapping_mode", "dcp_world_size", "dcp_rank")


class _RowOperations:
    """The row operations, forwarded to the impl table in `_impl` (vLLM's
    block id lists as impl's lists: `_ids`)."""

    _impl: object

    @staticmethod
    def _ids(block_ids):
        return list(block_ids)

    def append_row(self, block_ids, row_idx: int) -> None:
        self._impl.append_row(self._ids(block_ids), row_idx)

    def add_row(self, block_ids, row_idx: int) -> None:
        self._impl.add_row(self._ids(block_ids), row_idx)

    def clear_row(self, row_idx: int) -> None:
        self._impl.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        self._impl.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        self._impl.swap_row(src, tgt)


class BlockTable(_RowOperations):
    """vLLM's BlockTable constructor and methods over impl's BlockTable."""

    def __init__(self, block_size, max_num_reqs, max_num_blocks_per_req, max_num_batched_tokens,
                 pin_memory, device, cp_kv_cache_interleave_size,
                 slot_mapping_mode=ibt.SlotMappingMode.TOKEN_TO_KV_SLOT, *, _impl=None):
        require(torch.device(device).type == "cpu", "a worker table on a device",
                f"device={device}")
        cp = _context_parallel(cp_kv_cache_interleave_size)
        self._impl = _impl or ibt.BlockTable(block_size, max_num_reqs, max_num_blocks_per_req,
                                             _mode(slot_mapping_mode), cp)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pin_memory = pin_memory
        self.device = torch.device(device)
        self.slot_mapping_mode = slot_mapping_mode
        self.block_table = _Buffer(self._impl.table)
        self.slot_mapping = _Buffer(np.zeros(max_num_batched_tokens, dtype=np.int64))

    def __dir__(self):
        return list(_PUBLIC)

    block_size = property(lambda self: self._impl.block_size)
    max_num_reqs = property(lambda self: self._impl.max_num_reqs)
    max_num_blocks_per_req = property(lambda self: self._impl.width)
    num_blocks_per_row = property(lambda self: self._impl.num_blocks_per_row)
    cp_kv_cache_interleave_size = property(lambda self: self._impl.cp.interleave)
    dcp_world_size = property(lambda self: self._impl.cp.world_size)
    dcp_rank = property(lambda self: self._impl.cp.rank)

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions) -> None:
        slots = self._impl.compute_slot_mapping(num_reqs, np.asarray(query_start_loc),
                                                np.asarray(positions))
        if slots is not None:
            self.slot_mapping.np[:len(slots)] = slots

    def commit_block_table(self, num_reqs: int) -> None:
        pass  # the device tensor is the table's own memory

    def clear(self) -> None:
        self._impl.clear()

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        return self.block_table.gpu[:num_reqs]

    def get_cpu_tensor(self) -> torch.Tensor:
        return self.block_table.cpu

    def get_numpy_array(self) -> np.ndarray:
        return self.block_table.np


class MultiGroupBlockTable(_RowOperations):
    """vLLM's MultiGroupBlockTable constructor over impl's: one BlockTable
    adapter per group, over the tables impl built (widths included)."""

    @staticmethod
    def _ids(block_ids):
        return [list(ids) for ids in block_ids]

    def __init__(self, max_num_reqs, max_num_batched_tokens, pin_memory, device, block_sizes,
                 max_num_blocks, cp_kv_cache_interleave_size=1, slot_mapping_modes=None):
        modes = None if slot_mapping_modes is None else [_mode(m) for m in slot_mapping_modes]
        cp = _context_parallel(cp_kv_cache_interleave_size)
        self._impl = img.MultiGroupBlockTable.build(max_num_reqs, list(block_sizes),
                                                    list(max_num_blocks), modes, cp)
        vllm_modes = slot_mapping_modes or [ibt.SlotMappingMode.TOKEN_TO_KV_SLOT] * len(
            block_sizes)
        self.block_tables = [
            BlockTable(t.block_size, max_num_reqs, t.width, max_num_batched_tokens, pin_memory,
                       device, cp_kv_cache_interleave_size, mode, _impl=t)
            for t, mode in zip(self._impl.block_tables, vllm_modes)]

    def __dir__(self):
        return ["block_tables"]

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions) -> None:
        for table in self.block_tables:
            table.compute_slot_mapping(num_reqs, query_start_loc, positions)

    def commit_block_table(self, num_reqs: int) -> None:
        pass

    def clear(self) -> None:
        for table in self.block_tables:
            table.clear()

    def __getitem__(self, idx: int) -> BlockTable:
        return self.block_tables[idx]


def get_block_table_width(max_num_blocks, block_size, *, token_alignment=128) -> int:
    return ibt.table_width(max_num_blocks, block_size, token_alignment)


def get_dcp_local_seq_lens(seq_lens, dcp_size=1, dcp_rank=None, cp_kv_cache_interleave_size=1):
    """vLLM's signature: a tensor in, an int32 tensor out (a rank given as a
    one-element tensor is read as its value)."""
    rank = None if dcp_rank is None else int(dcp_rank)
    lens = icp.dcp_local_seq_lens(seq_lens.cpu().numpy(), dcp_size, rank,
                                  cp_kv_cache_interleave_size)
    return torch.from_numpy(lens).to(seq_lens.device)


def should_skip_dcp_context_attention(context_kv_lens_cpu) -> bool:
    return icp.skips_context_attention(context_kv_lens_cpu.cpu().numpy())


def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
    """vLLM's worker allocation over impl's: the config's tensors and groups
    as impl's plan, vLLM's layout enum by its name; the views are impl's."""
    from harness.peer import convert
    from impl import kv_cache_sizing as isizing
    from impl.worker import kv_cache_allocation as ialloc

    tensors = [isizing.KVCacheTensor(t.size, list(t.layers), t.layer_stride, t.block_stride,
                                     t.offset, getattr(t, "host_resident", False))
               for t in kv_cache_config.kv_cache_tensors]
    groups = [convert.to_impl_group(g) for g in kv_cache_config.kv_cache_groups]
    plan = isizing.KVCacheConfigPlan(
        kv_cache_config.num_blocks, tensors, groups,
        hisparse_host_num_blocks=getattr(kv_cache_config, "hisparse_host_num_blocks", None))
    sizes = None if kernel_block_sizes is None else list(kernel_block_sizes)
    return ialloc.allocate_kv_cache(plan, layout.name, sizes, device)


# (vLLM module, name, adapter) for rebind.py.
REBOUND = (
    ("vllm.v1.worker.block_table", "BlockTable", BlockTable),
    ("vllm.v1.worker.block_table", "MultiGroupBlockTable", MultiGroupBlockTable),
    ("vllm.v1.worker.block_table", "get_block_table_width", get_block_table_width),
    ("vllm.v1.attention.backends.utils", "get_dcp_local_seq_lens", get_dcp_local_seq_lens),
    ("vllm.v1.worker.cp_utils", "should_skip_dcp_context_attention",
     should_skip_dcp_context_attention),
    ("vllm.v1.worker.utils", "allocate_kv_cache", allocate_kv_cache),
)
# vLLM's own callers that build a worker table: the InputBatch the tests
# drive makes impl's (as rebind_vllm_callers does for the checkpoint helpers).
CALLERS = (("vllm.v1.worker.gpu_input_batch", "MultiGroupBlockTable", MultiGroupBlockTable),)
