"""Mamba and other state-space layers (vLLM's name: MambaManager); spec §9.4.

Such a layer keeps one fixed-size state per request instead of per-token KV,
so only the state after the last computed token is ever read again.

- "none" mode (prefix caching off): blocks as for attention, everything
  before the block holding the last state given back. vLLM sizes the block
  to max_model_len, so a request has one.
- "align" mode (prefix caching on): the scheduler ends chunks on block
  boundaries, so block i holds the state after exactly (i + 1) * block_size
  tokens. A request's table holds only its running state (null entries
  before it); the state of two steps back, the source of the last step's
  state copy, is given back. A hit is the rightmost cached state on an
  aligned boundary. A state keyed during this step is written by this step's
  forward pass, so it cannot serve a hit before the next step.
- Hashed finer than the block (0.32, profile.partial_block_hits), the state
  at the prompt's last hash boundary is registered too, even inside a block;
  it is copied before its owner writes on (copy-on-write).

Not driven by this harness and left out: speculative blocks in "align" mode,
prefill checkpoint blocks, EAGLE, sparse retention and shared-prefix
checkpoints.
"""

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_hash_view import fine_grained_lookup, resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec, MambaSpec
from impl.managers.base import BlockTable, HitResult, SingleTypeKVCacheManager
from impl.math_utils import cdiv
from impl.request import Request


def mamba_prefill_checkpoint_position(num_tokens: int, hash_block_size: int) -> int:
    """The prompt boundary whose state a resend of the prompt can start from:
    the last token is always recomputed (its logits are wanted), and states
    exist only on the hash grid."""
    boundary = (num_tokens - 1) // hash_block_size * hash_block_size
    return boundary if boundary > 0 else 0


class MambaManager(SingleTypeKVCacheManager):
    skips_tokens = True
    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: MambaSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        self._align = self.mamba_cache_mode == "align"
        if self._align and self.num_speculative_blocks:
            raise NotImplementedError("speculative blocks with Mamba 'align' caching")
        # Keys given this step: their states are not written until its forward.
        self.cached_blocks_this_step: set[bytes] = set()
        # "align" mode: request -> table index of the state this step starts
        # from, freed once a newer state exists.
        self.last_state_block_idx: dict[str, int] = {}
        # request -> table entries before this index are given back already.
        self._retired_upto: dict[str, int] = {}
        # requests that had their first allocation.
        self._started: set[str] = set()
        # Set by the coordinator with EAGLE: checkpoints move one hash unit
        # earlier, where an EAGLE hit lands after its drop (specs §15).
        self.drop_eagle_checkpoint_block = False

    # -- lookup ---------------------------------------------------------------

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence, max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: BlockPool,
                               kv_cache_spec: KVCacheSpec, alignment_tokens: int,
                               dcp_world_size: int = 1, pcp_world_size: int = 1, *,
                               drop_eagle_block: bool = False) -> HitResult:
        """The rightmost cached state, with null entries before it. Nothing
        is dropped for EAGLE: draft models have no state-space layers."""
        profile = block_pool.profile
        size = kv_cache_spec.block_size
        inside = profile.partial_block_hits
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, size,
                                      profile.coarse_block_hash, inside, alignment_tokens)
        lookup = block_pool.get_cached_block
        if inside and fine_grained_lookup(alignment_tokens, size):
            # A state may sit on any hash boundary, inside a block too.
            unit = alignment_tokens
            for k in range(min(max_length // unit, len(hashes)) - 1, -1, -1):
                found = lookup(hashes[k], kv_cache_group_ids)
                if found is not None:
                    return _state_hit(found, k * unit // size, block_pool), (k + 1) * unit
        else:
            unaligned = size != alignment_tokens
            for i in range(max_length // size - 1, -1, -1):
                found = lookup(hashes[i], kv_cache_group_ids)
                if found is None or (unaligned and (i + 1) * size % alignment_tokens):
                    continue
                return _state_hit(found, i, block_pool), (i + 1) * size
        return tuple([] for _ in kv_cache_group_ids), 0

    # -- how many blocks ----------------------------------------------------------

    def get_num_blocks_to_allocate(
            self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock],
            total_computed_tokens: int, num_local_computed_tokens: int = 0,
            num_tokens_main_model: int = 0, apply_admission_cap: bool = False,
            prefill_end: int = 0) -> int:
        if new_computed_blocks and (
                new_computed_blocks[-1].block_hash in self.cached_blocks_this_step):
            # The hit's state is written by this very step: more blocks than
            # the pool has means "not in this step".
            return self.block_pool.num_gpu_blocks + 1
        if not self._align:
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
                num_tokens_main_model, apply_admission_cap, prefill_end)
        # Lookahead tokens get no state: draft models have no Mamba layers.
        short = (cdiv(num_tokens_main_model, self.block_size) - len(new_computed_blocks)
                 - len(self.req_to_blocks.get(request_id, ())))
        copying = request_id in self._copy_due or (
            bool(new_computed_blocks) and num_local_computed_tokens % self.block_size != 0)
        if copying:
            short = max(short, 0) + 1
        if short > 0:
            # Just the running state block, and the copy of a partial hit.
            short = min(short, 2 if copying else 1)
        reclaimed = sum(1 for b in new_computed_blocks if not b.ref_cnt and not b.is_null)
        return short + reclaimed

    # -- growing the table ------------------------------------------------------------

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        if not self._align:
            return super().allocate_new_blocks(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks,
                num_tokens_main_model)
        table = self.req_to_blocks.setdefault(request_id, [])
        wanted = cdiv(num_tokens_main_model, self.block_size)
        due = self._copy_due.pop(request_id, None)
        started = request_id in self._started
        self._started.add(request_id)
        if due is None and wanted <= len(table):
            return []
        before = len(table)
        if started or before:
            # This step starts from the table's last state (a hit's state for
            # a new request); it is given back once a later one is computed.
            self.last_state_block_idx[request_id] = before - 1
        if before < wanted - 1:
            table += [self._null_block] * (wanted - 1 - before)
        short = wanted - len(table)
        fresh = self.block_pool.get_new_blocks((short if short > 0 else 0)
                                               + (due is not None))
        handed = table[before:]
        if due is not None:
            index, source = due
            copy, fresh = fresh[0], fresh[1:]
            if started:
                # A running request's table only grows: the owner goes on
                # writing `source`, so the cache entry moves to the copy.
                if table[index] is not source:
                    raise AssertionError(f"state block {source.block_id} moved in {request_id}")
                self.block_pool.move_block_hashes(source, copy)
                self._copies.append((source, copy))
                source.ref_cnt += 1
                if copy.block_hash is not None:
                    self.cached_blocks_this_step.add(copy.block_hash)
            else:
                self._swap_in_copy(request_id, index, source, copy)
                handed.insert(0, copy)
        table += fresh
        handed += fresh
        return handed

    # -- releasing ------------------------------------------------------------------

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        if not self._align:
            return super()._remove_blocks_in_range(request_id, first, last)
        table = self.req_to_blocks.get(request_id, [])
        first = max(first, self._retired_upto.get(request_id, 0))
        last = min(last, len(table))
        if first >= last:
            return
        # Prefill leaves null gaps between states: step over them.
        freed = []
        null = self._null_block
        for index in range(last - 1, first - 1, -1):
            block = table[index]
            if not block.is_null:
                freed.append(block)
                table[index] = null
        if freed:
            self.block_pool.free_blocks(freed)
        self._retired_upto[request_id] = last

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        super().remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)
        if not self._align:
            return
        # The state two steps back was the source of the last state copy.
        index = self.last_state_block_idx.get(request_id)
        if index is None or index >= cdiv(num_computed_tokens, self.block_size) - 1:
            return
        table = self.req_to_blocks.get(request_id)
        if table is not None and not table[index].is_null:
            self.block_pool.free_blocks([table[index]])
            table[index] = self._null_block

    def pop_blocks_for_free(self, request_id: str) -> BlockTable:
        self._started.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._retired_upto.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    # -- keying ------------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        request_id = request.request_id
        before = self.num_cached_block.get(request_id, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(request_id, 0)
        keyed_now = self.cached_blocks_this_step
        if self._align and self._profile.partial_block_hits:
            key = self._key_prompt_state(request, num_tokens)
            if key is not None:
                keyed_now.add(key)
        if after > before:
            for block in self.req_to_blocks[request_id][before:after]:
                if not block.is_null and block.block_hash is not None:
                    keyed_now.add(block.block_hash)

    def _key_prompt_state(self, request: Request, num_tokens: int) -> bytes | None:
        """Register the state at the prompt's last hash boundary, when the
        request has computed exactly that far."""
        unit = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % unit:
            return None
        if num_tokens != mamba_prefill_checkpoint_position(request.num_prompt_tokens, unit):
            return None
        index = cdiv(num_tokens, self.block_size) - 1
        table = self.req_to_blocks[request.request_id]
        if index >= len(table) or table[index].is_null:
            return None
        source = table[index]
        key = self.block_pool.cache_partial_block(
            request, source, num_tokens, self.kv_cache_group_id, self.block_size)
        if key is not None and num_tokens % self.block_size:
            # The next forward overwrites this state in place: copy it first,
            # and key this block again once it is full.
            self._copy_due[request.request_id] = (index, source)
            self.num_cached_block[request.request_id] = index
        return key

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()


def _state_hit(found: list[KVCacheBlock], index: int, pool: BlockPool) -> tuple:
    """Each group's hit: the state block at `index`, null entries before it,
    so that the hit length still reads as entries x block size."""
    pad = [pool.null_block] * index
    return tuple([*pad, block] for block in found)
