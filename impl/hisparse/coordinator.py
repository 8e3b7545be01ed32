"""Which HiSparse pages are on the GPU, and what the worker must copy (vLLM's
name: HiSparseCoordinator); specs/KV_CACHE_MANAGER.md §14.3-14.4.

The GPU pages of a host-backed request are a write-back cache of its host
pages. A page is *dirty* until its host copy is complete, then *clean*; a
clean page whose request can read from the host (it holds a hot region in
every hot group) gives its allocation reference back to the pool: the block
is free, yet still read until the pool hands it out again, and then the
request reads that page from the host. Host pages become findable by prefix
lookups only once the whole prefix up to them is durable.

The worker hears of all this through the calls its connector makes each
step: `advance_scheduled`, `build_offload_command`, `build_row_mirrors`,
`take_residency_updates`, `all_context_pages_resident`, and back
`update_spills` / `finish_host_import` / `release_completed_host_copies`.

That is the overlay shape (0.32+). In the table-rows shape (0.31; the
profile's `hisparse_residency`, spec §14.6) residency changes rewrite the
resident tables themselves, each allocation's cache step does the step's
work, and the worker re-reads whole rows (`take_block_table_updates`).
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from impl.block import BlockList, KVCacheBlock
from impl.hisparse.specs import HiSparseResidentSpec
from impl.hisparse.types import (
    ACTIVE_TAIL_PAGES,
    HostBlockCopy,
    SparseKVOffloadCommand,
    SparseKVPageTransfer,
    SparseKVResidencyUpdate,
    SparseKVRowMirror,
)
from impl.kv_cache_spec import KVCacheConfig
from impl.managers.base import CopyPair, SingleTypeKVCacheManager
from impl.managers.hisparse import (
    HiSparseHotManager,
    HiSparseResidentManager,
    HiSparseSourceManager,
)
from impl.math_utils import cdiv
from impl.profiles import HiSparseResidency
from impl.request import Request

Page = tuple[str, int]  # (request id, page index)


@dataclass(slots=True)
class _Publication:
    """Host pages of a request waiting to become findable."""

    request: Request
    num_computed_tokens: int
    num_pages: int
    # Set when a finished request leaves with writes in flight: the host
    # blocks kept for it, and how many of them were keyed already.
    detached: BlockList | None = None
    num_cached_blocks: int = 0


@dataclass(slots=True)
class RequestResidency:
    """One request's pages (spec §14.4)."""

    # Pages whose host copy is complete (clean).
    valid_pages: set[int] = field(default_factory=set)
    # Pages 0 .. n-1 are all valid: the durable prefix.
    ready_prefix_pages: int = 0
    # page -> transfer id of its write-back or restore in flight.
    in_flight: dict[int, int] = field(default_factory=dict)
    publication: _Publication | None = None
    # Pages whose GPU copies are indexed for later hits (a prefix).
    indexed_pages: int = 0
    # Clean pages still holding their allocation reference.
    clean_pinned: set[int] = field(default_factory=set)
    # Clean pages whose reference went back to the pool (still read).
    unpinned_pages: set[int] = field(default_factory=set)
    # Prefix pages (of a hit) to point at surviving GPU copies.
    adopt_pages: int = 0
    # The worker knows where pages < synced_pages are read from, except the
    # stale ones (changed since).
    synced_pages: int = 0
    stale_pages: set[int] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class _Transfer:
    """A transfer the worker was (or will be) told of, until it completes."""

    transfer_id: int
    page: Page
    owner: RequestResidency
    host_block: KVCacheBlock
    gpu_blocks: tuple[KVCacheBlock, ...]
    restore: bool
    # Worker completions it waits for (0: not yet known), and those seen.
    awaited: int = 0
    seen: int = 0
    # Whether its hold on the GPU blocks was given back.
    gpu_released: bool = False


class HiSparseCoordinator:
    def __init__(self, kv_cache_config: KVCacheConfig,
                 managers: tuple[SingleTypeKVCacheManager, ...], max_model_len: int, *,
                 num_reprefillable_tokens: int = 0,
                 residency: HiSparseResidency = HiSparseResidency.OVERLAY) -> None:
        self.managers = managers
        self.max_model_len = max_model_len
        self.num_reprefillable_tokens = num_reprefillable_tokens
        # Table-rows shape: the resident tables are rewritten in place and
        # each allocation's cache step does the step's work (§14.6).
        self.table_rows = residency is HiSparseResidency.TABLE_ROWS
        # Requests whose table rows changed since the worker last read them.
        self.rewritten_rows: set[str] = set()
        resident: list[HiSparseResidentManager] = []
        hot: list[HiSparseHotManager] = []
        resident_ids: list[int] = []
        for group_id, (group, manager) in enumerate(zip(kv_cache_config.kv_cache_groups,
                                                        managers)):
            is_resident = isinstance(group.kv_cache_spec, HiSparseResidentSpec)
            if is_resident and not isinstance(manager, HiSparseResidentManager):
                raise TypeError(f"group {group_id} has a resident spec but a "
                                f"{type(manager).__name__}")
            if is_resident:
                resident.append(manager)
                resident_ids.append(group_id)
                manager.residency_in_table = self.table_rows
                if self.table_rows:
                    # Its cache step runs the step's work: called caching or not.
                    manager.enable_caching = True
            elif isinstance(manager, HiSparseHotManager):
                hot.append(manager)
            else:
                continue
            if group.host_resident:
                raise AssertionError(f"group {group_id} is a device group and cannot be "
                                     "host resident")
            manager.coordinator = self
        self.resident_managers: tuple[HiSparseResidentManager, ...] = tuple(resident)
        self.hot_managers: tuple[HiSparseHotManager, ...] = tuple(hot)
        self.host_manager: HiSparseSourceManager | None = None
        self.host_group_id: int | None = None
        for group_id, manager in enumerate(managers):
            if not isinstance(manager, HiSparseSourceManager):
                continue
            if self.host_manager is not None:
                raise ValueError("HiSparse takes one source group; found another at "
                                 f"group {group_id}")
            if kv_cache_config.hisparse_host_num_blocks is None:
                raise ValueError("the HiSparse source group has no host pool "
                                 "(hisparse_host_num_blocks is unset)")
            self.host_group_id, self.host_manager = group_id, manager
            manager.coordinator = self
            manager.bind_host_pool(kv_cache_config.hisparse_host_num_blocks)
        self.has_host_cache = self.host_manager is not None
        self.max_spill_pages = 0
        self.gpu_pool = None
        self.transition_watermark = 0
        if resident:
            self._check_layout(resident_ids)
            page = resident[0].block_size
            self.max_spill_pages = max_model_len // page
            self.gpu_pool = resident[0].block_pool
            # Below this many free device blocks requests move to reading from
            # the host, so that admissions find reusable pages, not pinned ones.
            self.transition_watermark = max(sum(m.blocks_per_request for m in hot),
                                            kv_cache_config.num_blocks // 10)
        self.spills_to_send: list[SparseKVPageTransfer] = []
        self.pending_spills: dict[int, _Transfer] = {}
        self.request_states: dict[str, RequestResidency] = {}
        self.next_spill_id = 0
        # Key of a findable host page -> its GPU copies (one per resident
        # group), readable until the pool reuses them: a later hit on the
        # page can read it from the GPU again.
        self.copies: dict[bytes, tuple[KVCacheBlock, ...]] = {}
        self._copy_key_of: dict[int, bytes] = {}
        # Unpinned device block id -> the (request, page)s reading it.
        self._readers: dict[int, set[Page]] = {}
        # request -> prefix length a connector is still loading into host pages.
        self._imports: dict[str, int] = {}
        # Requests found with every page on the GPU (forgotten when that may change).
        self._all_resident: set[str] = set()
        # Host copy-on-write pairs handed to the worker, by copy id.
        self._host_copies: dict[int, CopyPair] = {}

    def _check_layout(self, resident_ids: list[int]) -> None:
        if self.host_manager is None:
            raise AssertionError("resident groups need the HiSparse source group")
        if self.host_group_id > min(resident_ids):
            raise ValueError("the HiSparse source group must come before the resident groups")
        sizes = {m.block_size for m in self.resident_managers}
        if len(sizes) > 1:
            raise ValueError(f"HiSparse resident groups of several block sizes: {sorted(sizes)}")
        if self.host_manager.block_size not in sizes:
            raise ValueError(f"host blocks of {self.host_manager.block_size} tokens for "
                             f"resident pages of {sizes.pop()}")

    def _state(self, request_id: str) -> RequestResidency:
        state = self.request_states.get(request_id)
        if state is None:
            state = self.request_states[request_id] = RequestResidency()
        return state

    def _host_table(self, request_id: str) -> BlockList:
        return self.host_manager.req_to_blocks.get(request_id, [])

    def get_host_block_pool(self):
        return None if self.host_manager is None else self.host_manager.block_pool

    # -- hits and host copies --

    def commit_computed_blocks(self, request_id: str, num_host_pages: int) -> None:
        """A new request took a local hit of `num_host_pages` host pages."""
        self._all_resident.discard(request_id)
        if not self.resident_managers or self.host_manager is None:
            return
        n = min(num_host_pages, len(self._host_table(request_id)))
        if not n:
            return
        state = self._state(request_id)
        state.valid_pages.update(range(n))
        state.ready_prefix_pages = max(state.ready_prefix_pages, n)
        # Adopting GPU copies takes blocks out of the free queue, which the
        # admitting allocation counted on: it waits for update_residency.
        state.adopt_pages = max(state.adopt_pages, n)
        state.indexed_pages = max(state.indexed_pages, n)

    def take_host_block_copies(self) -> tuple[HostBlockCopy, ...]:
        """The host copy-on-write copies due; both ends stay held until the
        worker reports them done."""
        if self.host_manager is None:
            return ()
        pairs = self.host_manager.take_host_cow_copies()
        for source, copy in pairs:
            self._host_copies[copy.block_id] = (source, copy)
        return tuple(HostBlockCopy(source.block_id, copy.block_id) for source, copy in pairs)

    def release_completed_host_copies(self, dst_block_ids: Iterable[int]) -> None:
        ends: BlockList = []
        for copy_id in dst_block_ids:
            pair = self._host_copies.pop(copy_id, None)
            if pair is not None:
                ends += pair
        if ends:
            self.host_manager.block_pool.free_blocks(ends[::-1])

    # -- GPU copies of findable host pages --

    def _adopt_copies(self, request_id: str, state: RequestResidency,
                      host_blocks: BlockList) -> None:
        """Point host-only prefix pages at surviving GPU copies of them."""
        if not self.copies:
            return
        for page, host_block in enumerate(host_blocks):
            if host_block.is_null or host_block.block_hash is None:
                continue
            copies = self.copies.get(host_block.block_hash)
            if copies is None:
                continue
            for manager, block in zip(self.resident_managers, copies):
                if not manager.adopt_resident_page(request_id, page, block):
                    continue
                manager.block_pool.touch([block])
                state.clean_pinned.add(page)
                if page < state.synced_pages:
                    state.stale_pages.add(page)

    def _index_copies(self, request_id: str, num_tokens: int) -> None:
        """Remember the GPU copies of host pages just made findable."""
        if not self.resident_managers:
            return
        host = self._host_table(request_id)
        if not host:
            return
        state = self._state(request_id)
        upto = min(num_tokens // self.host_manager.block_size, len(host))
        for page in range(state.indexed_pages, upto):
            if page not in state.in_flight:
                self._index_copy(request_id, page, host[page])
        if upto > state.indexed_pages:
            state.indexed_pages = upto

    def _index_copy(self, request_id: str, page: int, host_block: KVCacheBlock) -> None:
        key = host_block.block_hash
        if host_block.is_null or key is None:
            return
        found = []
        for manager in self.resident_managers:
            block = manager.get_resident_page(request_id, page)
            if block is None:
                return
            found.append(block)
        self._forget_copy(key)
        self.copies[key] = tuple(found)
        for block in found:
            self._copy_key_of[block.block_id] = key

    def _forget_copy(self, key: bytes) -> None:
        for block in self.copies.pop(key, ()):
            self._copy_key_of.pop(block.block_id, None)

    # -- pinning, unpinning, losing pages --

    def _can_read_from_host(self, request_id: str) -> bool:
        hot = self.hot_managers
        return bool(hot) and all(m.has_hot(request_id) for m in hot)

    def _fills_admission_window(self, request_id: str) -> bool:
        """Whether the request holds as many pages as it was admitted with
        (older ones were expected to move to the host by then)."""
        for manager in self.resident_managers:
            if len(manager.req_to_blocks.get(request_id, ())) >= \
                    manager.max_admission_blocks_per_request:
                return True
        return False

    def _releasable_blocks(self, request_id: str, page: int) -> list[KVCacheBlock] | None:
        """The page's GPU block in every resident group, unless the page is
        missing somewhere or near the table's end (a step may write it)."""
        found = []
        for manager in self.resident_managers:
            length = len(manager.req_to_blocks.get(request_id, ()))
            block = manager.get_resident_page(request_id, page)
            if block is None or page >= length - ACTIVE_TAIL_PAGES:
                return None
            found.append(block)
        return found

    def _unpin_page(self, request_id: str, state: RequestResidency, page: int) -> bool:
        if page in state.in_flight or page not in state.valid_pages:
            return False
        blocks = self._releasable_blocks(request_id, page)
        if blocks is None:
            return False
        for manager, block in zip(self.resident_managers, blocks):
            self._readers.setdefault(block.block_id, set()).add((request_id, page))
            manager.block_pool.unpin_blocks([block], self._block_reused)
        state.clean_pinned.discard(page)
        state.unpinned_pages.add(page)
        return True

    def _page_became_clean(self, request_id: str, state: RequestResidency, page: int) -> None:
        state.clean_pinned.add(page)
        if self._can_read_from_host(request_id):
            self._unpin_page(request_id, state, page)

    def _block_reused(self, block: KVCacheBlock) -> None:
        """The pool handed out an unpinned block: its readers lose the page."""
        key = self._copy_key_of.get(block.block_id)
        if key is not None:
            self._forget_copy(key)
        for request_id, page in self._readers.pop(block.block_id, ()):
            self._lose_page(request_id, page)

    def _lose_page(self, request_id: str, page: int) -> None:
        self._all_resident.discard(request_id)
        state = self.request_states.get(request_id)
        if state is None:
            return
        for manager in self.resident_managers:
            block = manager.drop_resident_page(request_id, page)
            if block is not None:
                readers = self._readers.get(block.block_id)
                if readers is not None:
                    readers.discard((request_id, page))
        state.unpinned_pages.discard(page)
        if page < state.synced_pages:
            state.stale_pages.add(page)
        if self.table_rows:
            self.rewritten_rows.add(request_id)
        for manager in self.hot_managers:
            manager.require_hot(request_id)

    def update_residency(self, request_id: str) -> None:
        """A scheduled request's pages this step: adopt surviving copies of a
        hit, then either keep everything pinned (the pool is not short and the
        request is inside its admission window), ask for a hot region, or, with
        one, give back every clean page."""
        if not self.resident_managers:
            return
        state = self._state(request_id)
        if state.adopt_pages:
            self._adopt_copies(request_id, state,
                               self._host_table(request_id)[:state.adopt_pages])
            state.adopt_pages = 0
        if self._can_read_from_host(request_id):
            for page in sorted(state.clean_pinned, reverse=True):
                self._unpin_page(request_id, state, page)
            return
        if (self.gpu_pool.get_num_free_blocks() < self.transition_watermark
                or self._fills_admission_window(request_id)):
            for manager in self.hot_managers:
                manager.require_hot(request_id)

    # -- write-backs, restores and publication --

    def advance_scheduled(self, requests: Iterable[tuple[str, int]]) -> None:
        """Each (request, tokens computed once this step is done): plan its
        write-backs, then its residency. The last reprefillable tokens are
        not final and are not written back."""
        if not self.resident_managers:
            return
        skip = self.num_reprefillable_tokens
        for request_id, num_tokens in requests:
            self.plan_prefix_materialization(request_id, max(0, num_tokens - skip))
            self.update_residency(request_id)

    def cache_step(self, request_id: str, num_tokens: int) -> None:
        """A resident group's cache step of an allocation (`num_tokens` the
        tokens it may key): in the table-rows shape the step's work, as
        `advance_scheduled` does it in the overlay shape; else nothing."""
        if self.table_rows:
            self.plan_prefix_materialization(request_id, num_tokens)
            self.update_residency(request_id)

    def plan_prefix_materialization(self, request_id: str, num_computed_tokens: int) -> None:
        """Queue a write-back of every full page with no host copy yet, within
        the step's budget of transfers."""
        if not self.resident_managers:
            return
        size = self.host_manager.block_size
        state = self._state(request_id)
        budget = self.max_spill_pages - len(self.spills_to_send)
        first = max(state.ready_prefix_pages, cdiv(self._imports.get(request_id, 0), size))
        for page in range(first, num_computed_tokens // size):
            if budget <= 0:
                break
            if page in state.in_flight or page in state.valid_pages:
                continue
            if any(m.get_resident_page(request_id, page) is None for m in self.resident_managers):
                continue
            if self._plan_transfer(request_id, page, after_forward=True):
                budget -= 1

    def _plan_transfer(self, request_id: str, page: int, *, after_forward: bool,
                       restore: bool = False) -> bool:
        state = self._state(request_id)
        if page in state.in_flight:
            return False
        host = self.host_manager.req_to_blocks.get(request_id)
        if host is None or page >= len(host) or host[page].is_null:
            return False
        gpu = []
        for manager in self.resident_managers:
            block = manager.get_resident_page(request_id, page)
            if block is None:
                return False
            gpu.append(block)
        host_block = host[page]
        # Both ends stay held until the transfer is done.
        self.host_manager.block_pool.touch([host_block])
        for manager, block in zip(self.resident_managers, gpu):
            manager.block_pool.touch([block])
        transfer_id = self.next_spill_id
        self.next_spill_id += 1
        self.pending_spills[transfer_id] = _Transfer(
            transfer_id, (request_id, page), state, host_block, tuple(gpu), restore)
        state.in_flight[page] = transfer_id
        self.spills_to_send.append(SparseKVPageTransfer(
            transfer_id, host_block.block_id, tuple(b.block_id for b in gpu), after_forward,
            restore))
        return True

    def publish_when_ready(self, request: Request, num_computed_tokens: int) -> None:
        """The source group's cache_blocks: make findable what is durable now,
        the rest as it becomes durable."""
        if self.host_manager is None:
            return
        request_id = request.request_id
        self._state(request_id).publication = _Publication(
            request, num_computed_tokens, num_computed_tokens // self.host_manager.block_size)
        self._publish_ready(request_id)

    def _publish_ready(self, request_id: str) -> None:
        """Key the durable part of the request's publication (host writes lag
        a prefill by about a chunk: waiting for all of it would publish nothing
        of a prefill preempted on the way)."""
        state = self.request_states.get(request_id)
        if state is None or state.publication is None:
            return
        pending = state.publication
        durable = min(pending.num_computed_tokens,
                      state.ready_prefix_pages * self.host_manager.block_size)
        self.host_manager.publish_blocks(pending.request, durable)
        self._index_copies(request_id, durable)
        if state.ready_prefix_pages >= pending.num_pages:
            state.publication = None

    def record_pending_host_import(self, request_id: str, num_tokens: int) -> None:
        self._all_resident.discard(request_id)
        self._imports[request_id] = num_tokens

    def finish_host_import(self, request_id: str, *, failed: bool) -> None:
        num_tokens = self._imports.pop(request_id, None)
        if num_tokens is not None and not failed:
            self.complete_host_import(request_id, num_tokens)

    def complete_host_import(self, request_id: str, num_computed_tokens: int) -> None:
        """A connector filled the host pages of the first tokens: the full
        ones are durable; the page of the last token is restored to the GPU
        (it is recomputed or written next)."""
        if not self.resident_managers:
            return
        size = self.resident_managers[0].block_size
        full = num_computed_tokens // size
        state = self._state(request_id)
        state.valid_pages = set(range(full))
        state.ready_prefix_pages = full
        if num_computed_tokens:
            self._plan_transfer(request_id, (num_computed_tokens - 1) // size,
                                after_forward=False, restore=True)
        self._publish_ready(request_id)

    # -- what the worker is told --

    def build_row_mirrors(self, requests: Iterable[tuple[str, int, int]]
                          ) -> tuple[SparseKVRowMirror, ...]:
        """For each (request, first token, count): the GPU rows those tokens
        are written to, page by page, and where they go in the host pages."""
        if not self.resident_managers or self.host_manager is None:
            return ()
        size = self.resident_managers[0].block_size
        mirrors: list[SparseKVRowMirror] = []
        for request_id, start, count in requests:
            host = self.host_manager.req_to_blocks.get(request_id)
            if host is None or any(request_id not in m.req_to_blocks
                                   for m in self.resident_managers):
                continue
            end = start + count
            position = start
            while position < end:
                page, offset = divmod(position, size)
                rows = min(size - offset, end - position)
                position += rows
                # A page missing at either end is skipped alone: its
                # neighbours in the span still need their rows mirrored.
                sources = []
                for manager in self.resident_managers:
                    block = manager.get_resident_page(request_id, page)
                    if block is None:
                        break
                    sources.append(block.block_id * size + offset)
                else:
                    if page < len(host) and not host[page].is_null:
                        mirrors.append(SparseKVRowMirror(
                            tuple(sources), host[page].block_id * size + offset, rows))
        return tuple(mirrors)

    def all_context_pages_resident(self, requests: Iterable[tuple[str, int, int]]) -> bool:
        """Whether every (request, first token, count) reads only GPU pages."""
        if not self.resident_managers:
            return False
        first = self.resident_managers[0]
        if self.table_rows:
            # Only the span's pages are looked at, afresh each time.
            return all(m.get_resident_page(request_id, page) is not None
                       for request_id, start, count in requests
                       for page in range(cdiv(start + count, first.block_size))
                       for m in self.resident_managers)
        for request_id, start, count in requests:
            if len(first.req_to_blocks.get(request_id, ())) < cdiv(start + count,
                                                                   first.block_size):
                return False
            if request_id in self._all_resident:
                continue
            for manager in self.resident_managers:
                if any(b.is_null for b in manager.get_residency_row(request_id)):
                    return False
            self._all_resident.add(request_id)
        return True

    def take_residency_updates(self, request_ids: Iterable[str]
                               ) -> dict[str, SparseKVResidencyUpdate]:
        """Where the worker must read pages it does not know yet: the stale
        ones and those added since the last update."""
        updates: dict[str, SparseKVResidencyUpdate] = {}
        if not self.resident_managers:
            return updates
        first = self.resident_managers[0]
        for request_id in request_ids:
            state = self._state(request_id)
            length = len(first.req_to_blocks.get(request_id, ()))
            since = state.synced_pages
            if not state.stale_pages and since >= length:
                continue
            stale = sorted(state.stale_pages)
            per_group = []
            for manager in self.resident_managers:
                null_id = manager.block_pool.null_block.block_id
                ids = []
                for page in stale:
                    block = manager.get_resident_page(request_id, page)
                    ids.append(null_id if block is None else block.block_id)
                ids += [b.block_id for b in manager.get_residency_row(request_id, since)]
                per_group.append(ids)
            updates[request_id] = SparseKVResidencyUpdate(
                [*stale, *range(since, length)], tuple(per_group))
            state.stale_pages.clear()
            state.synced_pages = length
        return updates

    def take_block_table_updates(self) -> dict[str, tuple[list[int], ...]]:
        """(Table-rows shape.) Each request whose resident table lost a page
        since the last call: its block ids in every group, in group order.
        The overlay shape rewrites no table: always empty there."""
        updates = {}
        for request_id in self.rewritten_rows:
            updates[request_id] = tuple(
                [block.block_id for block in m.req_to_blocks.get(request_id, ())]
                for m in self.managers)
        self.rewritten_rows.clear()
        return updates

    def build_offload_command(self) -> SparseKVOffloadCommand | None:
        if not self.resident_managers:
            return None
        queued, self.spills_to_send = self.spills_to_send, []
        return SparseKVOffloadCommand(queued)

    def has_pending_reclamation(self) -> bool:
        """Whether a transfer in flight frees device or host blocks once done."""
        for transfer in self.pending_spills.values():
            if transfer.host_block.ref_cnt == 1:
                return True
            request_id = transfer.page[0]
            if request_id in self.request_states and self._can_read_from_host(request_id):
                return True
        return False

    def has_pending_work(self) -> bool:
        return bool(self.spills_to_send or self.pending_spills or self._host_copies)

    # -- what the worker reports --

    def update_spills(self, enqueued_counts: Mapping[int, int],
                      completed_counts: Mapping[int, int]) -> None:
        """Per transfer id: how many workers run it (first report wins), and
        how many more finished it."""
        for transfer_id, count in enqueued_counts.items():
            transfer = self.pending_spills.get(transfer_id)
            if transfer is not None and not transfer.awaited:
                transfer.awaited = count
        for transfer_id, count in completed_counts.items():
            transfer = self.pending_spills.get(transfer_id)
            if transfer is not None:
                transfer.seen += count
        done = []
        for transfer in self.pending_spills.values():
            if transfer.gpu_released:
                done.append(transfer)
            elif transfer.awaited and transfer.seen >= transfer.awaited:
                for manager, block in zip(self.resident_managers, transfer.gpu_blocks):
                    manager.block_pool.free_blocks([block])
                transfer.gpu_released = True
                done.append(transfer)
        self._finish_transfers(done)

    def _finish_transfers(self, done: list[_Transfer]) -> None:
        # A set, filled in completion order: the requests are then published
        # in the order vLLM's set of them iterates in (the same process hash).
        touched: set[str] = set()
        for transfer in done:
            del self.pending_spills[transfer.transfer_id]
            request_id, page = transfer.page
            state = transfer.owner
            state.in_flight.pop(page, None)
            if self.request_states.get(request_id) is state:
                if not transfer.restore:
                    state.valid_pages.add(page)
                if page in state.valid_pages:
                    self._page_became_clean(request_id, state, page)
                    if transfer.restore:
                        self._index_copy(request_id, page, transfer.host_block)
                touched.add(request_id)
            elif state.publication is not None:
                if not transfer.restore:
                    state.valid_pages.add(page)
                self._publish_detached(state)
            self.host_manager.block_pool.free_blocks([transfer.host_block])
        for request_id in touched:
            state = self.request_states[request_id]
            while state.ready_prefix_pages in state.valid_pages:
                state.ready_prefix_pages += 1
            self._publish_ready(request_id)

    def _publish_detached(self, state: RequestResidency) -> None:
        """A finished request's pages once none is in flight: key the durable
        prefix in the host pool, then let go of the blocks kept for it."""
        pending = state.publication
        if pending is None or state.in_flight or pending.detached is None:
            return
        while state.ready_prefix_pages in state.valid_pages:
            state.ready_prefix_pages += 1
        host = self.host_manager
        host.block_pool.cache_full_blocks(
            pending.request, pending.detached, pending.num_cached_blocks,
            min(state.ready_prefix_pages, pending.num_pages), host.block_size,
            host.kv_cache_group_id)
        host.block_pool.free_blocks(pending.detached[::-1])
        state.publication = None

    # -- a request leaves --

    def forget_request(self, request_id: str) -> None:
        """(vLLM's name: free.) Forget the request. Its clean pages stay in the pool as readable
        copies; only what is finished and durable can still be published."""
        self._all_resident.discard(request_id)
        self._imports.pop(request_id, None)
        state = self.request_states.pop(request_id, None)
        if state is None:
            return
        pending = state.publication
        if pending is not None and pending.request.is_finished() and state.in_flight:
            host = self.host_manager
            pending.detached = host.req_to_blocks[request_id][:pending.num_pages]
            pending.num_cached_blocks = host.num_cached_block.get(request_id, 0)
            # Held until published: another allocation could evict the
            # finished pages while the rest is still being written.
            host.block_pool.touch(pending.detached)
        else:
            # A preempted step may never run: its planned writes prove nothing.
            state.publication = None
        for manager in self.resident_managers:
            row = manager.get_residency_row(request_id)
            for page in range(len(row) - 1, -1, -1):
                block = row[page]
                if block.is_null:
                    continue
                if page in state.unpinned_pages:
                    readers = self._readers.get(block.block_id)
                    if readers is not None:
                        readers.discard((request_id, page))
                elif page in state.valid_pages and page not in state.in_flight:
                    manager.block_pool.unpin_blocks([block], self._block_reused)
                else:
                    continue
                manager.drop_resident_page(request_id, page)


def attach_hisparse(kv_cache_config: KVCacheConfig,
                    managers: tuple[SingleTypeKVCacheManager, ...], max_model_len: int,
                    num_reprefillable_tokens: int,
                    residency: HiSparseResidency = HiSparseResidency.OVERLAY,
                    ) -> HiSparseCoordinator | None:
    """The HiSparse coordinator of a model with HiSparse groups (None without)."""
    if not any(isinstance(m, (HiSparseSourceManager, HiSparseResidentManager,
                              HiSparseHotManager)) for m in managers):
        return None
    coordinator = HiSparseCoordinator(kv_cache_config, managers, max_model_len,
                                      num_reprefillable_tokens=num_reprefillable_tokens,
                                      residency=residency)
    if coordinator.host_manager is None:
        raise ValueError("HiSparse groups without a source group")
    return coordinator


def get_hisparse_coordinator(kv_cache_manager) -> HiSparseCoordinator:
    """The HiSparse coordinator of a KV cache manager (built with it)."""
    found = kv_cache_manager.coordinator.hisparse
    if found is None:
        raise ValueError("this KV cache manager has no HiSparse groups")
    return found
