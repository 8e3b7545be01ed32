"""The metadata of one batch for paged attention (vLLM: CommonAttentionMetadata).

Requests are laid end to end: request i schedules num_new[i] query tokens at
positions num_computed[i] .. num_computed[i] + num_new[i] - 1 and then holds
seq_lens[i] = num_computed[i] + num_new[i] tokens in the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from impl.block_table import BlockTable


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    req_id: str
    num_computed: int  # tokens already in the cache (prefix hits included)
    num_new: int  # query tokens this step

    @property
    def positions(self) -> range:
        return range(self.num_computed, self.num_computed + self.num_new)


@dataclass(slots=True)
class AttentionBatch:
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_table: torch.Tensor  # int32 [num_reqs, max blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens (+ padding)]
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_actual_tokens(self) -> int:
        return int(self.query_start_loc[-1])


def build_attention_batch(
    scheduled: Sequence[ScheduledRequest], block_table: BlockTable,
    num_padding: int = 0, device: torch.device | str = "cpu",
) -> AttentionBatch:
    ids = [s.req_id for s in scheduled]
    new = [s.num_new for s in scheduled]
    seq = [s.num_computed + s.num_new for s in scheduled]
    qsl = torch.zeros(len(scheduled) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(new, dtype=torch.int32).cumsum(0)
    return AttentionBatch(
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
        block_table=block_table.tensor(ids, device),
        slot_mapping=block_table.slot_mapping(ids, [s.positions for s in scheduled],
                                              num_padding, device),
        max_query_len=max(new, default=0),
        max_seq_len=max(seq, default=0),
    )


def with_static_sinks(batch: AttentionBatch, sink_len: int, block_size: int,
                      first_sink_block: int = 1) -> AttentionBatch:
    """The batch as a layer with static sink tokens attends (vLLM:
    SinkFullAttentionSpec's layers): sink_len learned key/value tokens live in
    the blocks right after the null block (first_sink_block onwards), written
    once; every request sees them before its own tokens. Each row of the block
    table gets those blocks in front and each sequence sink_len more tokens,
    so the sinks sit at positions 0 .. sink_len - 1, visible to every query.
    The slot mapping (where the batch's own tokens are written) is unchanged."""
    if sink_len <= 0 or sink_len % block_size:
        raise ValueError(f"sink_len {sink_len} must be a positive multiple of the "
                         f"block size {block_size}")
    n = sink_len // block_size
    sink_ids = torch.arange(first_sink_block, first_sink_block + n, dtype=torch.int32,
                            device=batch.block_table.device)
    table = torch.cat([sink_ids.expand(batch.num_reqs, n), batch.block_table], dim=1)
    return AttentionBatch(batch.query_start_loc, batch.seq_lens + sink_len,
                          table.contiguous(), batch.slot_mapping, batch.max_query_len,
                          batch.max_seq_len + sink_len)
