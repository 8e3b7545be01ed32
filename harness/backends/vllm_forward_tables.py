"""vLLM's forward-pass block tables: the new model runner's gather kernel
(`_gather_block_tables_kernel` in vllm/v1/worker/gpu/block_table.py, 0.33
with its sliding-window nulling) taken from a release's source and jitted by
the real Triton in its interpreter, on CPU tensors
(specs/WORKER_BLOCK_TABLE.md, "Forward-pass tables").

The kernel addresses each group's table through a tensor of raw addresses;
Triton's interpreter follows host addresses, so it runs on a CPU as it is.
The release need not be the installed one: its source file is read, not
imported (a release overlay's tree will do).
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import numpy as np

_GPU = Path("vllm/v1/worker/gpu")


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise LookupError(f"{path} defines no {name}")
    node.decorator_list = []  # the real Triton jits it below
    return node


@functools.cache
def gather_kernel(release_root: Path):
    """The release's gather kernel (with the pointer helper it calls)."""
    import triton
    import triton.language as tl

    scope = {"tl": tl, "triton": triton}
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for file, name in (("buffer_utils.py", "_load_ptr"),
                           ("block_table.py", "_gather_block_tables_kernel")):
            path = release_root / _GPU / file
            code = compile(ast.Module([_function(path, name)], []), str(path), "exec")
            exec(code, scope)  # noqa: S102 - vLLM's own source
            scope[name] = triton.jit(scope[name])
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    return scope["_gather_block_tables_kernel"]


def vllm_forward_tables(kernel, tables: list[np.ndarray], counts: list[np.ndarray],
                        block_sizes: list[int], reaches: list[int], batch_rows: list[int],
                        computed: np.ndarray) -> list[np.ndarray]:
    """Each group's gathered [len(batch_rows), width] table, entries past a
    row's count as 0 (the kernel leaves them; impl's are 0): `tables[g]` the
    group's rows, `counts[g]` their used entries, `computed` every row's
    computed tokens."""
    import torch

    src = [torch.from_numpy(np.ascontiguousarray(t, dtype=np.int32)) for t in tables]
    dst = [torch.zeros((len(batch_rows), t.shape[1]), dtype=torch.int32) for t in tables]
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    num_blocks = torch.from_numpy(np.stack(counts).astype(np.int32))
    kernel[(len(tables), len(batch_rows))](
        torch.tensor(batch_rows, dtype=torch.int32), ptrs(src), ptrs(dst),
        torch.tensor([t.stride(0) for t in src], dtype=torch.int64), num_blocks,
        num_blocks.stride(0), len(batch_rows),
        torch.from_numpy(np.asarray(computed, dtype=np.int32)),
        torch.tensor(reaches, dtype=torch.int32), torch.tensor(block_sizes, dtype=torch.int32),
        MASK_SLIDING_WINDOW=any(r > 0 for r in reaches), BLOCK_SIZE=1024)
    return [d.numpy() for d in dst]
