"""Mamba / linear-attention state (vLLM: MambaManager).

A Mamba layer keeps one fixed-size state, not per-token KV: only the state after
the last computed token is needed (`get_num_skipped_tokens` = computed - 1).

- "none" mode (prefix caching off): blocks as for attention, but everything
  before the block of the last computed token is freed into the null block.
  vLLM then makes the block as large as max_model_len: one block a request.
- "align" mode (prefix caching on): the scheduler ends prefill chunks at block
  boundaries, so a block holds the state after exactly (i + 1) * block_size
  tokens. A request holds only its running state block; allocation pads the
  block table with null blocks up to it, and the state block of two steps ago
  is freed (`last_state_block_idx`). A hit is the rightmost cached state at an
  aligned boundary. A state cached this step cannot be hit in the same step
  (its content is written by this step's forward): such an allocation is
  refused by asking for more blocks than the pool has.
- With hash_block_size < block_size (0.32, profile.partial_block_hits) the state
  at the prompt's last hash boundary inside a block is registered too; a hit on
  it copies the block (copy-on-write) before the request writes on.

Left out (vLLM features this harness does not drive): speculative blocks in
"align" mode, prefill checkpoint blocks, EAGLE block dropping, sparse retention
intervals and shared-prefix checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_hash_view import resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec, MambaSpec
from impl.managers.base import SingleTypeKVCacheManager, cdiv
from impl.request import Request


def mamba_prefill_checkpoint_position(num_tokens: int, hash_block_size: int) -> int:
    """The prompt boundary whose state a resend can reuse: one token is left to
    recompute (for its logits), rounded down to the hash granularity."""
    return max((num_tokens - 1) // hash_block_size * hash_block_size, 0)


class MambaManager(SingleTypeKVCacheManager):
    skips_tokens = True
    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: MambaSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        self.align = self.mamba_cache_mode == "align"
        if self.align and self.num_speculative_blocks:
            raise NotImplementedError("speculative blocks in Mamba 'align' mode")
        self.cached_blocks_this_step: set[bytes] = set()
        # "align" bookkeeping.
        self.last_state_block_idx: dict[str, int] = {}
        self._num_retired_blocks: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()

    # -- lookup -----------------------------------------------------------------

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
        block_size: int,
        dcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        profile = block_pool.profile
        block_size = kv_cache_spec.block_size
        fine_ok = profile.partial_block_hits
        block_hashes = resolve_block_hashes(
            block_hashes, block_pool.hash_block_size, block_size,
            profile.coarse_block_hash, fine_ok, alignment_tokens,
        )
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        null = block_pool.null_block
        get_cached = block_pool.get_cached_block
        if fine_ok and alignment_tokens < block_size and block_size % alignment_tokens == 0:
            # Any hash boundary may hold a (partial) state: the rightmost wins.
            scale = block_size // alignment_tokens
            for fine_idx in range(min(max_length // alignment_tokens, len(block_hashes)) - 1,
                                  -1, -1):
                cached = get_cached(block_hashes[fine_idx], kv_cache_group_ids)
                if cached is None:
                    continue
                block_idx = fine_idx // scale
                for blocks, block in zip(computed, cached):
                    blocks.extend([null] * block_idx)
                    blocks.append(block)
                return computed, (fine_idx + 1) * alignment_tokens
            return computed, 0
        for i in range(max_length // block_size - 1, -1, -1):
            cached = get_cached(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                continue
            if block_size != alignment_tokens and (i + 1) * block_size % alignment_tokens:
                continue
            # Earlier states are not needed: null blocks keep the hit length
            # readable as len(blocks) * block_size.
            for blocks, block in zip(computed, cached):
                blocks.extend([null] * i)
                blocks.append(block)
            return computed, (i + 1) * block_size
        return computed, 0

    # -- sizing and allocation --------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        if new_computed_blocks and (
            new_computed_blocks[-1].block_hash in self.cached_blocks_this_step
        ):
            # The state is written by this step's forward: not usable before
            # the next step. More than the pool has means "not now".
            return self.block_pool.num_gpu_blocks + 1
        if not self.align:
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks,
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
                prefill_end,
            )
        # Lookahead (draft) tokens get no state: draft models have no Mamba layers.
        num_required = cdiv(num_tokens_main_model, self.block_size)
        num_new = (
            num_required
            - len(new_computed_blocks)
            - len(self.req_to_blocks.setdefault(request_id, []))
        )
        has_partial_hit = (
            self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens)
            or request_id in self._partial_hit_reqs
        )
        if has_partial_hit:
            num_new = max(num_new, 0) + 1
        if num_new > 0:
            # One running state block (plus a private copy for a partial hit);
            # the blocks in between are null.
            num_new = min(num_new, 1 + int(has_partial_hit))
        num_evictable = sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks)
        return num_new + num_evictable

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int = 0
    ) -> list[KVCacheBlock]:
        if not self.align:
            return super().allocate_new_blocks(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                num_tokens_main_model,
            )
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_required = cdiv(num_tokens_main_model, self.block_size)
        partial_hit = self._partial_hit_reqs.get(request_id)
        if num_required <= len(req_blocks) and partial_hit is None:
            self._allocated_block_reqs.add(request_id)
            return []
        prev_len = len(req_blocks)
        blocks_allocated = request_id in self._allocated_block_reqs
        if blocks_allocated or prev_len > 0:
            # The state this step starts from (a hit's state for a new request);
            # freed once a later state is computed.
            self.last_state_block_idx[request_id] = prev_len - 1
        # Only the last block holds a state: pad up to it with null blocks.
        if prev_len < num_required - 1:
            req_blocks.extend([self._null_block] * (num_required - 1 - prev_len))
        num_new = max(num_required - len(req_blocks), 0)
        if partial_hit is not None:
            num_new += 1
        new_blocks = self.block_pool.get_new_blocks(num_new)
        returned = req_blocks[prev_len:]
        if partial_hit is not None:
            block_idx, source = partial_hit
            cow, new_blocks = new_blocks[0], new_blocks[1:]
            if blocks_allocated:
                # The producer's block table is append-only: it keeps writing
                # `source`, and the cache moves to the copy instead.
                assert req_blocks[block_idx] is source
                self.block_pool.move_block_hashes(source, cow)
                self._pending_cow_copies.append((source, cow))
                source.ref_cnt += 1
                if cow.block_hash is not None:
                    self.cached_blocks_this_step.add(cow.block_hash)
            else:
                self._apply_cow(request_id, block_idx, source, cow)
                returned = [cow] + returned
        req_blocks.extend(new_blocks)
        self._allocated_block_reqs.add(request_id)
        self._partial_hit_reqs.pop(request_id, None)
        returned.extend(new_blocks)
        return returned

    # -- release ------------------------------------------------------------------

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        if not self.align:
            return super()._remove_blocks_in_range(request_id, first, last)
        blocks = self.req_to_blocks.get(request_id, [])
        first = max(first, self._num_retired_blocks.get(request_id, 0))
        last = min(last, len(blocks))
        if first >= last:
            return
        # Prefill leaves null gaps between states: skip them, do not stop.
        freed = []
        null = self._null_block
        for i in range(last - 1, first - 1, -1):
            if blocks[i].is_null:
                continue
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)
        self._num_retired_blocks[request_id] = last

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        super().remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)
        if not self.align:
            return
        # The state block two steps back served as the source of the previous
        # step's state copy; it is not needed any more.
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(num_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks.setdefault(request_id, [])
            if not blocks[idx].is_null:
                self.block_pool.free_blocks([blocks[idx]])
                blocks[idx] = self._null_block

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        if self.align:
            self._allocated_block_reqs.discard(request_id)
            self.last_state_block_idx.pop(request_id, None)
            self._num_retired_blocks.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    # -- caching ------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        before = self.num_cached_block.get(request.request_id, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(request.request_id, 0)
        if self.align and self.block_pool.profile.partial_block_hits:
            key = self._cache_partial_tail_block(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        if after > before:
            blocks = self.req_to_blocks[request.request_id]
            for block in blocks[before:after]:
                if block.is_null or block.block_hash is None:
                    continue
                self.cached_blocks_this_step.add(block.block_hash)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> bytes | None:
        """Register the state at the prompt's last hash boundary when the
        request has computed exactly up to it."""
        hbs = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % hbs:
            return None
        if num_tokens != mamba_prefill_checkpoint_position(request.num_prompt_tokens, hbs):
            return None
        block_idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_to_blocks[request.request_id]
        if block_idx >= len(blocks) or blocks[block_idx].is_null:
            return None
        source = blocks[block_idx]
        key = self.block_pool.cache_partial_block(
            request, source, num_tokens, self.kv_cache_group_id, self.block_size
        )
        if key is not None and num_tokens % self.block_size:
            # The next step's forward overwrites this state: copy it first,
            # and cache this block again once it is full.
            self._partial_hit_reqs[request.request_id] = (block_idx, source)
            self.num_cached_block[request.request_id] = block_idx
        return key

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()
