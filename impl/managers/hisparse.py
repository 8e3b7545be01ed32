"""HiSparse's three managers (vLLM's names: HiSparseSourceManager,
HiSparseHotManager, HiSparseResidentManager); specs/KV_CACHE_MANAGER.md §14.2.

- source: full attention whose blocks are host blocks; it owns prefix caching,
  but its pages become findable only once their host copy is durable;
- resident: the GPU pages of that history; where a page is read from is an
  overlay on the (append-only) table, changed by the coordinator (or, in
  0.31's table-rows shape, the table itself: `residency_in_table`);
- hot: a fixed region a request needs once it reads history from the host.

Each is told its HiSparseCoordinator (`coordinator`) when that is built.
"""

from impl.block import KVCacheBlock
from impl.hisparse.host_pool import make_host_pool
from impl.managers.base import BlockTable, CopyPair, HitResult, SingleTypeKVCacheManager
from impl.managers.full_attention import FullAttentionManager
from impl.math_utils import cdiv
from impl.profiles import HiSparseHostCapacity
from impl.request import Request


def _refuse_hit(blocks, kind: str) -> None:
    if blocks:
        raise AssertionError(f"a {kind} group takes no prefix hit; got {len(blocks)} blocks")


class HiSparseSourceManager(FullAttentionManager):
    # The host tier may hold a longer prefix than the device groups agree on.
    retains_longer_hit = True
    coordinator = None

    # Host blocks are never zeroed on the device: nothing is recorded for the
    # worker, not even a copy-on-write destination (section 16.4).
    @property
    def records_new_block_ids(self) -> bool:
        return False

    def take_new_block_ids(self) -> list[int]:
        self.new_block_ids = []
        return []

    def bind_host_pool(self, num_host_blocks: int) -> None:
        """From now on the group's blocks come from a host pool of its own."""
        host = self.block_pool = make_host_pool(self.block_pool, num_host_blocks,
                                                self.enable_caching and self._cacheable)
        self._null_block = host.null_block

    @property
    def _best_effort(self) -> bool:
        return self._profile.hisparse_host_capacity is HiSparseHostCapacity.BEST_EFFORT

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens, num_local_computed_tokens=0,
                                   num_tokens_main_model=0, apply_admission_cap=False,
                                   prefill_end=0) -> int:
        if self._best_effort:
            # Only loaded pages and a partial hit's copy need host blocks now.
            loads = total_computed_tokens > num_local_computed_tokens
            copies = bool(new_computed_blocks) and num_local_computed_tokens % self.block_size
            if not (loads or copies):
                return 0
            num_tokens = num_tokens_main_model = total_computed_tokens
        host_needed = super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens,
            num_local_computed_tokens, num_tokens_main_model)
        if host_needed <= self.block_pool.get_num_free_blocks():
            return 0  # host blocks never count against the device pool
        device = self.coordinator.gpu_pool
        if device is None:
            raise AssertionError("the host pool ran dry and there is no device pool to refuse by")
        # More than the device pool could ever give: the allocation is refused.
        return device.num_gpu_blocks + 1

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        if not self._best_effort:
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        # As many pages as free host blocks allow, after a due private copy;
        # the rest are null entries.
        held = len(self.req_to_blocks.get(request_id, ()))
        wanted = cdiv(num_tokens, self.block_size)
        free = self.block_pool.get_num_free_blocks() - (request_id in self._copy_due)
        fit = min(wanted, held + max(0, free)) * self.block_size
        fresh = super().allocate_new_blocks(request_id, fit, min(num_tokens_main_model, fit))
        table = self.req_to_blocks.setdefault(request_id, [])
        table += [self._null_block] * (wanted - len(table))
        return fresh

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int,
                                          record_for_zeroing: bool = True) -> None:
        if num_external_computed_tokens > 0:
            # A connector fills these host pages; they count once it reports success.
            hisparse = self.coordinator
            hisparse.record_pending_host_import(
                request_id, num_local_computed_tokens + num_external_computed_tokens)
            super().allocate_external_computed_blocks(
                request_id, num_local_computed_tokens, num_external_computed_tokens,
                record_for_zeroing)

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval=None,
                     replay_boundaries=()) -> None:
        # Full attention keeps every block reachable: retention changes nothing.
        self.coordinator.publish_when_ready(request, num_tokens)

    def publish_blocks(self, request: Request, num_tokens: int) -> None:
        """Key the host blocks the first `num_tokens` tokens fill."""
        FullAttentionManager.cache_blocks(self, request, num_tokens)

    def take_pending_cow_copies(self) -> list[CopyPair]:
        return []  # host copies go through the coordinator (take_host_block_copies)

    def take_host_cow_copies(self) -> list[CopyPair]:
        drained, self._copies = self._copies, []
        return drained

    def pop_blocks_for_free(self, request_id: str) -> BlockTable:
        self.coordinator.forget_request(request_id)
        table = super().pop_blocks_for_free(request_id)
        return table


class _DeviceOnlyManager(SingleTypeKVCacheManager):
    """Groups that are neither keyed nor looked up: the source group holds
    the history prefix caching finds."""

    coordinator = None

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval=None,
                     replay_boundaries=()) -> None:
        return None

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, alignment_tokens, dcp_world_size=1,
                               pcp_world_size=1, *, drop_eagle_block=False) -> HitResult:
        return tuple([] for _group in kv_cache_group_ids), 0


class HiSparseHotManager(_DeviceOnlyManager):
    def __init__(self, spec, *args, **kwargs) -> None:
        super().__init__(spec, *args, **kwargs)
        self.blocks_per_request = spec.blocks_per_request
        # Requests whose region must be allocated at their next allocation.
        self.hot_required = set[str]()

    def require_hot(self, req_id: str) -> None:
        self.hot_required.add(req_id)

    def has_hot(self, req_id: str) -> bool:
        return len(self.req_to_blocks.get(req_id, ())) == self.blocks_per_request

    def get_num_required_blocks(self, req_id: str) -> int:
        missing = self.blocks_per_request - len(self.req_to_blocks.get(req_id, ()))
        return missing if missing > 0 else 0

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens, num_local_computed_tokens=0,
                                   num_tokens_main_model=0, apply_admission_cap=False,
                                   prefill_end=0) -> int:
        _refuse_hit(new_computed_blocks, "hot")
        # Reading host history needs the region: a load, a fresh request taking
        # a local hit, or a request already told to move to the host.
        reads_host = (total_computed_tokens > num_local_computed_tokens
                      or (num_local_computed_tokens > 0
                          and request_id not in self.num_cached_block)
                      or request_id in self.hot_required)
        return self.get_num_required_blocks(request_id) if reads_host else 0

    def add_local_computed_blocks(self, request_id, new_computed_blocks,
                                  num_local_computed_tokens, num_external_computed_tokens):
        _refuse_hit(new_computed_blocks, "hot")
        self.num_cached_block.setdefault(request_id, 0)
        # Without resident pages every request reads from the host.
        host_only = not self.coordinator.resident_managers
        if host_only or num_local_computed_tokens > 0:
            self.require_hot(request_id)

    def allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                          num_external_computed_tokens, record_for_zeroing=True):
        self.require_hot(request_id)

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        # A request admitted without a hit reaches here first: it runs now.
        self.num_cached_block.setdefault(request_id, 0)
        missing = 0
        if request_id in self.hot_required:
            region = self.req_to_blocks.setdefault(request_id, [])
            missing = self.blocks_per_request - len(region)
        if missing <= 0:
            return []
        fresh = self.block_pool.get_new_blocks(missing)
        region += fresh
        return fresh

    def pop_blocks_for_free(self, request_id: str) -> BlockTable:
        self.hot_required.discard(request_id)
        table = super().pop_blocks_for_free(request_id)
        return table


class HiSparseResidentManager(_DeviceOnlyManager):
    # Set by the coordinator: residency changes rewrite the table itself
    # (table-rows shape) instead of an overlay on it.
    residency_in_table = False

    def __init__(self, spec, *args, **kwargs) -> None:
        super().__init__(spec, *args, **kwargs)
        # request -> {page: block it is read from now}, over its table; the
        # null block there means the page is read from the host.
        self._overlay: dict[str, dict[int, KVCacheBlock]] = {}

    def _set_page(self, req_id: str, page: int, block: KVCacheBlock) -> None:
        if self.residency_in_table:
            self.req_to_blocks[req_id][page] = block
        else:
            self._overlay.setdefault(req_id, {})[page] = block

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval=None,
                     replay_boundaries=()) -> None:
        # Nothing is keyed here; the coordinator may run the step's work.
        self.coordinator.cache_step(request.request_id, num_tokens)

    # -- where a page is read from ----------------------------------------------------

    def get_resident_page(self, req_id: str, page: int) -> KVCacheBlock | None:
        """The GPU block `page` is read from; None: from the host."""
        table = self.req_to_blocks.get(req_id)
        if table is None or page >= len(table):
            return None
        overlay = self._overlay.get(req_id)
        block = overlay.get(page, table[page]) if overlay else table[page]
        if block.is_null:
            return None
        return block

    def get_residency_row(self, req_id: str, start: int = 0) -> BlockTable:
        """The pages from `start` as they are read now (null: from the host)."""
        row = self.req_to_blocks.get(req_id, [])[start:]
        for page, block in self._overlay.get(req_id, {}).items():
            if page >= start:
                row[page - start] = block
        return row

    def adopt_resident_page(self, req_id: str, page: int, block: KVCacheBlock) -> bool:
        """Read a host-only page from `block`, a GPU copy of it."""
        table = self.req_to_blocks.get(req_id)
        if table is None or page >= len(table) or self.get_resident_page(req_id, page):
            return False
        self._set_page(req_id, page, block)
        return True

    def drop_resident_page(self, req_id: str, page: int) -> KVCacheBlock | None:
        """Read the page from the host from now on; the block it was read from."""
        was = self.get_resident_page(req_id, page)
        if was is not None:
            self._set_page(req_id, page, self._null_block)
        return was

    # -- allocation ---------------------------------------------------------------------

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens, num_local_computed_tokens=0,
                                   num_tokens_main_model=0, apply_admission_cap=False,
                                   prefill_end=0) -> int:
        _refuse_hit(new_computed_blocks, "resident")
        size = self.block_size
        held = len(self.req_to_blocks.get(request_id, ()))
        loading = total_computed_tokens - num_local_computed_tokens
        if loading > 0:
            # A load: only its last page is written on the GPU (it may be
            # recomputed for the next token); the others stay on the host.
            loaded = cdiv(total_computed_tokens, size)
            tail = 0 if self.get_resident_page(request_id, loaded - 1) is not None else 1
            return tail + max(cdiv(num_tokens, size) - max(loaded, held), 0)
        wanted = cdiv(num_tokens, size)
        if apply_admission_cap and wanted > self.max_admission_blocks_per_request:
            wanted = self.max_admission_blocks_per_request
        covered = max(held, cdiv(num_local_computed_tokens, size))
        return wanted - covered if wanted > covered else 0

    def add_local_computed_blocks(self, request_id, new_computed_blocks,
                                  num_local_computed_tokens, num_external_computed_tokens):
        _refuse_hit(new_computed_blocks, "resident")
        table = self.req_to_blocks.setdefault(request_id, [])
        if table:
            raise AssertionError(f"request {request_id} holds resident pages already")
        on_host = cdiv(num_local_computed_tokens, self.block_size)
        table += [self._null_block] * on_host
        self.num_cached_block.setdefault(request_id, 0)
        self.coordinator.commit_computed_blocks(request_id, on_host)

    def allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                          num_external_computed_tokens, record_for_zeroing=True):
        if num_external_computed_tokens < 1:
            raise AssertionError("no tokens to load")
        end = num_local_computed_tokens + num_external_computed_tokens
        table = self.req_to_blocks.setdefault(request_id, [])
        tail = (end - 1) // self.block_size
        if len(table) <= tail:
            table += [self._null_block] * (tail + 1 - len(table))
        if self.get_resident_page(request_id, tail) is None:
            table[tail] = self.block_pool.get_new_blocks(1)[0]

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int = 0) -> BlockTable:
        table = self.req_to_blocks.setdefault(request_id, [])
        missing = cdiv(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return []
        fresh = self.block_pool.get_new_blocks(missing)
        table += fresh
        return fresh

    def pop_blocks_for_free(self, request_id: str) -> BlockTable:
        # The coordinator gives back clean pages first; the row then holds
        # only what the request itself still has to release.
        self.coordinator.forget_request(request_id)
        row = self.get_residency_row(request_id)
        self._overlay.pop(request_id, None)
        SingleTypeKVCacheManager.pop_blocks_for_free(self, request_id)
        return row
