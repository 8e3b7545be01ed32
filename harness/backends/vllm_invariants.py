"""Invariants on vLLM's own block pool, checked after every event.

impl's checker (impl/invariants.py) watches impl; this one watches the
installed vLLM (any release, through its overlay), so that a bug vLLM has
itself, which impl faithfully follows, still breaks a run. The rules:

- each block's ref_cnt equals the number of holders: the (group, request)
  tables holding it, the pending copy-on-write pairs naming it (a sink
  group's reserved blocks: 0, outside the free queue);
- a block is in the free queue exactly when its ref_cnt is 0; its links
  agree both ways; num_free_blocks equals the number of unreferenced blocks;
- a cached block's key maps to it in the hash map;
- the null block is never handed out by get_new_blocks, nor in the free queue;
- at quiescence (no request, no pending pair) every block is free.

Incremental: the pool's block operations (get_new_blocks, touch,
free_blocks) are wrapped on the watched instance and record the blocks they
were given or returned; after an event the checker re-reads only the tables
of the event's request, the pending pairs, and the blocks recorded. A check
costs O(blocks the event touched + the request's table + pending pairs), not
a walk of the pool. Changes made behind the pool's back to blocks no call
touched are outside its sight (the one full check at start sees the whole
pool once).

The private attribute names differ between releases: they are fields of the
release's API shape (vllm_api.py).
"""

from __future__ import annotations

from collections import Counter

from harness.backends.vllm_api import VllmApi


class UpstreamViolation(AssertionError):
    """vLLM's own state broke a rule: a bug in vLLM (exit 1, UPSTREAM)."""

    def __init__(self, message: str, block: int | None = None) -> None:
        super().__init__(message)
        self.block = block




class VllmPoolChecker:
    """Watches one vLLM KVCacheManager's block pool (no HiSparse host pool)."""

    def __init__(self, manager, api: VllmApi, requests: dict) -> None:
        self._manager = manager
        self._api = api
        self._requests = requests  # the backend's live requests
        self._pool = pool = manager.block_pool
        self._groups = manager.coordinator.single_type_managers
        self._touched: list = []
        self._handed_null = False
        self._tables: dict[tuple[int, str], list] = {}
        self._holders: Counter = Counter()
        self._num_held = 0  # blocks with at least one holder
        self._pairs: list = []
        for g, group in enumerate(self._groups):
            for req, table in group.req_to_blocks.items():
                self._adopt((g, req), list(table))
        # A sink group's blocks (0.17-0.29) are set aside for good: ref_cnt 0
        # and outside the free queue.
        self._reserved = self._sink_blocks()
        self._reserved_ids = {b.block_id for b in self._reserved}
        self._refresh_pairs()
        self._wrap(pool)
        self.check_all()

    # -- what the pool's operations touch --------------------------------------------

    def _wrap(self, pool) -> None:
        touched = self._touched
        get_new, touch, free = pool.get_new_blocks, pool.touch, pool.free_blocks
        null = pool.null_block

        # Each wrapper takes what the release's method takes (0.23's
        # free_blocks has `prepend`), the blocks being all it reads.
        def get_new_blocks(n, *args, **kwargs):
            blocks = get_new(n, *args, **kwargs)
            touched.extend(blocks)
            if any(b is null for b in blocks):
                self._handed_null = True
            return blocks

        def touch_(blocks):
            blocks = list(blocks)
            touched.extend(blocks)
            return touch(blocks)

        def free_blocks(blocks, *args, **kwargs):
            blocks = list(blocks)
            touched.extend(blocks)
            return free(blocks, *args, **kwargs)

        pool.get_new_blocks, pool.touch, pool.free_blocks = get_new_blocks, touch_, free_blocks

    def _hold(self, block_id: int, n: int) -> None:
        before = self._holders[block_id]
        self._holders[block_id] = before + n
        self._num_held += (before + n > 0) - (before > 0)

    def _sink_blocks(self) -> list:
        attr = self._api.sink_blocks_attr
        if attr is None:
            return []
        return [b for g in self._groups for b in getattr(g, attr, ()) or () if not b.is_null]

    def _adopt(self, key, table) -> None:
        self._tables[key] = table
        for b in table:
            if not b.is_null:
                self._hold(b.block_id, 1)

    def _drop(self, key) -> None:
        for b in self._tables.pop(key, ()):
            if not b.is_null:
                self._hold(b.block_id, -1)
                self._touched.append(b)

    def _refresh_table(self, g: int, req: str) -> None:
        key = (g, req)
        now = self._groups[g].req_to_blocks.get(req)
        old = self._tables.get(key)
        if old is not None and now is not None and len(old) == len(now) and all(
                a is b for a, b in zip(old, now)):
            return
        self._drop(key)
        if now is not None:
            table = list(now)
            self._adopt(key, table)
            self._touched.extend(b for b in table if not b.is_null)

    def _refresh_pairs(self) -> None:
        attr = self._api.pending_copies_attr
        for pair in self._pairs:
            for b in pair:
                self._hold(b.block_id, -1)
                self._touched.append(b)
        self._pairs = []
        if attr is None:
            return
        for group in self._groups:
            for pair in getattr(group, attr, ()):
                self._pairs.append(pair)
                for b in pair:
                    self._hold(b.block_id, 1)
                    self._touched.append(b)

    # -- the checks --------------------------------------------------------------------

    def after(self, req: str | None) -> None:
        """The rules for what the event on `req` (None: no request) touched."""
        if req is not None:
            for g in range(len(self._groups)):
                self._refresh_table(g, req)
        self._refresh_pairs()
        touched = self._touched[:]
        self._touched.clear()  # the wrappers hold this list
        if self._handed_null:
            self._handed_null = False
            raise UpstreamViolation("get_new_blocks handed out the null block",
                                    self._pool.null_block.block_id)
        null = self._pool.null_block
        if null.prev_free_block is not None or null.next_free_block is not None:
            raise UpstreamViolation("the null block is in the free queue: the next "
                                    "get_new_blocks may hand it out", null.block_id)
        seen = set()
        for b in touched:
            if b.block_id not in seen and not b.is_null:
                seen.add(b.block_id)
                self._check_block(b)
        self._check_counts()

    def check_all(self) -> None:
        """Every block once (at start; tests)."""
        for b in self._pool.blocks:
            if not b.is_null:
                self._check_block(b)
        self._check_counts()

    def _check_block(self, b) -> None:
        holders = self._holders[b.block_id]
        if b.ref_cnt != holders:
            raise UpstreamViolation(
                f"block {b.block_id} has ref_cnt {b.ref_cnt} but {holders} holder(s) "
                "(requests' tables, pending copies) hold it", b.block_id)
        queued = b.prev_free_block is not None or b.next_free_block is not None
        if queued != (b.ref_cnt == 0 and b.block_id not in self._reserved_ids):
            state = "in" if queued else "not in"
            raise UpstreamViolation(f"block {b.block_id} has ref_cnt {b.ref_cnt} and is "
                                    f"{state} the free queue", b.block_id)
        if queued and (b.prev_free_block.next_free_block is not b
                       or b.next_free_block.prev_free_block is not b):
            raise UpstreamViolation(f"free queue links around block {b.block_id} disagree",
                                    b.block_id)
        if b.block_hash is not None and not self._maps_to(b.block_hash, b):
            raise UpstreamViolation(f"block {b.block_id} carries hash "
                                    f"{bytes(b.block_hash)[:6].hex()} but the hash map does "
                                    "not point at it", b.block_id)

    def _maps_to(self, key, b) -> bool:
        entries = getattr(self._pool.cached_block_hash_to_block, self._api.hash_map_entries_attr)
        entry = entries.get(key)
        if entry is b:
            return True
        return isinstance(entry, dict) and entry.get(b.block_id) is b

    def _check_counts(self) -> None:
        pool = self._pool
        queue = pool.free_block_queue
        num_free = queue.num_free_blocks
        unreferenced = len(pool.blocks) - 1 - len(self._reserved) - self._num_held
        if num_free != unreferenced:
            raise UpstreamViolation(f"the free queue holds {num_free} blocks but "
                                    f"{unreferenced} are unreferenced")
        if not self._requests and not self._pairs and num_free != (
                len(pool.blocks) - 1 - len(self._reserved)):
            raise UpstreamViolation(f"every request finished but only {num_free} of "
                                    f"{len(pool.blocks) - 1} blocks are free")
