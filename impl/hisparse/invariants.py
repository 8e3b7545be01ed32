"""What must hold of a KV cache manager with HiSparse groups; specs §13 and §14.

The plain rules (a well-formed free queue, queued iff unreferenced, a
block's references = its holders, the cache map and the blocks' keys agree)
hold for each of the two pools, with HiSparse's own holders counted:

- device pool: the tables of the device groups, where a resident group's row
  is read through its overlay and an unpinned page holds nothing; pending
  copy-on-write pairs; each transfer in flight until its GPU hold is given
  back;
- host pool: the source group's tables and copy-on-write pairs; each
  transfer in flight; host copies handed to the worker (both ends); the
  blocks a finished request's publication keeps while its writes finish.

And HiSparse's own:
- an unpinned page has its block in every resident group, the pool watches
  that block for reuse, and the block lists the page among its readers;
- a transfer in flight is its page's transfer, and (while its request lives)
  the host block it writes is the request's host block of that page;
- the ready prefix is valid: pages 0 .. ready_prefix_pages - 1 are clean;
- the index of GPU copies agrees with itself both ways.

A manager with HiSparse groups is checked whole after every call: the
incremental checker does not shadow the overlays and transfers.
"""

from collections import Counter

from impl import pool_invariants as pool_rules
from impl.managers.hisparse import HiSparseResidentManager, HiSparseSourceManager
from impl.pool_invariants import InvariantViolation


def check_hisparse_invariants(manager) -> None:
    hisparse = manager.coordinator.hisparse
    device, host = Counter(), Counter()
    for group in manager.coordinator.single_type_managers:
        on_host = isinstance(group, HiSparseSourceManager)
        counts = host if on_host else device
        for request_id, table in group.req_to_blocks.items():
            if isinstance(group, HiSparseResidentManager):
                state = hisparse.request_states.get(request_id)
                unpinned = state.unpinned_pages if state is not None else ()
                table = [b for page, b in enumerate(group.get_residency_row(request_id))
                         if page not in unpinned]
            counts.update(b.block_id for b in table if not b.is_null)
        for pair in group._copies:
            counts.update(b.block_id for b in pair)
    publications = {}
    for transfer in hisparse.pending_spills.values():
        host[transfer.host_block.block_id] += 1
        if not transfer.gpu_released:
            device.update(b.block_id for b in transfer.gpu_blocks)
        pending = transfer.owner.publication
        if pending is not None and pending.detached is not None:
            publications[id(pending)] = pending.detached
    for blocks in publications.values():
        host.update(b.block_id for b in blocks)
    for pair in hisparse._host_copies.values():
        host.update(b.block_id for b in pair)
    _check_pool(manager.block_pool, device, manager.enable_caching, "device")
    host_pool = hisparse.get_host_block_pool()
    if host_pool is not None:
        _check_pool(host_pool, host, host_pool.enable_caching, "host")
    _check_residency(hisparse)


def _check_pool(pool, holders: Counter, caching: bool, which: str) -> None:
    queued = pool_rules.walk_free_queue(pool)
    pool_rules.check_null_block(pool, pool.null_block.block_id in queued)
    null_id = pool.null_block.block_id
    for block in pool.blocks:
        block_id = block.block_id
        if block_id == null_id:
            continue
        if block.ref_cnt < 0:
            raise InvariantViolation(f"{which} block {block_id} has ref_cnt {block.ref_cnt} < 0")
        if (block_id in queued) == bool(block.ref_cnt):
            state = "in the free queue" if block_id in queued else "not in the free queue"
            raise InvariantViolation(f"{which} block {block_id} ref_cnt={block.ref_cnt} but "
                                     f"{state}")
        if block.ref_cnt != holders[block_id]:
            raise InvariantViolation(
                f"{which} " + pool_rules.count_message(block_id, block.ref_cnt, holders[block_id]))
    entries = 0
    extra = pool.cached_block_hashes_by_block
    for key, block in pool.cached_block_hash_to_block.items():
        if key not in pool_rules.keys_of(pool, block):
            raise InvariantViolation(f"{which} " + pool_rules.stale_entry_message(key, block))
        entries += 1
    carried = sum(len(pool_rules.keys_of(pool, b)) for b in pool.blocks)
    if carried != entries:
        raise InvariantViolation(f"{which} pool: {carried} block keys exist but the map "
                                 f"holds {entries}")
    if any(pool.blocks[i].block_hash is None for i in extra):
        raise InvariantViolation(f"{which} pool: a block has partial keys but no hash")
    if entries and not caching:
        raise InvariantViolation(f"{which} blocks are cached while caching is disabled")


def _check_residency(hisparse) -> None:
    residents = hisparse.resident_managers
    host_manager = hisparse.host_manager
    for request_id, state in hisparse.request_states.items():
        for page in range(state.ready_prefix_pages):
            if page not in state.valid_pages:
                raise InvariantViolation(
                    f"{request_id}: page {page} is in the ready prefix "
                    f"({state.ready_prefix_pages} pages) but its host copy is not complete")
        for page in state.unpinned_pages:
            for manager in residents:
                block = manager.get_resident_page(request_id, page)
                if block is None:
                    raise InvariantViolation(f"{request_id}: unpinned page {page} has no "
                                             f"block in group {manager.kv_cache_group_id}")
                if block.block_id not in manager.block_pool._watched:
                    raise InvariantViolation(
                        f"{request_id}: unpinned page {page} (block {block.block_id}) is "
                        "not watched: its reuse would go unnoticed")
                if (request_id, page) not in hisparse._readers.get(block.block_id, ()):
                    raise InvariantViolation(
                        f"{request_id}: block {block.block_id} does not list page {page} "
                        "among its readers")
    for transfer_id, transfer in hisparse.pending_spills.items():
        request_id, page = transfer.page
        if transfer.owner.in_flight.get(page) != transfer_id:
            raise InvariantViolation(f"transfer {transfer_id} of {request_id} page {page} is "
                                     "not that page's transfer in flight")
        if hisparse.request_states.get(request_id) is transfer.owner:
            host = host_manager.req_to_blocks.get(request_id, [])
            if page >= len(host) or host[page] is not transfer.host_block:
                raise InvariantViolation(
                    f"transfer {transfer_id} writes host block {transfer.host_block.block_id}"
                    f", not {request_id}'s block of page {page}")
    for key, blocks in hisparse.copies.items():
        if len(blocks) != len(residents):
            raise InvariantViolation(f"copy {key.hex()[:12]} has {len(blocks)} blocks for "
                                     f"{len(residents)} resident groups")
        for block in blocks:
            if hisparse._copy_key_of.get(block.block_id) != key:
                raise InvariantViolation(f"block {block.block_id} holds copy {key.hex()[:12]} "
                                         "but is not indexed under it")
    for block_id, key in hisparse._copy_key_of.items():
        if all(b.block_id != block_id for b in hisparse.copies.get(key, ())):
            raise InvariantViolation(f"block {block_id} is indexed under copy "
                                     f"{key.hex()[:12]}, which does not hold it")
