"""Mamba and other state-space layers (vLLM's name: MambaManager); spec §9.4.

Such a layer keeps one fixed-size state per request instead of per-token KV,
so only the state after the last computed token is ever read again.

- "none" mode (prefix caching off): blocks as for attention, everything
  before the block holding the last state given back. vLLM sizes the block
  to max_model_len, so a request has one.
- "align" mode (prefix caching on): the scheduler ends chunks on block
  boundaries, so block i holds the state after exactly (i + 1) * block_size
  tokens. A request's table holds only its running state (null entries
  before it) and, with speculative decoding, scratch blocks for the draft
  tokens' states after it; the state of two steps back, the source of the
  last step's state copy, is given back. A hit is the rightmost cached state
  on an aligned boundary. A state keyed during this step is written by this
  step's forward pass, so it cannot serve a hit before the next step.
- Hashed finer than the block (0.32, profile.partial_block_hits), the state
  at the prompt's last hash boundary is registered too, even inside a block;
  it is copied before its owner writes on (copy-on-write).
- Prefill checkpoint blocks (§9.4.2): a backend can export one state inside
  a prefill chunk into the block before the running one; the manager
  reserves that block and keys it at the exported position, or drops its
  keys when no later request can reach that position.
- Every state keyed in "align" mode is offered to a KV connector with its
  block and boundary (§9.4.3): the table is not append-only, so a connector
  cannot find states by position.
"""

from collections.abc import Sequence

from impl.block import KVCacheBlock
from impl.block_hash_view import fine_grained_lookup, resolve_block_hashes
from impl.block_pool import BlockPool
from impl.kv_cache_spec import KVCacheSpec, MambaSpec
from impl.mamba_checkpoint import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from impl.managers.base import (
    BlockTable,
    HitResult,
    Interval,
    SingleTypeKVCacheManager,
    TailOffer,
)
from impl.math_utils import cdiv
from impl.profiles import (
    MambaEagleTailShift,
    MambaPartialTailRekey,
    MambaPrefillCheckpoints,
    PromptTailBoundary,
)
from impl.request import Request

# (request, group, block, boundary tokens): a state a connector may save.
BoundaryOffer = tuple[str, int, KVCacheBlock, int]


class MambaManager(SingleTypeKVCacheManager):
    skips_tokens = True
    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: MambaSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        profile = self._profile
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        self._align = self.mamba_cache_mode == "align"
        if self.enable_caching and not self._align and not self._profile.mamba_none_with_caching:
            raise AssertionError("prefix caching of a Mamba group needs its 'align' cache mode")
        if kv_cache_spec.num_prefill_checkpoint_blocks and not profile.mamba_prefill_checkpoints:
            raise ValueError(f"vLLM {profile.name} has no Mamba prefill checkpoint blocks")
        self.has_prefill_checkpoint_blocks = (
            self._align and kv_cache_spec.num_prefill_checkpoint_blocks > 0)
        # 0.30-0.31's checkpoints: on the hash grid, scratch blocks taken anew
        # in a checkpoint step, dropped only under retention 0; 0.30's for
        # every chunk (profile field).
        self._hash_grid_checkpoints = profile.mamba_prefill_checkpoints.on_hash_grid
        self._every_chunk_checkpoints = (
            profile.mamba_prefill_checkpoints is MambaPrefillCheckpoints.HASH_GRID_EVERY_CHUNK)
        # Releases run this many tokens behind the computed count (0.17).
        self._release_lag = (self.num_speculative_blocks
                             if profile.mamba_release_lags_speculative_blocks else 0)
        # EAGLE inputs (set by the coordinator and the manager facade):
        # checkpoints one hash unit earlier; a prompt-tail entry at the
        # request's shared-prefix boundary too.
        self.drop_eagle_checkpoint_block = False
        self.shared_prefix_checkpoint = False
        # Keys given this step: their states are not written until its forward.
        self.cached_blocks_this_step: set[bytes] = set()
        # "align" mode: request -> table index of the state this step starts
        # from, freed once a newer state exists.
        self.last_state_block_idx: dict[str, int] = {}
        # request -> table entries before this index are given back already.
        self._retired_upto: dict[str, int] = {}
        # Requests that had their first allocation.
        self.allocated_requests: set[str] = set()
        # request -> (position, table index) of the checkpoint its current
        # allocation reserves.
        self.prefill_checkpoints: dict[str, tuple[int, int]] = {}
        # request -> (block, boundary) of the prompt-tail entry it registered
        # inside its running block and has not had copied yet.
        self._producer_tails: dict[str, tuple[KVCacheBlock, int]] = {}
        self._offers: list[BoundaryOffer] = []
        offloads = profile.boundary_state_offloads
        self._offering = self._align and bool(offloads)
        # Keyed states are offered too, not only prompt-tail copies (0.29+).
        self._offering_keyed = self._offering and offloads.offers_keyed_states

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

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, alignment_tokens: int | None,
                             kv_cache_spec: KVCacheSpec, use_eagle: bool,
                             retention_interval: Interval = None,
                             reachable_boundaries: Sequence[int] = (), dcp_world_size: int = 1,
                             final_segment_end_block: int | None = None) -> list[bool] | None:
        """Under a retention interval, the one state block ending each
        interval and the one ending at each reachable boundary (floored to
        the alignment). A state is replicated across decode-context ranks, so
        dcp does not scale the block; draft models have no Mamba layers, so
        EAGLE shifts nothing. None: every block (dense)."""
        if None in (retention_interval, alignment_tokens):
            return None
        if not isinstance(kv_cache_spec, MambaSpec):
            raise AssertionError(f"a Mamba mask for a {type(kv_cache_spec).__name__}")
        size = kv_cache_spec.block_size
        keep = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // size
            if per_segment <= 1:
                return None  # every block ends a segment
            # Block i holds the state after (i + 1) * size tokens.
            last = per_segment - 1
            for i in range(start_block, end_block):
                if i % per_segment == last:
                    keep[i - start_block] = True
        for boundary in reachable_boundaries:
            index = (boundary - boundary % alignment_tokens) // size - 1
            if start_block <= index < end_block:
                keep[index - start_block] = True
        return keep

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
        scratch = self.num_speculative_blocks
        if not self._align:
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens + self.block_size * scratch, new_computed_blocks,
                total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
                apply_admission_cap, prefill_end)
        # Lookahead tokens get no state: draft models have no Mamba layers.
        end = num_tokens_main_model
        short = (cdiv(end, self.block_size) + scratch - len(new_computed_blocks)
                 - len(self.req_to_blocks.get(request_id, ())))
        copying = request_id in self._copy_due or (
            bool(new_computed_blocks) and num_local_computed_tokens % self.block_size != 0)
        if copying:
            short = max(short, 0) + 1
        checkpoint = self._checkpoint_for(request_id, total_computed_tokens, end, prefill_end)
        if not apply_admission_cap:
            # The allocation that follows this estimate reserves what it saw.
            if checkpoint is None:
                self.prefill_checkpoints.pop(request_id, None)
            else:
                self.prefill_checkpoints[request_id] = checkpoint
        if short > 0:
            # The running state block, a copy of a partial hit, the
            # checkpoint block; scratch blocks only the first time (later
            # steps move the old ones along).
            cap = 1 + copying + (checkpoint is not None)
            if request_id not in self.allocated_requests or self._fresh_scratch(
                    checkpoint is not None):
                cap += scratch
            if self._profile.mamba_blocks_capped:
                short = min(short, cap)
            elif checkpoint is None or request_id not in self.allocated_requests:
                # Before 0.31 the count is the cap whatever is missing...
                short = cap
            # ...but a started request's checkpoint step asks for what it lacks (0.30).
        reclaimed = sum(1 for b in new_computed_blocks if not b.ref_cnt and not b.is_null)
        return short + reclaimed

    def _checkpoint_for(self, request_id: str, start: int, end: int,
                        prefill_end: int) -> tuple[int, int] | None:
        """(position, table index) of the prefill checkpoint a chunk
        [start, end) exports, or None."""
        if not self.has_prefill_checkpoint_blocks:
            return None
        if end < prefill_end and not self._every_chunk_checkpoints:
            return None  # 0.31+: only the prefill end's chunk keeps one
        position = self._checkpoint_position(end)
        if not position or not is_mamba_prefill_checkpoint_valid(
                start, end, position, self.block_pool.hash_block_size, self.block_size,
                self.kv_cache_spec.prefill_checkpoint_alignment):
            return None
        index = cdiv(end, self.block_size) - 2
        if index < 0:
            return None
        table = self.req_to_blocks.get(request_id, ())
        # The column must be free: past the table, a null entry, or one of
        # the scratch blocks the last step left there.
        if (index >= len(table) or table[index].is_null
                or (request_id in self.allocated_requests
                    and index >= len(table) - self.num_speculative_blocks)):
            return position, index
        return None

    def _checkpoint_position(self, num_tokens: int) -> int:
        """The checkpoint boundary of a chunk (or prompt) ending at `num_tokens`."""
        hash_grid = self._hash_grid_checkpoints
        grid = self.block_pool.hash_block_size if hash_grid else self.cache_hit_alignment_tokens
        return get_mamba_prefill_checkpoint_position(
            num_tokens, grid, self.drop_eagle_checkpoint_block,
            self.block_pool.num_hash_lookahead_tokens, eagle_holds_last_token=hash_grid)

    def _fresh_scratch(self, checkpoint: bool) -> bool:
        """Whether a started request's step takes its scratch blocks anew
        (0.31, a checkpoint step: the old ones stay where they are)."""
        return checkpoint and self._hash_grid_checkpoints

    # -- growing the table ------------------------------------------------------------

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        scratch = self.num_speculative_blocks
        if not self._align:
            return super().allocate_new_blocks(
                request_id, num_tokens + self.block_size * scratch, num_tokens_main_model)
        table = self.req_to_blocks.setdefault(request_id, [])
        wanted = cdiv(num_tokens_main_model, self.block_size) + scratch
        checkpoint = request_id in self.prefill_checkpoints
        due = self._copy_due.pop(request_id, None)
        started = request_id in self.allocated_requests
        self.allocated_requests.add(request_id)
        if due is None and not checkpoint and wanted <= len(table):
            return []
        before = len(table)
        if started:
            # The running state sits before the scratch blocks.
            self.last_state_block_idx[request_id] = before - 1 - scratch
        elif before:
            # A new request starts from its hit's state.
            self.last_state_block_idx[request_id] = before - 1
        running = wanted - scratch - 1
        # Null entries up to the running state, or up to the checkpoint
        # column before it.
        first_real = running - checkpoint
        if before < running and before < first_real:
            table += [self._null_block] * (first_real - before)
        if started and not self._fresh_scratch(checkpoint):
            # Scratch blocks the new state position leaves behind move to the
            # end; one in the checkpoint column stays (the state goes there).
            for index in range(before - scratch, before):
                if index >= first_real:
                    break
                self.relocate_speculative_block(table, index)
        short = wanted - len(table)
        if short < 0:
            short = 0
        cap = 1 + checkpoint + (scratch if not started or self._fresh_scratch(checkpoint)
                                else 0)
        if due is not None:
            short += 1
            cap += 1
        if short > cap:
            raise AssertionError(f"{short} new state blocks for {request_id}, at most {cap}")
        fresh = self.block_pool.get_new_blocks(short)
        handed = table[before:]
        if due is not None:
            index, source = due
            copy, fresh = fresh[0], fresh[1:]
            if started:
                self._copy_running_tail(request_id, index, source, copy)
            else:
                self._swap_in_copy(request_id, index, source, copy)
                handed.insert(0, copy)
        table += fresh
        handed += fresh
        return handed

    def _copy_running_tail(self, request_id: str, index: int, source: KVCacheBlock,
                           copy: KVCacheBlock) -> None:
        """A running request's table only grows: the owner goes on writing
        `source`, so its prompt-tail entry moves to a copy the worker fills
        first. The copy holds the producer's boundary state from now on."""
        if self.req_to_blocks[request_id][index] is not source:
            raise AssertionError(f"state block {source.block_id} moved in {request_id}")
        self.block_pool.move_block_hashes(source, copy)
        self._copies.append((source, copy))
        source.ref_cnt += 1
        tail = self._producer_tails.pop(request_id, None)
        if tail is not None:
            if tail[0] is not source:
                raise AssertionError(f"{request_id}'s prompt tail is not in block "
                                     f"{source.block_id}")
            self._offer(request_id, copy, tail[1])
        if copy.block_hash is not None:
            self.cached_blocks_this_step.add(copy.block_hash)

    def relocate_speculative_block(self, table: BlockTable, index: int) -> None:
        """Move the scratch block at `index` to the end of the table."""
        block = table[index]
        if not self.block_pool.is_block_writable(block):
            raise AssertionError(f"block {block.block_id} cannot move: a speculative "
                                 "block must be exclusively owned and unhashed")
        table.append(block)
        table[index] = self._null_block

    # -- releasing ------------------------------------------------------------------

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        if not (self._align and self._profile.mamba_skip_steps_over_nulls):
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
            self.block_pool.free_blocks(freed, skipped=True)
        self._retired_upto[request_id] = last

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        if self._release_lag:
            num_computed_tokens = max(0, num_computed_tokens - self._release_lag)
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
        self.allocated_requests.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._retired_upto.pop(request_id, None)
        self.prefill_checkpoints.pop(request_id, None)
        self._producer_tails.pop(request_id, None)
        if self._offers:
            # Its blocks go back to the pool now: an offer not taken yet
            # could name a block another request is handed next.
            self._offers = [offer for offer in self._offers if offer[0] != request_id]
        return super().pop_blocks_for_free(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    # -- keying ------------------------------------------------------------------------

    def _block_mask(self, request, start, end, retention_interval, replay_boundaries):
        if retention_interval is None:
            return None  # dense: no boundary list to build
        return super()._block_mask(request, start, end, retention_interval, replay_boundaries)

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval: Interval = None,
                     replay_boundaries: Sequence[int] = ()) -> None:
        request_id = request.request_id
        before = self.num_cached_block.get(request_id, 0)
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        after = self.num_cached_block.get(request_id, 0)
        keyed_now = self.cached_blocks_this_step
        if self._align and self._profile.partial_block_hits:
            key = self._key_inner_state(request, num_tokens, retention_interval)
            if key is not None:
                keyed_now.add(key)
        if after > before:
            for block in self.req_to_blocks[request_id][before:after]:
                # Null entries and states the retention mask left unkeyed
                # are nobody's hit.
                if block.block_hash is None or block.is_null:
                    continue
                keyed_now.add(block.block_hash)
                if self._offering_keyed:
                    self._offer(request_id, block, block.block_hash_num_tokens)

    def _key_inner_state(self, request: Request, num_tokens: int,
                         retention_interval: Interval) -> bytes | None:
        """Key a state inside a block: the reserved checkpoint of this step if
        there is one, else the prompt's tail state."""
        reserved = self.prefill_checkpoints.get(request.request_id)
        if reserved is not None:
            return self._key_checkpoint(request, *reserved, retention_interval, num_tokens)
        return self._key_prompt_state(request, num_tokens)

    def _key_checkpoint(self, request: Request, position: int, index: int,
                        retention_interval: Interval, num_tokens: int) -> bytes | None:
        """The reserved block holds the state at `position`: keep it findable
        there if a later request can resume at it, else make it unfindable
        (the full-block pass may just have keyed it for its block end)."""
        table = self.req_to_blocks[request.request_id]
        if not 0 <= index < len(table):
            raise AssertionError(f"checkpoint column {index} outside {request.request_id}'s "
                                 f"table of {len(table)}")
        block = table[index]
        alignment = self.cache_hit_alignment_tokens
        # The prompt's final chunk caches up to a block boundary only, so
        # compare with the prompt's own checkpoint, not with num_tokens.
        reusable = position == self._checkpoint_position(request.num_prompt_tokens)
        if self._hash_grid_checkpoints:
            # 0.30-0.31 drop a chunk's checkpoint only under retention 0, and
            # not once the prompt is cached; 0.30 even at the prompt's own.
            reusable = ((reusable and not self._every_chunk_checkpoints)
                        or retention_interval != 0 or num_tokens >= request.num_prompt_tokens)
        elif not reusable and position % self.block_size == 0:
            state = position // self.block_size - 1
            mask = self.reachable_block_mask(state, state + 1, alignment, self.kv_cache_spec,
                                             self.drop_eagle_checkpoint_block,
                                             retention_interval)
            reusable = mask is None or mask[0]
        if not reusable and position != request.shared_prefix_boundary:
            self.block_pool.evict_cached_block(block)
            return None
        if block.block_hash_num_tokens == position:
            return None
        return self.block_pool.cache_partial_block(
            request, block, position, self.kv_cache_group_id, self.block_size,
            replace_existing_hashes=True)

    def _key_prompt_state(self, request: Request, num_tokens: int) -> bytes | None:
        """Register the state at the prompt's last hash boundary (or, with
        shared-prefix checkpoints, at the request's shared-prefix boundary)
        when the request has computed exactly that far."""
        unit = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % unit:
            return None
        rule = self._profile.prompt_tail_boundary
        shift = {MambaEagleTailShift.NONE: False,
                 MambaEagleTailShift.DRAFT_GROUP: self.use_eagle,
                 MambaEagleTailShift.USE_EAGLE: self.drop_eagle_checkpoint_block,
                 }[self._profile.mamba_eagle_tail_shift]
        boundary = get_mamba_prefill_checkpoint_position(
            request.num_prompt_tokens, unit, shift,
            self.block_pool.num_hash_lookahead_tokens, rule)
        if num_tokens != boundary and not (
                self.shared_prefix_checkpoint
                and num_tokens == request.shared_prefix_boundary
                and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens):
            return None
        if rule is PromptTailBoundary.PROMPT_END and (
                self.block_size == unit or not num_tokens % self.block_size):
            return None  # before 0.32 only a boundary inside a block is registered
        index = cdiv(num_tokens, self.block_size) - 1
        table = self.req_to_blocks[request.request_id]
        if index >= len(table) or table[index].is_null:
            return None
        source = table[index]
        if (source.block_hash_num_tokens == num_tokens
                and self._profile.mamba_partial_tail_rekey is MambaPartialTailRekey.UNLESS_KEYED):
            # Keyed at this boundary already (by a hit or an earlier step):
            # keying it again would defer every sibling hitting it a step.
            return None
        key = self.block_pool.cache_partial_block(
            request, source, num_tokens, self.kv_cache_group_id, self.block_size)
        if key is not None and num_tokens % self.block_size:
            # The next forward overwrites this state in place: copy it first,
            # and key this block again once it is full.
            self._copy_due[request.request_id] = (index, source)
            self.num_cached_block[request.request_id] = index
            self._producer_tails[request.request_id] = (source, num_tokens)
        return key

    def new_step_starts(self) -> None:
        # Last step's states are written now: they may serve hits.
        self.cached_blocks_this_step.clear()

    # -- boundary states for KV connectors --------------------------------------------

    def _offer(self, request_id: str, block: KVCacheBlock, boundary: int) -> None:
        if self._offering:
            self._offers.append((request_id, self.kv_cache_group_id, block, boundary))

    def take_pending_boundary_state_offloads(self) -> list[BoundaryOffer]:
        taken, self._offers = self._offers, []
        return taken

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int) -> TailOffer | None:
        """A producer finishing before its prompt-tail entry was copied: the
        table block still holds the boundary state when nothing was
        computed past it and nothing is in flight."""
        if not self._align:
            return None
        tail = self._producer_tails.pop(request_id, None)
        if tail is None or num_in_flight_tokens or num_computed_tokens != tail[1]:
            return None
        return self.kv_cache_group_id, tail[0], tail[1]


def _state_hit(found: list[KVCacheBlock], index: int, pool: BlockPool) -> tuple:
    """Each group's hit: the state block at `index`, null entries before it,
    so that the hit length still reads as entries x block size."""
    pad = [pool.null_block] * index
    return tuple([*pad, block] for block in found)
