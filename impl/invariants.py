"""What must hold of a KV cache manager after every call; specs/KV_CACHE_MANAGER.md §13.

A broken invariant names an impl bug at the call that causes it, long before
a diverging block id would show it. Two ways to check:

- `check_invariants(manager)`: everything, by walking the whole pool (tests,
  and the first check of a checker);
- `InvariantChecker().check(manager)` after each call: the first time a full
  check, then only what the calls since the last check touched, so a check
  costs the same on a pool of 10^6 blocks as on one of 10^3.
"""

from collections import Counter
from itertools import compress
from operator import is_not

from impl.block import KVCacheBlock
from impl.hisparse.invariants import check_hisparse_invariants
from impl.invariants_kinds import table_rule
from impl.kv_cache_manager import KVCacheManager
from impl.pool_invariants import (
    InvariantViolation,
    check_null_block,
    count_message,
    keys_of,
    stale_entry_message,
    walk_free_queue,
)

# -- the whole state at once -----------------------------------------------------


def check_invariants(manager: KVCacheManager) -> None:
    """Raise InvariantViolation naming the first broken invariant. Cheap
    enough for a fuzz run on a small pool: one walk of the free queue, one of
    the held blocks, a few passes over the pool; messages only on failure."""
    if manager.coordinator.hisparse is not None:
        # Two pools, overlays and transfers: impl/hisparse/invariants.py.
        check_hisparse_invariants(manager)
        return
    pool = manager.block_pool
    queued = walk_free_queue(pool)
    check_null_block(pool, pool.null_block.block_id in queued)
    reserved = _reserved_ids(manager)
    refs = [block.ref_cnt for block in pool.blocks]
    refs[pool.null_block.block_id] = 0  # the null block's count is not kept
    for block_id in queued:
        if refs[block_id]:
            raise InvariantViolation(
                f"block {block_id} ref_cnt={refs[block_id]} but in the free queue")
    lowest = min(refs)
    if lowest < 0:
        raise InvariantViolation(f"block {refs.index(lowest)} has ref_cnt {lowest} < 0")
    if refs.count(0) - 1 - len(reserved) != len(queued):
        lost = next(i for i, r in enumerate(refs) if not r and i != pool.null_block.block_id
                    and i not in queued and i not in reserved)
        raise InvariantViolation(f"block {lost} ref_cnt=0 but not in the free queue")
    held = Counter(block_id for ids in _holders(manager).values() for block_id in ids)
    for block_id, count in held.items():
        if refs[block_id] != count:
            raise InvariantViolation(count_message(block_id, refs[block_id], count))
    if len(refs) - refs.count(0) != len(held):
        stray = next(i for i, r in enumerate(refs) if r > 0 and i not in held)
        raise InvariantViolation(count_message(stray, refs[stray], 0))
    _check_whole_key_map(manager)
    for group in manager.coordinator.single_type_managers:
        for request_id in group.req_to_blocks:
            _check_table_shape(group, request_id)
    _check_boundary_states(manager)
    _check_eagle_groups(manager)
    for group in manager.coordinator.single_type_managers:
        _check_zeroing_ids(pool, group.kv_cache_group_id, group.new_block_ids)


def _check_table_shape(group, request_id: str) -> None:
    """The kind's own rule for a table's shape (impl/invariants_kinds.py)."""
    rule = table_rule(group)
    problem = rule and rule(group.req_to_blocks[request_id])
    if problem:
        raise InvariantViolation(f"group {group.kv_cache_group_id}, {request_id}: {problem}")


def _check_boundary_states(manager: KVCacheManager) -> None:
    """Mamba "align" bookkeeping that outlives a call (§9.4.3): a boundary
    state offered to a connector names a request the group still serves
    (freeing a request withdraws its offers), and a producer's prompt-tail
    record names a block of that request's table. O(offers + producers)."""
    for group in manager.coordinator.single_type_managers:
        tables = group.req_to_blocks
        for request_id, _, block, boundary in getattr(group, "_offers", ()):
            if request_id not in tables:
                raise InvariantViolation(
                    f"boundary state of {request_id} at {boundary} tokens (block "
                    f"{block.block_id}) is offered but the request holds nothing: a freed "
                    "request's offers must be withdrawn")
        for request_id, (block, boundary) in getattr(group, "_producer_tails", {}).items():
            table = tables.get(request_id, ())
            if not any(b is block for b in table):
                raise InvariantViolation(
                    f"{request_id}'s prompt tail at {boundary} tokens names block "
                    f"{block.block_id}, which is not in its table")


def _reserved_ids(manager: KVCacheManager) -> set[int]:
    """Blocks set aside for good (0.17's attention sinks): neither free nor held."""
    return {block.block_id for m in manager.coordinator.single_type_managers
            for block in getattr(m, "sink_blocks", ())}


def _check_whole_key_map(manager: KVCacheManager) -> None:
    """The map points only at blocks carrying that key (primary or extra),
    and every key a block carries is in the map."""
    pool = manager.block_pool
    extra = pool.cached_block_hashes_by_block
    entries = 0
    for key, block in pool.cached_block_hash_to_block.items():
        if block.block_hash != key and key not in extra.get(block.block_id, ()):
            raise InvariantViolation(stale_entry_message(key, block))
        entries += 1
    for block_id in extra:
        if pool.blocks[block_id].block_hash is None:
            raise InvariantViolation(f"block {block_id} has partial keys but no hash")
    carried = sum(block.block_hash is not None for block in pool.blocks) + sum(
        len(keys) for keys in extra.values())
    if carried != entries:
        raise InvariantViolation(f"{carried} block keys exist but the map holds {entries}")
    if entries and not manager.enable_caching:
        raise InvariantViolation("blocks are cached while caching is disabled")


def _check_eagle_groups(manager: KVCacheManager) -> None:
    """Only draft groups drop the last unit of a hit for EAGLE, and groups
    looked up together drop together (their hits are one answer)."""
    coordinator = manager.coordinator
    drafts = coordinator.eagle_group_ids
    for group_id in coordinator.drop_eagle_group_ids:
        if group_id not in drafts:
            raise InvariantViolation(f"group {group_id} drops for EAGLE but is no draft group")
    managers = coordinator.single_type_managers
    for batch in getattr(coordinator, "attention_groups", ()):
        flags = {managers[g].use_eagle for g in batch.group_ids}
        if flags != {batch.use_eagle}:
            raise InvariantViolation(f"groups {batch.group_ids}, looked up together, disagree "
                                     f"on dropping for EAGLE")


def _check_zeroing_ids(pool, group_id: int, ids) -> None:
    """Ids recorded for the worker to zero name real blocks, never the null block."""
    for block_id in ids:
        if not 0 <= block_id < len(pool.blocks) or block_id == pool.null_block.block_id:
            raise InvariantViolation(f"group {group_id} records block id {block_id} for "
                                     "zeroing: not a block it could have handed out")


# -- who holds what -------------------------------------------------------------------

_COPY = "<pending copy>"  # not a request id: those come from traces
_PIN = "<pinned for a connector>/"


def _holders(manager: KVCacheManager) -> dict[str, list[int]]:
    """Holder -> ids of the non-null blocks it holds: each (group, request)
    table, each pending copy-on-write pair (source and copy), and each
    request's pinned prompt-tail copies (0.28's connector hand-off)."""
    out: dict[str, list[int]] = {}
    for group in manager.coordinator.single_type_managers:
        gid = group.kv_cache_group_id
        for request_id, table in group.req_to_blocks.items():
            out[f"{gid}/{request_id}"] = [b.block_id for b in table if not b.is_null]
        for i, (source, copy) in enumerate(group._copies):
            out[f"{gid}/{_COPY}{i}"] = [source.block_id, copy.block_id]
    for request_id, pins in manager._partial_tail_pins.items():
        out[f"{_PIN}{request_id}"] = [b.block_id for b in pins]
    return out


# -- incrementally ----------------------------------------------------------------------


class InvariantChecker:
    """check_invariants once, then, after each call, the invariants of the
    blocks the calls since touched, plus the one rule that needs history:

    a block joins a request's table while another *request* holds it only
    through a prefix hit, so it is keyed right after that call (its key may
    be evicted later; that is legitimate). Pending copy-on-write pairs are
    not requests: a copy is held by its request and its pair, and the source
    of a hit ending inside another running request's block is shared with
    the pair, not the request.

    What it learns from: the block pool's operations (the blocks each one was
    given or returned; the checker wraps them on the instance it watches),
    the block tables (every table's length each check, plus the entries
    where a touched block or a pair's source sat), and the pending pairs.
    Changes made behind the pool's back to blocks no call touched are for
    check_invariants to find.
    """

    def __init__(self) -> None:
        self._manager: KVCacheManager | None = None

    def check(self, manager: KVCacheManager) -> None:
        if manager.coordinator.hisparse is not None:
            check_invariants(manager)  # always whole (see impl/hisparse/invariants.py)
            return
        if manager is not self._manager:
            check_invariants(manager)
            self._watch(manager)
            return
        self._check_since_last()

    # -- the shadow of the state -----------------------------------------------------

    def _watch(self, manager: KVCacheManager) -> None:
        self._manager = manager
        pool = self._pool = manager.block_pool
        self._groups = manager.coordinator.single_type_managers
        self._touched: list[KVCacheBlock] = []
        self._cleared = False
        # (group, request) of the tables that changed since the last check.
        self._reshaped: set[tuple[int, str]] = set()
        # Per group: request -> copy of its table. Block id -> {(group,
        # request): index in that table}.
        self._tables: list[dict[str, list[KVCacheBlock]]] = [{} for _ in self._groups]
        self._where: dict[int, dict[tuple[int, str], int]] = {}
        for g, group in enumerate(self._groups):
            for request_id, table in group.req_to_blocks.items():
                self._adopt_table(g, request_id, table)
        self._pairs = [Counter(group._copies) for group in self._groups]
        self._in_pairs: Counter = Counter()
        for pairs in self._pairs:
            for (source, copy), n in pairs.items():
                self._in_pairs[source.block_id] += n
                self._in_pairs[copy.block_id] += n
        self._queued = {block.block_id for block in pool.free_block_queue}
        self._keys = {block.block_id: keys for block in pool.blocks
                      if (keys := keys_of(pool, block))}
        self._num_keys = sum(len(keys) for keys in self._keys.values())
        self._reserved = _reserved_ids(manager)
        self._mamba_align = any(getattr(group, "mamba_cache_mode", None) == "align"
                                for group in self._groups)
        # How many ids each group had recorded for zeroing at the last check.
        self._zeroing_seen = [len(group.new_block_ids) for group in self._groups]
        self._wrap_pool(pool)

    def _adopt_table(self, g: int, request_id: str, table: list[KVCacheBlock]) -> None:
        self._tables[g][request_id] = list(table)
        for index, block in enumerate(table):
            if not block.is_null:
                self._where.setdefault(block.block_id, {})[(g, request_id)] = index

    def _wrap_pool(self, pool) -> None:
        """Record the blocks every pool operation works on. The class's method
        is looked up at each call, so a method patched later (fault injection)
        is the one that runs."""
        touched = self._touched
        kind = type(pool)

        def get_new_blocks(num_blocks):
            got = kind.get_new_blocks(pool, num_blocks)
            touched.extend(got)
            return got

        def touch(blocks):
            blocks = list(blocks)
            touched.extend(blocks)
            kind.touch(pool, blocks)

        def free_blocks(ordered_blocks, skipped=False):
            blocks = list(ordered_blocks)
            touched.extend(blocks)
            if skipped:
                kind.free_blocks(pool, blocks, skipped=True)
            else:
                kind.free_blocks(pool, blocks)

        def cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *rest,
                              **kw):
            touched.extend(blocks[num_cached_blocks:num_full_blocks])
            kind.cache_full_blocks(pool, request, blocks, num_cached_blocks, num_full_blocks,
                                   *rest, **kw)

        def cache_partial_block(request, block, *rest, **kw):
            touched.append(block)
            return kind.cache_partial_block(pool, request, block, *rest, **kw)

        def move_block_hashes(src_block, dst_block):
            touched.extend((src_block, dst_block))
            kind.move_block_hashes(pool, src_block, dst_block)

        def evict_blocks(block_ids):
            block_ids = list(block_ids)
            kind.evict_blocks(pool, block_ids)
            touched.extend(pool.blocks[i] for i in block_ids)

        def evict_cached_block(block):
            touched.append(block)
            return kind.evict_cached_block(pool, block)

        def reset_prefix_cache():
            done = kind.reset_prefix_cache(pool)
            self._cleared = self._cleared or done
            return done

        for fn in (get_new_blocks, touch, free_blocks, cache_full_blocks, cache_partial_block,
                   move_block_hashes, evict_blocks, evict_cached_block, reset_prefix_cache):
            setattr(pool, fn.__name__, fn)

    # -- one check -----------------------------------------------------------------------

    def _check_since_last(self) -> None:
        pool = self._pool
        null = pool.null_block
        check_null_block(pool, null.prev_free_block is not None)
        if self._cleared:
            self._forget_all_keys()
        suspects: dict[int, KVCacheBlock] = {
            block.block_id: block for block in self._touched if block is not null}
        self._touched.clear()
        # Pinned prompt-tail copies (0.28) hold their blocks too; few, so
        # counted afresh.
        self._pins = Counter(block.block_id for pins in self._manager._partial_tail_pins.values()
                             for block in pins)
        before = {}  # block id -> requests holding it at the last check
        sources = self._diff_pairs(suspects, before)
        self._diff_tables(suspects, sources, before)
        for block_id in suspects:
            # A table whose block was touched, even in place (keyed, say).
            self._reshaped.update(self._where.get(block_id, ()))
        for g, request_id in self._reshaped:
            if request_id in self._groups[g].req_to_blocks:
                _check_table_shape(self._groups[g], request_id)
        self._reshaped.clear()
        for block_id, block in suspects.items():
            self._check_block(block, before.get(block_id))
        if len(self._queued) != pool.free_block_queue.num_free_blocks:
            raise InvariantViolation(f"num_free_blocks={pool.free_block_queue.num_free_blocks} "
                                     f"but the queue holds {len(self._queued)}")
        entries = pool.cached_block_hash_to_block.num_entries()
        if entries != self._num_keys:
            raise InvariantViolation(f"{self._num_keys} block keys exist but the map holds "
                                     f"{entries}")
        if self._mamba_align:
            _check_boundary_states(self._manager)
        _check_eagle_groups(self._manager)
        for g, group in enumerate(self._groups):
            ids = group.new_block_ids
            seen = self._zeroing_seen[g]
            # Only what was recorded since (a drained list starts over).
            _check_zeroing_ids(pool, g, ids[seen:] if seen <= len(ids) else ids)
            self._zeroing_seen[g] = len(ids)

    def _forget_all_keys(self) -> None:
        self._cleared = False
        self._keys.clear()
        self._num_keys = 0

    def _diff_pairs(self, suspects: dict, before: dict) -> list[KVCacheBlock]:
        """Update the pair counts; returns the sources of new pairs (a copy
        took their place in some table)."""
        sources = []
        for g, group in enumerate(self._groups):
            was = self._pairs[g]
            if not group._copies and not was:
                continue
            now = Counter(group._copies)
            if now == was:
                continue
            for pair in now.keys() | was.keys():
                change = now[pair] - was[pair]
                if not change:
                    continue
                for block in pair:
                    self._in_pairs[block.block_id] += change
                    suspects[block.block_id] = block
                if change > 0:
                    sources.append(pair[0])
            self._pairs[g] = now
        return sources

    def _diff_tables(self, suspects: dict, sources: list, before: dict) -> None:
        """Bring the table shadows up to date, noting which blocks changed
        hands (and who held them before, for the sharing rule)."""
        # Positions to compare: where a touched block or a pair's source sat.
        spots = [spot for block in [*suspects.values(), *sources]
                 for spot in self._where.get(block.block_id, {}).items()]
        for g, group in enumerate(self._groups):
            shadows = self._tables[g]
            tables = group.req_to_blocks
            for request_id, table in tables.items():
                shadow = shadows.get(request_id)
                if shadow is None:
                    shadow = shadows[request_id] = []
                if len(table) != len(shadow):
                    self._diff_whole((g, request_id), shadow, table, suspects, before)
            if len(shadows) != len(tables):
                for request_id in shadows.keys() - tables.keys():
                    for block in shadows.pop(request_id):
                        if not block.is_null:
                            self._move(block, (g, request_id), None, suspects, before)
        for (g, request_id), index in spots:
            shadow = self._tables[g].get(request_id)
            table = self._groups[g].req_to_blocks.get(request_id)
            if shadow is None or table is None or index >= len(table):
                continue
            if shadow[index] is not table[index]:
                self._replace((g, request_id), index, table[index], suspects, before)

    def _diff_whole(self, where, shadow: list, table: list, suspects: dict, before: dict) -> None:
        self._reshaped.add(where)
        common = min(len(shadow), len(table))
        for index in compress(range(common), map(is_not, shadow[:common], table[:common])):
            self._replace(where, index, table[index], suspects, before)
        for block in shadow[common:]:
            if not block.is_null:
                self._move(block, where, None, suspects, before)
        del shadow[common:]
        for index in range(common, len(table)):
            block = table[index]
            shadow.append(block)
            if not block.is_null:
                self._move(block, None, (where, index), suspects, before)

    def _replace(self, where, index: int, new: KVCacheBlock, suspects: dict, before: dict) -> None:
        self._reshaped.add(where)
        shadow = self._tables[where[0]][where[1]]
        old = shadow[index]
        shadow[index] = new
        if not old.is_null:
            self._move(old, where, None, suspects, before)
        if not new.is_null:
            self._move(new, None, (where, index), suspects, before)

    def _move(self, block: KVCacheBlock, gone_from, came_to, suspects: dict, before: dict) -> None:
        block_id = block.block_id
        spots = self._where.setdefault(block_id, {})
        if block_id not in before:
            before[block_id] = {w[1] for w in spots}
        if gone_from is not None:
            spots.pop(gone_from, None)
        if came_to is not None:
            spots[came_to[0]] = came_to[1]
        suspects[block_id] = block

    def _check_block(self, block: KVCacheBlock, requests_before: set | None) -> None:
        """Everything check_invariants says about one block, and the sharing rule."""
        block_id = block.block_id
        if block.is_null:
            return
        behind, ahead = block.prev_free_block, block.next_free_block
        if behind is not None or ahead is not None:
            if behind is None or ahead is None:
                raise InvariantViolation("free queue is broken: a link is None")
            if behind.next_free_block is not block or ahead.prev_free_block is not block:
                raise InvariantViolation(
                    f"free queue back-link of block {block_id} is wrong")
            self._queued.add(block_id)
            if block.ref_cnt:
                raise InvariantViolation(
                    f"block {block_id} ref_cnt={block.ref_cnt} but in the free queue")
        else:
            self._queued.discard(block_id)
            if not block.ref_cnt and block_id not in self._reserved:
                raise InvariantViolation(f"block {block_id} ref_cnt=0 but not in the free queue")
        if block.ref_cnt < 0:
            raise InvariantViolation(f"block {block_id} has ref_cnt {block.ref_cnt} < 0")
        spots = self._where.get(block_id) or {}
        holders = len(spots) + self._in_pairs[block_id] + self._pins[block_id]
        if block.ref_cnt != holders:
            raise InvariantViolation(count_message(block_id, block.ref_cnt, holders))
        self._check_keys(block)
        if requests_before is not None:
            requests = {where[1] for where in spots}
            joined = requests - requests_before
            if joined and len(requests) > 1 and block.block_hash is None:
                raise InvariantViolation(
                    f"block {block_id} was handed to {sorted(joined)} while "
                    f"{sorted(requests - joined)} held it, and it is not cached: it was "
                    "shared without a prefix hit")

    def _check_keys(self, block: KVCacheBlock) -> None:
        pool = self._pool
        block_id = block.block_id
        keys = keys_of(pool, block)
        if block.block_hash is None and keys:
            raise InvariantViolation(f"block {block_id} has partial keys but no hash")
        if keys and not pool.enable_caching:
            raise InvariantViolation("blocks are cached while caching is disabled")
        index = pool.cached_block_hash_to_block
        for key in keys:
            if not index.contain(key, block_id):
                raise InvariantViolation(
                    f"block {block_id} carries key {key.hex()[:12]} that is not in the map")
        old = self._keys.get(block_id, ())
        for key in old:
            if key not in keys and index.contain(key, block_id):
                raise InvariantViolation(stale_entry_message(key, block))
        self._num_keys += len(keys) - len(old)
        if keys:
            self._keys[block_id] = keys
        else:
            self._keys.pop(block_id, None)
