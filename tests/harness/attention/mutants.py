"""Test-only mutants of impl's attention path: each a small, realistic bug
made by rewriting one line of an impl module's source into a fresh copy of
the module (a file in a temporary folder, so Triton can read its kernels'
source), whose function or class then replaces the one the attention
differential calls, for the duration of one test (monkeypatch). impl itself
has no mutant switches.

A mutant whose line no longer occurs exactly once in impl fails loudly
(`MutantGone`), so a refactor of impl cannot silently turn a negative control
into a no-op.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path


class MutantGone(AssertionError):
    """The line a mutant rewrites is not in impl any more (or not once)."""


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    what: str  # the bug, in words
    module: str  # the impl module rewritten
    old: str
    new: str
    attribute: str  # what the differential takes from the module
    users: tuple[str, ...]  # harness modules whose binding of `attribute` is replaced

    def apply(self, monkeypatch, folder: Path) -> None:
        source = inspect.getsource(importlib.import_module(self.module))
        if source.count(self.old) != 1:
            raise MutantGone(f"mutant '{self.name}': {self.module} holds "
                             f"{source.count(self.old)} copies of {self.old!r}")
        name = f"kvconform_mutant_{self.name.replace('-', '_')}"
        path = folder / f"{name}.py"
        path.write_text(source.replace(self.old, self.new))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        for user in self.users:
            monkeypatch.setattr(importlib.import_module(user), self.attribute,
                                getattr(module, self.attribute))


_ATTENTION = dict(module="impl.kernels.unified_attention", attribute="unified_attention",
                  users=("harness.attention.impl_call",))

MUTANTS = {m.name: m for m in (
    Mutant("block-table-swap", "the block table's tensor form swaps each row's first two "
           "entries", "impl.block_table",
           "out[i, :len(r)] = torch.tensor(r, dtype=torch.int32)",
           "out[i, :len(r)] = torch.tensor(r[1::-1] + r[2:], dtype=torch.int32)",
           "BlockTable", ("harness.attention.steps",)),
    Mutant("causal-off-by-one", "the causal mask lets a query see the next token",
           new="visible = visible & (pos[None, :] <= q_pos[:, None] + 1)",
           old="visible = visible & (pos[None, :] <= q_pos[:, None])", **_ATTENTION),
    Mutant("window-off-by-one", "the sliding window is one token wider (W + 1 keys)",
           old="block_size, sliding_window or 0, chunk_size or 1,",
           new="block_size, (sliding_window or -1) + 1, chunk_size or 1,", **_ATTENTION),
    Mutant("reshape-wrong-slot", "reshape_and_cache writes each token one offset further "
           "into its block", "impl.kernels.reshape_and_cache",
           "offset = slot % block_size", "offset = (slot + 1) % block_size",
           "reshape_and_cache", ("harness.attention.impl_call",)),
    Mutant("gqa-head-mapping", "query heads map to kv heads interleaved (h % kv_heads) "
           "instead of grouped (h // group)",
           old="head = kv_head * QUERIES_PER_KV + rows % QPK_PAD",
           new="head = kv_head + (rows % QPK_PAD) * tl.num_programs(1)", **_ATTENTION),
    Mutant("tile-last-dropped", "the key loop stops before a last tile that starts at the "
           "newest key", old="range((lo_pos // TILE_N) * TILE_N, hi_pos + 1, TILE_N)",
           new="range((lo_pos // TILE_N) * TILE_N, hi_pos, TILE_N)", **_ATTENTION),
    Mutant("tile-no-rescale", "the online softmax does not rescale the accumulator when "
           "a later tile raises the running max", old="acc = acc * alpha[:, None] + pv",
           new="acc = acc + pv", **_ATTENTION),
)}
