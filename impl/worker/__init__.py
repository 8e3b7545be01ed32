"""The worker side of the KV cache: what the model runner does with the block
ids the scheduler hands it (specs/WORKER_BLOCK_TABLE.md).

- `block_table.py`: one KV cache group's table of rows, its width, its row
  operations;
- `multi_group.py`: a table per group, driven together;
- `slot_mapping.py`: token positions to KV cache slots, context parallelism
  included;
- `kernel_blocks.py`: a row of manager blocks as a row of the attention
  backend's smaller kernel blocks;
- `block_copies.py`: copy-on-write copies of whole blocks in KV tensors;
- `forward_tables.py`: the forward pass's tables gathered from the rows
  (0.33: entries below a sliding window nulled);
- `kv_cache_allocation.py`: a whole KV cache config's backing allocation and
  every layer's strided view of its pages;
- `cp_local_lengths.py`: how many of a sequence's tokens each context-parallel
  rank holds.
"""
