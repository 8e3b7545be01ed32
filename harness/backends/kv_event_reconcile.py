"""KV events reconciled with the pool they describe, after every event.

A router or cache index never sees the engine's pool: it rebuilds which
hashes a worker holds from the KV events alone. This module is such an
index (a set of hashes per medium and KV cache group, parents chained),
fed with the pool's queued events as they appear, and compared after every
event with the pool's own cached-block map (specs/ORACLES.md §2 has the
rules and their names).

Incremental: the map's class is swapped on the watched instance for a
subclass (no new slots) whose insert, pop and clear log the keys they
touch; after an event only the keys logged and the hashes the new events
name are compared: O(keys the event touched), never a walk of the map
(one at start).

The same code watches impl's pool and vLLM's: both keep vLLM's shape
(`cached_block_hash_to_block` with insert/pop and a dict of key -> block or
{block_id: block}, `kv_event_queue`, which take_events replaces).
"""

from __future__ import annotations

from collections.abc import Callable

from impl.block_hash import external_block_hash

GPU = "GPU"
# The residency rule's case that every followed release breaks (vllm #55092,
# #48933); the profile field kv_events_removed_per_copy says which.
REMOVED_WHILE_CACHED = "removed-while-cached"
# The never-cached case that 0.32's full-report hits make (a null block of a
# hit announced; profile field full_report_announces_skipped_blocks).
NEVER_CACHED = "never-cached"
_CLEARED = (None, None, 0)  # a clear() in the map's log


def _logging_class(cls, log: list):
    """The map's class, its insert, pop (when it took a block) and clear
    logging (key, block id, +1 / -1)."""

    def insert(self, key, block):
        log.append((key, block.block_id, 1))
        return cls.insert(self, key, block)

    def pop(self, key, block_id):
        block = cls.pop(self, key, block_id)
        if block is not None:
            log.append((key, block_id, -1))
        return block

    namespace = {"__slots__": (), "insert": insert, "pop": pop, "_reconcile_log": log}
    if hasattr(cls, "clear"):
        def clear(self):
            log.append(_CLEARED)
            return cls.clear(self)

        namespace["clear"] = clear
    return type(f"Logged{cls.__name__}", (cls,), namespace)


# What one event did to a hash, in its tally (hash -> four counts): copies
# the map gained and lost, announcements and removals its events made.
_IN, _OUT, _STORED, _REMOVED = range(4)


def _counts(tally: dict, ext) -> list:
    counts = tally.get(ext)
    if counts is None:
        counts = tally[ext] = [0, 0, 0, 0]
    return counts


class EventReconciler:
    """One pool's KV events, indexed as a consumer indexes them, against the pool.

    `parent_chained[g]`: group g keys every full block (its BlockStored's
    parent must have been announced). `carries_group`: the release's events
    name their group (from 0.20; before, the index keys by hash alone).
    `removed_per_copy`: the release sends BlockRemoved for every physical
    copy (a known upstream bug): such a removal drops the hash from the index
    as it would from a consumer's, is counted in `known_bug_hits`, and the
    hash's remaining copies and last removal are then no finding.
    `announces_skipped`: a full-report hit announces its null blocks' hashes
    too (a known upstream bug): counted, and the hash leaves the index."""

    def __init__(self, pool, groups: list, parent_chained: list[bool], as_int: bool,
                 carries_group: bool, violation: Callable[[str, int | None], Exception],
                 removed_per_copy: bool = False, announces_skipped: bool = False,
                 entries_attr: str = "_cache") -> None:
        self._pool = pool
        self._block_sizes = [g.block_size for g in groups]
        self._chained = parent_chained
        self._as_int = as_int
        self._carries_group = carries_group
        self._violation = violation
        self._tolerate = removed_per_copy
        # The release announces a full-report hit's skipped (null) blocks
        # (a known upstream bug): such a hash leaves the index again.
        self._tolerate_skipped = announces_skipped
        self._entries_attr = entries_attr
        self._medium = getattr(pool, "medium", GPU)
        self.known_bug_hits = 0
        self._reannounced = False
        self._log: list = []
        self._map = None
        self._queue = pool.kv_event_queue
        self._seen = len(self._queue)
        # (medium, group or None, external hash): held, announced since the
        # last clear (parents), lost to the known bug while still cached.
        self._index: set = set()
        self._announced: set = set()
        self._lost: set = set()
        self._keys: dict = {}  # external key -> the map's keys for it
        self._last_block: dict = {}  # map key -> the block its last insert/pop named
        self._ext_of: dict = {}  # map key -> its external key, once worked out
        self._watch_map()
        for key in list(self._entries()):
            ext = self._ext_of[key] = self._external(key)
            self._keys.setdefault(ext, set()).add(key)
            self._index.add(ext)
            self._announced.add(ext)

    # -- what changed --------------------------------------------------------------------

    def _watch_map(self) -> None:
        index = self._pool.cached_block_hash_to_block
        if getattr(type(index), "_reconcile_log", None) is not self._log:
            index.__class__ = _logging_class(type(index), self._log)
        self._map = index

    def _entries(self) -> dict:
        return getattr(self._map, self._entries_attr)

    def _new_events(self) -> list:
        queue = self._pool.kv_event_queue
        if queue is self._queue:
            if len(queue) == self._seen:
                return []
            fresh = queue[self._seen:]
        else:  # take_events handed the old queue out: its tail, then the new one
            fresh = self._queue[self._seen:] + queue
            self._queue = queue
        self._seen = len(queue)
        return fresh

    def _external(self, key: bytes) -> tuple:
        group = int.from_bytes(key[-4:], "big") if self._carries_group else None
        return (self._medium, group, external_block_hash(key[:-4], self._as_int))

    def _holders(self, ext) -> list:
        entries = self._entries()
        out = []
        for key in self._keys.get(ext, ()):
            found = entries.get(key)
            if found is not None:
                out.extend(found.values() if type(found) is dict else (found,))
        return out

    # -- after an event ------------------------------------------------------------------

    def after(self, step: int, reannounce: bool = False) -> None:
        """The rules for what event #`step` did; `reannounce`: its request
        has its hits announced again (kv_cache_report_mode full)."""
        pool = self._pool
        queue = pool.kv_event_queue
        replaced = pool.cached_block_hash_to_block is not self._map
        if not (self._log or replaced or queue is not self._queue
                or len(queue) != self._seen):
            return  # nothing happened to the map or the events: the common case
        events = self._new_events()
        if replaced:
            self._watch_map()
        tally: dict = {}
        self._reannounced = reannounce
        cleared = self._read_log(tally) or replaced
        if cleared and not any(type(e).__name__ == "AllBlocksCleared" for e in events):
            raise self._violation(f"event #{step}: the cached-block map was emptied without "
                                  "an AllBlocksCleared event", None)
        for e in events:
            self._apply(step, e, tally, reannounce)
        for ext, counts in tally.items():
            self._check_residency(step, ext, counts)

    def _read_log(self, tally: dict) -> bool:
        """The map's log into `tally`; whether the map was cleared."""
        cleared = False
        last, ext_of = self._last_block, self._ext_of
        for key, block_id, sign in self._log:
            if key is None:
                cleared = True
                continue
            ext = ext_of.get(key)
            if ext is None:
                ext = ext_of[key] = self._external(key)
                self._keys.setdefault(ext, set()).add(key)
            last[key] = block_id
            _counts(tally, ext)[_IN if sign > 0 else _OUT] += 1
        self._log.clear()
        return cleared

    def _apply(self, step: int, e, tally: dict, reannounce: bool) -> None:
        kind = type(e).__name__
        if kind == "AllBlocksCleared":
            if len(self._entries()):
                raise self._violation(f"event #{step}: AllBlocksCleared, but the cached-block "
                                      f"map still holds {len(self._entries())} key(s)", None)
            medium = self._medium
            for held in (self._index, self._announced, self._lost):
                for ext in [x for x in held if x[0] == medium]:
                    held.discard(ext)
            return
        medium = self._medium if e.medium is None else e.medium
        if medium != self._medium:
            raise self._violation(f"event #{step}: {kind} names medium {medium}, but the "
                                  f"pool's is {self._medium}", None)
        group = e.group_idx if self._carries_group else None
        if kind == "BlockStored":
            self._stored(step, e, (medium, group), tally, reannounce)
            return
        for h in e.block_hashes:
            self._removed(step, (medium, group, h), tally)

    def _removed(self, step: int, ext, tally: dict) -> None:
        counts = _counts(tally, ext)
        counts[_REMOVED] += 1
        h, group = _short(ext[2]), ext[1]
        if counts[_REMOVED] > counts[_OUT]:
            block = self._block_named(ext)
            raise self._violation(
                f"event #{step}: BlockRemoved for hash {h} (group {group}{_in(block)}) "
                f"{counts[_REMOVED]} time(s), but {counts[_OUT]} cop(ies) of it left "
                "the cache", block)
        if ext in self._index:
            self._index.discard(ext)
        elif ext in self._lost:
            self._lost.discard(ext)  # the last copy of a hash the known bug removed
        elif counts[_REMOVED] > 1:
            # Removed again in one event: the first removal came while this
            # copy still cached the hash.
            self._removed_while_cached(step, ext, [])
        else:
            block = self._block_named(ext)
            raise self._violation(
                f"event #{step}: BlockRemoved for hash {h} (group {group}{_in(block)}), which "
                "the events never announced or already removed", block)

    def _stored(self, step: int, e, where: tuple, tally: dict, reannounce: bool) -> None:
        group, parent = where[1], e.parent_block_hash
        if parent is not None and self._chains(group, e.block_size) and (
                (*where, parent) not in self._announced):
            raise self._violation(
                f"event #{step}: BlockStored chains to parent {_short(parent)} (group "
                f"{group}), which the events never announced", None)
        for h in e.block_hashes:
            ext = (*where, h)
            counts = _counts(tally, ext)
            # A second announcement needs a copy this event cached, unless
            # the request has its hits announced again.
            if ext in self._index and not reannounce and (
                    counts[_STORED] >= counts[_IN]):
                block = self._block_named(ext)
                raise self._violation(
                    f"event #{step}: BlockStored announces hash {_short(h)} (group "
                    f"{group}{_in(block)}) again, and no other copy of it was cached", block)
            counts[_STORED] += 1
            self._index.add(ext)
            self._announced.add(ext)
            self._lost.discard(ext)

    def _chains(self, group: int | None, block_size: int) -> bool:
        """Whether a BlockStored of `group` at `block_size` names a parent the
        events announced (events without a group: when every group does)."""
        if group is None:
            return all(self._chained) and block_size in self._block_sizes
        return (group < len(self._chained) and self._chained[group]
                and block_size == self._block_sizes[group])

    def _check_residency(self, step: int, ext, counts: list) -> None:
        holders = self._holders(ext)
        if (ext in self._index) == bool(holders):
            return
        h, group = _short(ext[2]), ext[1]
        if not holders:
            if self._tolerate_skipped and self._reannounced and counts[_STORED] and (
                    not counts[_IN]):
                self.known_bug_hits += 1
                self._index.discard(ext)
                return
            block = self._block_named(ext)
            if block is None:
                raise self._violation(f"event #{step}: BlockStored announced hash {h} (group "
                                      f"{group}), which no block ever cached ({NEVER_CACHED})",
                                      None)
            raise self._violation(f"event #{step}: block {block} no longer caches hash {h} "
                                  f"(group {group}), but no BlockRemoved said so", block)
        if ext in self._lost:
            return
        first = holders[0].block_id
        if not counts[_REMOVED]:
            raise self._violation(f"event #{step}: block {first} caches hash {h} (group "
                                  f"{group}), but no BlockStored announced it", first)
        self._removed_while_cached(step, ext, holders)

    def _removed_while_cached(self, step: int, ext, holders: list) -> None:
        """A BlockRemoved while another copy of the hash was cached: the
        known bug where the release has it (the index loses the hash, as a
        consumer's would), else a finding naming the copies."""
        if self._tolerate:
            self.known_bug_hits += 1
            if holders:
                self._lost.add(ext)
            return
        h, group = _short(ext[2]), ext[1]
        if holders:
            ids = ", ".join(str(b.block_id) for b in holders)
            raise self._violation(f"event #{step}: BlockRemoved for hash {h} (group {group}) "
                                  f"while block(s) {ids} still cache it "
                                  f"({REMOVED_WHILE_CACHED})", holders[0].block_id)
        block = self._block_named(ext)
        raise self._violation(f"event #{step}: BlockRemoved for hash {h} (group {group}) "
                              f"while block {block} still cached it: one BlockRemoved per "
                              f"copy ({REMOVED_WHILE_CACHED})", block)

    def _block_named(self, ext) -> int | None:
        for key in self._keys.get(ext, ()):
            if key in self._last_block:
                return self._last_block[key]
        return None


def _short(h) -> str:
    return bytes(h)[:6].hex() if isinstance(h, (bytes, bytearray)) else str(h)


def _in(block: int | None) -> str:
    return "" if block is None else f", block {block}"
