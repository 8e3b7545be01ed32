"""The bookkeeping every single-type manager shares (vLLM's name:
SingleTypeKVCacheManager); specs/KV_CACHE_MANAGER.md §9.

A manager serves one KV cache group. For each request it keeps the block
table (blocks in token order, the null block where the request skips one)
and how many of its leading blocks are keyed. Attention kinds differ only in
which tokens stay readable (`get_num_skipped_tokens`), which blocks a hit
needs (`find_longest_cache_hit`) and which blocks are worth keying
(`reachable_block_mask`); the rest lives here.
"""

from collections.abc import Sequence
from typing import ClassVar

from impl.block import BlockList, KVCacheBlock, null_head_len
from impl.block_pool import BlockPool
from impl.kv_cache_spec import AttentionSpec, FullAttentionSpec, KVCacheSpec
from impl.math_utils import cdiv
from impl.profiles import ContextParallelBlockSize, VersionProfile
from impl.request import Request

BlockTable = BlockList
# A copy-on-write copy the worker still has to make: (source, copy).
CopyPair = tuple[KVCacheBlock, KVCacheBlock]
# One list of hit blocks per group looked up together, and the hit's length.
HitResult = tuple[tuple[BlockTable, ...], int]
# A retention interval in tokens (None: dense, §9.2.1).
Interval = int | None
# A finishing producer's prompt-tail state: (group, block, boundary tokens).
TailOffer = tuple[int, KVCacheBlock, int]
BlockIds = list[int]


def context_parallel_ranks(spec: KVCacheSpec, profile: VersionProfile,
                           dcp_world_size: int, pcp_world_size: int) -> tuple[int, int]:
    """(dcp, pcp) ranks a block of this spec is spread over. 0.29-0.30 spread
    only full-attention caches over the DCP ranks; from 0.31 the caches
    sharded across them (attention KV; Mamba state is replicated)."""
    rule = profile.context_parallel_block_size
    if rule is ContextParallelBlockSize.DCP_FULL_ATTENTION:
        inner = getattr(spec, "first_spec", spec)
        return (dcp_world_size if isinstance(inner, FullAttentionSpec) else 1), pcp_world_size
    if rule is not ContextParallelBlockSize.DCP_IF_SHARDED:
        return dcp_world_size, pcp_world_size
    if spec.dcp_sharded:
        return dcp_world_size, pcp_world_size
    return 1, 1


def check_dcp_sharding_expressible(spec: KVCacheSpec, profile: VersionProfile) -> None:
    """Refuse a replicated attention spec (`dcp_sharded=False`) where the
    release's specs cannot say so (before 0.31)."""
    inner = getattr(spec, "first_spec", spec)
    if (isinstance(inner, AttentionSpec) and not inner.dcp_sharded
            and not profile.context_parallel_block_size.spec_says_sharding):
        raise ValueError(f"vLLM {profile.name}'s attention specs have no dcp_sharded: "
                         "a replicated attention cache cannot be built")


def effective_block_size(spec: KVCacheSpec, profile: VersionProfile,
                         dcp_world_size: int = 1, pcp_world_size: int = 1) -> int:
    """Tokens one block of this group spans across the context-parallel ranks."""
    dcp, pcp = context_parallel_ranks(spec, profile, dcp_world_size, pcp_world_size)
    if profile.context_parallel_block_size is ContextParallelBlockSize.DCP_TIMES_PCP:
        return spec.block_size * dcp * pcp
    return spec.block_size * dcp


class SingleTypeKVCacheManager:
    # Whether some leading tokens can drop out of attention (windows, Mamba):
    # lets full attention skip the release pass on every allocation.
    skips_tokens: ClassVar[bool] = False
    # Whether hits may end at hash boundaries inside a block.
    supports_fine_grained_hash_lookup: ClassVar[bool] = False
    # Whether the group keeps its whole hit when the groups agree on a shorter
    # one (HiSparse's host tier, §14.2).
    retains_longer_hit: ClassVar[bool] = False
    # Whether a prefix every request shares shows in the blocks' holder
    # counts (full attention and its kinds), for cascade attention (§16.5).
    shares_prefix_by_ref_cnt: ClassVar[bool] = False

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, enable_caching: bool,
                 kv_cache_group_id: int, scheduler_block_size: int | None = None,
                 dcp_world_size: int = 1, pcp_world_size: int = 1,
                 max_admission_blocks_per_request: int | None = None, *,
                 needs_kv_cache_zeroing: bool = False) -> None:
        profile = block_pool.profile
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        check_dcp_sharding_expressible(kv_cache_spec, profile)
        self.dcp_world_size, self.pcp_world_size = context_parallel_ranks(
            kv_cache_spec, profile, dcp_world_size, pcp_world_size)
        self.block_size = effective_block_size(kv_cache_spec, profile, dcp_world_size,
                                               pcp_world_size)
        self.scheduler_block_size = scheduler_block_size or self.block_size
        # Hits land on multiples of this; a hybrid coordinator may lower it
        # to the hash block size (hits inside blocks).
        self.cache_hit_alignment_tokens = self.scheduler_block_size
        # The most a request of a recycling kind holds at once (admission).
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        self.req_to_blocks: dict[str, BlockTable] = {}
        # Only requests holding blocks have an entry: it marks them running.
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block
        self._cacheable = kv_cache_spec.prefix_cacheable
        self._profile = profile
        # request -> (table index, shared block) of a hit that ends inside a
        # block, until its first allocation gives it a private copy.
        self._copy_due: dict[str, tuple[int, KVCacheBlock]] = {}
        # (source, copy) pairs whose copy the worker still has to make.
        self._copies: list[CopyPair] = []
        # Whether this group's hits drop EAGLE's last matched block (the
        # coordinator sets it for draft-model groups).
        self.use_eagle = False
        # Whether this group's hits drop their last unit for an EAGLE / MTP
        # drafter; the coordinator sets it (specs §15).
        self.use_eagle = False
        # Ids of blocks handed out since the last take_new_block_ids, kept
        # when the worker zeroes new attention blocks (specs §16.4).
        self._records_new = needs_kv_cache_zeroing and isinstance(kv_cache_spec, AttentionSpec)
        self.new_block_ids: BlockIds = []

    # -- how many blocks ----------------------------------------------------------

    def get_num_blocks_to_allocate(
            self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock],
            total_computed_tokens: int, num_local_computed_tokens: int = 0,
            num_tokens_main_model: int = 0, apply_admission_cap: bool = False,
            prefill_end: int = 0) -> int:
        """Free blocks an allocation to `num_tokens` slots would use up: new
        blocks, hit blocks it would take out of the free queue, and a private
        copy for a hit that ends inside a block."""
        size = self.block_size
        wanted = cdiv(num_tokens, size)
        cap = self.max_admission_blocks_per_request
        if apply_admission_cap and cap is not None and cap < wanted:
            wanted = cap
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return wanted - held if wanted > held else 0  # running: no new hit
        gone = self.get_num_skipped_tokens(total_computed_tokens) // size
        covered = max(gone, len(new_computed_blocks) + held)
        fresh = wanted - covered if wanted > covered else 0
        reclaimed = 0
        for block in new_computed_blocks[max(0, gone - held):]:
            if not block.ref_cnt and not block.is_null:
                reclaimed += 1
        if new_computed_blocks and num_local_computed_tokens % size:
            fresh += 1
        return fresh + reclaimed

    # -- taking a hit and external blocks -------------------------------------------

    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int) -> None:
        """A new request takes its prefix hit: blocks the window has already
        left become null entries, the others gain this request as a holder."""
        table = self.req_to_blocks.setdefault(request_id, [])
        if table:
            raise AssertionError(f"request {request_id} holds blocks already; "
                                 "only a new request takes a prefix hit")
        size = self.block_size
        gone = self.get_num_skipped_tokens(
            num_local_computed_tokens + num_external_computed_tokens) // size
        kept = new_computed_blocks[gone:] if gone > 0 else new_computed_blocks
        if self.enable_caching:
            self.block_pool.touch(kept)
        elif kept:
            raise AssertionError("a prefix hit while prefix caching is off")
        if gone > 0:
            table += [self._null_block] * gone
        table += kept
        if kept and num_local_computed_tokens % size:
            # The hit ends inside its last block: that block is written on by
            # its owner, so this request gets a copy before it writes, and the
            # copy is keyed again once full.
            where = num_local_computed_tokens // size
            self._copy_due[request_id] = (where, kept[-1])
            self.num_cached_block[request_id] = where
        else:
            self.num_cached_block[request_id] = len(table)

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int,
                                          record_for_zeroing: bool = True) -> None:
        """Blocks for tokens a KV connector loads into this group (not to be
        zeroed when the load itself writes them: `record_for_zeroing`)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        gone = self.get_num_skipped_tokens(total)
        if self._profile.external_trim_on_skipped_tokens:
            trim = gone > 0
        else:
            trim = gone >= self.block_size
        if trim:
            # Tokens already out of the window need no slot.
            num_external_computed_tokens = min(total - gone, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        table = self.req_to_blocks.setdefault(request_id, [])
        missing = cdiv(total, self.block_size) - len(table)
        grown = self.block_pool.get_new_blocks(missing if missing > 0 else 0)
        table += grown
        if self._records_new and record_for_zeroing:
            self.new_block_ids += [block.block_id for block in grown]

    # -- growing the table --------------------------------------------------------------

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        """Grow the table to `num_tokens` slots. Returns what is new in it,
        a pending private copy first."""
        copy = self._make_due_copy(request_id)
        table = self.req_to_blocks.get(request_id)
        if table is None:
            table = self.req_to_blocks[request_id] = []
        missing = cdiv(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return [] if copy is None else [copy]
        grown = self.block_pool.get_new_blocks(missing)
        table += grown
        if self._records_new:
            self.new_block_ids += [block.block_id for block in grown]
        return grown if copy is None else [copy, *grown]

    def _make_due_copy(self, request_id: str) -> KVCacheBlock | None:
        due = self._copy_due.pop(request_id, None)
        if due is None:
            return None
        copy = self.block_pool.get_new_blocks(1)[0]
        self._swap_in_copy(request_id, due[0], due[1], copy)
        # The copy's id goes to the worker whether or not the group zeroes
        # its new blocks (vLLM lists it unconditionally).
        self.new_block_ids.append(copy.block_id)
        return copy

    def _swap_in_copy(self, request_id: str, index: int, source: KVCacheBlock,
                      copy: KVCacheBlock) -> None:
        """Put `copy` where the shared `source` was in the table. Until the
        worker has copied, neither may be reused: the source keeps the hit's
        reference and the copy carries one for the pair besides the table's."""
        table = self.req_to_blocks[request_id]
        if table[index] is not source or source.ref_cnt <= 0:
            raise AssertionError(f"block {source.block_id} is not the shared block "
                                 f"at {index} of {request_id}")
        table[index] = copy
        self._copies.append((source, copy))
        copy.ref_cnt += 1

    @property
    def records_new_block_ids(self):
        """Whether the worker zeroes this group's new blocks."""
        return self._records_new

    def take_new_block_ids(self) -> BlockIds:
        """The ids handed out since the last call (drained)."""
        taken, self.new_block_ids = self.new_block_ids, []
        return taken

    def take_pending_cow_copies(self) -> list[CopyPair]:
        drained, self._copies = self._copies, []
        return drained

    # -- keying -------------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval: Interval = None,
                     replay_boundaries: Sequence[int] = ()) -> None:
        """Key the blocks the first `num_tokens` tokens fill (those a later hit
        can use; `retention_interval` and `replay_boundaries` thin out the
        sparse kinds, §9.2.1)."""
        if not self._cacheable:
            return
        request_id = request.request_id
        done = self.num_cached_block.get(request_id, 0)
        full = self._num_hashed_blocks(request, num_tokens)
        if done >= full:
            return
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request_id], done, full, self.block_size,
            self.kv_cache_group_id,
            self._block_mask(request, done, full, retention_interval, replay_boundaries),
        )
        self.num_cached_block[request_id] = full

    def _num_hashed_blocks(self, request: Request, num_tokens: int) -> int:
        """Full blocks in the first `num_tokens` tokens that can be keyed: with
        lookahead hashing, only those whose hash exists yet."""
        if self.block_pool.num_hash_lookahead_tokens:
            hashed = len(request.block_hashes) * self.block_pool.hash_block_size
            if hashed < num_tokens:
                num_tokens = hashed
        return num_tokens // self.block_size

    def _block_mask(self, request: Request, start: int, end: int, retention_interval: Interval,
                    replay_boundaries: Sequence[int]) -> list[bool] | None:
        """This group's reachability mask for blocks [start, end) of a request:
        its replay boundaries and, when known, where it stops sharing a
        prefix with cached siblings."""
        junction = request.shared_prefix_boundary
        boundaries = list(replay_boundaries)
        if junction:
            boundaries.append(junction)
            if self.use_eagle and self._profile.eagle_junction_block_below:
                boundaries.append(junction - self.block_size)
        return type(self).reachable_block_mask(
            start, end, self.cache_hit_alignment_tokens, self.kv_cache_spec, self.use_eagle,
            retention_interval, boundaries, self.dcp_world_size)

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, alignment_tokens: int | None,
                             kv_cache_spec: KVCacheSpec, use_eagle: bool,
                             retention_interval: Interval = None,
                             reachable_boundaries: Sequence[int] = (), dcp_world_size: int = 1,
                             final_segment_end_block: int | None = None) -> list[bool] | None:
        """Which of blocks [start_block, end_block) some later hit can use;
        None: all of them (every dense kind)."""
        return None

    # -- boundary states for KV connectors (Mamba "align" only, §9.4.3) -----------------

    def take_pending_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]:
        """(request, group, block, boundary tokens) offered since the last call."""
        return []

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int) -> TailOffer | None:
        """A finishing producer's prompt-tail state: (group, block, boundary)."""
        return None

    # -- releasing ------------------------------------------------------------------------

    def pop_blocks_for_free(self, request_id: str) -> BlockTable:
        """Forget the request; its table, for the caller to free (without its
        leading null entries where the pool leaves the null block alone:
        profile.null_block_refcount)."""
        self.num_cached_block.pop(request_id, None)
        self._copy_due.pop(request_id, None)
        table = self.req_to_blocks.pop(request_id, [])
        if self._profile.null_block_refcount:
            return table
        skipped = null_head_len(table)
        return table[skipped:] if skipped else table

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """How many leading blocks of the request every request with blocks
        in this group holds (cascade attention's shared prefix, releases with
        profile common_prefix_blocks); 0 for kinds whose holder counts do
        not show a shared prefix."""
        if not self.shares_prefix_by_ref_cnt:
            return 0
        holders = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks[running_request_id]:
            if block.ref_cnt != holders:
                break
            count += 1
        return count

    def free(self, request_id: str) -> None:
        table = self.pop_blocks_for_free(request_id)
        if table:
            # Last block first: a prefix is more likely to be shared than its
            # tail, so the tail should be evicted before it.
            self.block_pool.free_blocks(reversed(table))

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Free the blocks no later token reads, leaving null entries."""
        if not self.skips_tokens:
            return
        gone = self.get_num_skipped_tokens(num_computed_tokens)
        if gone <= 0:
            return
        table = self.req_to_blocks.get(request_id, ())
        self._remove_blocks_in_range(request_id, 0, min(gone // self.block_size, len(table)))

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """Free table entries [first, last), newest first, up to the first null
        (an earlier pass freed everything before it)."""
        table = self.req_to_blocks.get(request_id)
        if table is None:
            return
        null = self._null_block
        freed = []
        for index in range(min(last, len(table)) - 1, first - 1, -1):
            block = table[index]
            if block is null:
                break
            freed.append(block)
            table[index] = null
        if freed:
            self.block_pool.free_blocks(freed, skipped=True)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens no later token attends to."""
        return 0

    def new_step_starts(self) -> None:
        """The scheduler starts a new step."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence, max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: BlockPool,
                               kv_cache_spec: KVCacheSpec, alignment_tokens: int,
                               dcp_world_size: int = 1, pcp_world_size: int = 1, *,
                               drop_eagle_block: bool = False) -> HitResult:
        """The longest prefix of at most `max_length` tokens, a multiple of
        `alignment_tokens`, that every group of `kv_cache_group_ids` has
        cached: its blocks per group (null where the kind needs none) and
        its length in tokens. `drop_eagle_block`: the hit then ends one unit
        early, for an EAGLE drafter (specs §15)."""
        raise NotImplementedError(f"{cls.__name__} has no prefix lookup")
