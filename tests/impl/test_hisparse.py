"""HiSparse in impl (specs/KV_CACHE_MANAGER.md §14): the host pool, write-backs
and publication, residency, imports, the configuration checks, and the
invariants' HiSparse rules, each with a bug injected that it must catch;
last, 0.31's table-rows shape (§14.6) beside 0.32's overlay shape.

Expected values are derived by hand from the spec: pages of 4 tokens, a
device pool of `num_blocks` and a host pool of `host` blocks (block 0 of each
is the null block).
"""

import pytest

from impl.block_hash import RequestBlockHasher, get_hash_fn, none_hash
from impl.hisparse.coordinator import get_hisparse_coordinator
from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.invariants import InvariantChecker, InvariantViolation, check_invariants
from impl.kv_cache_manager import KVCacheManager
from impl.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
)
from impl.profiles import HiSparseResidency, get_profile
from impl.request import Request, RequestStatus

P = get_profile("0.32")
BS = 4
SOURCE = KVCacheGroupSpec(("source",), FullAttentionSpec(BS), KVCacheGroupRole.HISPARSE_SOURCE,
                          True)
INDEXER = KVCacheGroupSpec(("indexer",), FullAttentionSpec(BS), KVCacheGroupRole.HISPARSE_INDEXER)
RESIDENT = KVCacheGroupSpec(("resident",), HiSparseResidentSpec(BS, page_size=16))
HOT = KVCacheGroupSpec(("hot",), HiSparseHotSpec(BS, page_size=16, blocks_per_request=2))
HASHER = RequestBlockHasher(BS, get_hash_fn("sha256"), none_hash(P, "sha256", "0"), True)


def make(num_blocks=40, host=20, groups=(SOURCE, INDEXER, RESIDENT, HOT), caching=True,
         events=False, profile=P, **kwargs):
    config = KVCacheConfig(num_blocks, tuple(groups), hisparse_host_num_blocks=host)
    manager = KVCacheManager(config, 256, BS, profile, enable_caching=caching,
                             enable_kv_cache_events=events, **kwargs)
    return manager, get_hisparse_coordinator(manager)


def request(rid, n, start=0):
    r = Request(rid, list(range(start, start + n)), n)
    HASHER.update(r)
    return r


def run(manager, coordinator, r, n, **kwargs):
    """allocate_slots plus the connector's per-step residency work."""
    blocks = manager.allocate_slots(r, n, **kwargs)
    if blocks is not None:
        done = min(r.num_computed_tokens + kwargs.get("num_new_computed_tokens", 0)
                   + kwargs.get("num_external_computed_tokens", 0) + n, r.num_tokens)
        coordinator.advance_scheduled([(r.request_id, done)])
        r.num_computed_tokens = done
    return blocks


def ack_all(coordinator):
    transfers = coordinator.build_offload_command().page_transfers
    counts = {t.transfer_id: 1 for t in transfers}
    coordinator.update_spills(counts, counts)
    return transfers


# -- the host pool --------------------------------------------------------------------


def test_the_source_group_draws_host_blocks_and_leaves_the_device_pool_alone():
    m, c = make()
    r = request("r", 10)
    ids = run(m, c, r, 10).get_block_ids()
    # 3 pages: host 1-3; indexer device 1-3, resident device 4-6; no hot region yet.
    assert ids == ([1, 2, 3], [1, 2, 3], [4, 5, 6], [])
    assert c.get_host_block_pool().get_num_free_blocks() == 19 - 3
    assert m.block_pool.get_num_free_blocks() == 39 - 6
    check_invariants(m)


def test_freeing_host_blocks_through_the_device_pool_frees_them_in_the_host_pool():
    m, c = make()
    r = request("r", 8)
    # A KV load in flight: no write-back planned, nothing kept for it.
    m.allocate_slots(r, 8, delay_cache_blocks=True)
    host = c.get_host_block_pool()
    blocks = m.pop_blocks_for_free(r)
    assert host.get_num_free_blocks() == 19 - 2
    m.block_pool.free_blocks(reversed(blocks))
    assert host.get_num_free_blocks() == 19 and m.block_pool.get_num_free_blocks() == 39


def test_host_publication_and_eviction_are_cpu_events_of_the_source_group():
    m, c = make(events=True)
    r = request("r", 9)
    run(m, c, r, 9)
    m.take_events()
    ack_all(c)
    (stored,) = m.take_events()
    assert (stored.medium, stored.group_idx, len(stored.block_hashes)) == ("CPU", 0, 2)
    c.get_host_block_pool().evict_blocks({m.get_blocks("r").blocks[0][0].block_id})
    (removed,) = m.take_events()
    assert (removed.medium, removed.group_idx) == ("CPU", 0)


def test_running_out_of_host_blocks_refuses_without_taking_device_blocks():
    m, c = make(host=3)  # two usable host blocks
    free = m.block_pool.get_num_free_blocks()
    assert m.allocate_slots(request("r", 12), 12) is None  # 3 pages, 2 host blocks
    assert m.block_pool.get_num_free_blocks() == free
    assert run(m, c, request("s", 8), 8) is not None
    check_invariants(m)


# -- unpinning --------------------------------------------------------------------------


def test_an_unpinned_block_is_free_yet_read_until_reused():
    m, c = make()
    pool = m.block_pool
    block = pool.get_new_blocks(1)[0]
    told = []
    pool.unpin_blocks([block], told.append)
    assert block.ref_cnt == 0 and pool.free_block_queue.get_all_free_blocks()[-1] is block
    pool.get_new_blocks(pool.get_num_free_blocks() - 1)
    assert told == []  # not reused yet: it was put last
    pool.get_new_blocks(1)
    assert told == [block]
    pool.free_blocks([block])
    pool.get_new_blocks(pool.get_num_free_blocks())
    assert told == [block]  # told once


# -- write-backs and publication ----------------------------------------------------------


def test_full_pages_are_written_back_and_found_only_once_the_prefix_is_durable():
    m, c = make()
    r = request("r", 10)  # pages 0 and 1 full, page 2 holds 2 tokens
    run(m, c, r, 10)
    transfers = c.build_offload_command().page_transfers
    assert [t.restore for t in transfers] == [False, False]
    assert all(t.after_forward for t in transfers)
    probe = request("probe", 12)
    assert m.get_computed_blocks(probe)[1] == 0
    c.update_spills({t.transfer_id: 1 for t in transfers}, {transfers[1].transfer_id: 1})
    assert m.get_computed_blocks(probe)[1] == 0  # page 1 is durable, page 0 is not yet
    c.update_spills({}, {transfers[0].transfer_id: 1})
    assert m.get_computed_blocks(probe)[1] == 8
    assert not c.has_pending_work()
    check_invariants(m)


def test_a_transfer_completes_only_when_every_worker_has_run_it():
    m, c = make()
    r = request("r", 4)
    run(m, c, r, 4)
    (t,) = c.build_offload_command().page_transfers
    resident = m.get_blocks("r").blocks[2][0]
    assert resident.ref_cnt == 2  # the page and the transfer
    c.update_spills({t.transfer_id: 2}, {t.transfer_id: 1})
    assert resident.ref_cnt == 2 and c.has_pending_work()
    c.update_spills({t.transfer_id: 5}, {t.transfer_id: 1})  # the first count stands
    assert resident.ref_cnt == 1 and not c.has_pending_work()


def test_reprefillable_tokens_are_not_written_back():
    m, c = make(num_prefill_lookahead=3)  # the last 2 tokens are not final
    run(m, c, request("r", 8), 8)
    assert len(c.build_offload_command().page_transfers) == 1


# -- residency ------------------------------------------------------------------------------


def test_with_a_hot_region_clean_pages_are_released_except_the_active_tail():
    m, c = make()
    r = request("r", 20)  # 5 pages
    run(m, c, r, 20)
    ack_all(c)
    hot = c.hot_managers[0]
    hot.require_hot("r")
    run(m, c, r, 1)  # takes the hot region (2 blocks) and a sixth page
    assert hot.has_hot("r")
    state = c.request_states["r"]
    # 6 pages; the last two may still be written: pages 0-3 are released.
    assert state.unpinned_pages == {0, 1, 2, 3}
    rows = c.resident_managers[0].get_residency_row("r")
    assert [b.ref_cnt for b in rows] == [0, 0, 0, 0, 1, 1]
    check_invariants(m)


def test_a_reused_page_is_read_from_the_host_and_only_it_is_sent_again():
    m, c = make(num_blocks=20)
    r = request("r", 20)
    run(m, c, r, 20)
    ack_all(c)
    c.hot_managers[0].require_hot("r")
    run(m, c, r, 1)
    first = c.take_residency_updates(["r"])["r"]
    assert first.pages == list(range(6))
    pool = m.block_pool
    # 19 usable blocks: 6 indexer, 6 resident, 2 hot; 5 never used, then the 4
    # unpinned ones queued last, page 3's first (released highest first).
    pool.get_new_blocks(pool.get_num_free_blocks() - 4)
    pool.get_new_blocks(1)
    update = c.take_residency_updates(["r"])["r"]
    assert update.pages == [3] and update.block_ids == ([0],)
    assert not c.all_context_pages_resident([("r", 20, 1)])


def test_a_new_request_resumes_host_pages_on_surviving_gpu_copies():
    m, c = make()
    original = request("a", 12)
    run(m, c, original, 12)
    ack_all(c)
    copies = [b.block_id for b in m.get_blocks("a").blocks[2]]
    m.free(original)
    resumed = request("b", 12)
    blocks, hit, _ = m.get_computed_blocks(resumed)
    assert hit == 8  # two full pages; the last token is computed again
    run(m, c, resumed, 4, num_new_computed_tokens=hit, new_computed_blocks=blocks)
    rows = [b.block_id for b in c.resident_managers[0].get_residency_row("b")]
    assert rows[:2] == copies[:2]
    check_invariants(m)


# -- imports -------------------------------------------------------------------------------


def test_a_host_import_writes_only_its_last_page_on_the_gpu_and_restores_it_once_done():
    m, c = make()
    r = request("r", 13)
    m.allocate_slots(r, 0, num_external_computed_tokens=10, delay_cache_blocks=True)
    source, _, resident, hot = m.get_blocks("r").blocks
    assert len(source) == 3 and [b.is_null for b in resident] == [True, True, False]
    assert len(hot) == 2  # it reads from the host
    assert not c.build_offload_command().page_transfers
    c.finish_host_import("r", failed=False)
    (restore,) = c.build_offload_command().page_transfers
    assert restore.restore and not restore.after_forward
    assert restore.host_block_id == source[2].block_id
    assert c.request_states["r"].valid_pages == {0, 1}  # the partial page is not valid
    check_invariants(m)


def test_a_failed_import_makes_nothing_readable():
    m, c = make()
    r = request("r", 13)
    m.allocate_slots(r, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    c.finish_host_import("r", failed=True)
    assert "r" not in c.request_states or not c.request_states["r"].valid_pages
    assert not c.build_offload_command().page_transfers


def test_a_finished_request_publishes_its_finished_pages_after_it_left():
    m, c = make()
    r = request("r", 9)
    run(m, c, r, 9)
    transfers = c.build_offload_command().page_transfers
    host_blocks = list(m.get_blocks("r").blocks[0])
    r.status = RequestStatus.FINISHED_STOPPED
    m.free(r)
    # Full pages: held by their write-back and kept for the publication.
    assert [b.ref_cnt for b in host_blocks] == [2, 2, 0]
    counts = {t.transfer_id: 1 for t in transfers}
    c.update_spills(counts, counts)
    assert [b.block_hash is not None for b in host_blocks] == [True, True, False]
    assert all(b.ref_cnt == 0 for b in host_blocks)
    check_invariants(m)


def test_a_preempted_request_publishes_nothing_its_writes_prove():
    m, c = make()
    r = request("r", 9)
    run(m, c, r, 9)
    transfers = c.build_offload_command().page_transfers
    host_blocks = list(m.get_blocks("r").blocks[0])
    m.free(r)  # running: a preemption
    counts = {t.transfer_id: 1 for t in transfers}
    c.update_spills(counts, counts)
    assert all(b.block_hash is None for b in host_blocks)


# -- configurations vLLM refuses -------------------------------------------------------------


@pytest.mark.parametrize("groups,host,error,match", [
    ((RESIDENT, SOURCE, HOT), 8, ValueError, "before the resident"),
    ((SOURCE, KVCacheGroupSpec(("r",), HiSparseResidentSpec(8, page_size=16)), HOT), 8,
     ValueError, "host blocks of 4 tokens"),
    ((SOURCE, SOURCE, RESIDENT), 8, ValueError, "one source group"),
    ((SOURCE, RESIDENT), None, ValueError, "no host pool"),
    ((INDEXER, RESIDENT, HOT), None, AssertionError, "source group"),
    ((SOURCE, KVCacheGroupSpec(("r",), HiSparseResidentSpec(BS, page_size=16), None, True)), 8,
     AssertionError, "host resident"),
])
def test_layouts_vllm_refuses_are_refused(groups, host, error, match):
    with pytest.raises(error, match=match):
        make(groups=groups, host=host)


# -- the invariants' HiSparse rules, each with a bug it must catch ------------------------------


def busy_manager():
    m, c = make()
    a = request("a", 20)
    run(m, c, a, 20)
    ack_all(c)
    c.hot_managers[0].require_hot("a")
    run(m, c, a, 1)  # pages 0-3 unpinned
    b = request("b", 9, start=100)
    run(m, c, b, 9)  # two write-backs in flight
    check_invariants(m)
    return m, c


def test_a_consistent_hisparse_manager_passes():
    m, _ = busy_manager()
    InvariantChecker().check(m)


def test_a_host_block_held_once_too_often_is_caught():
    m, _ = busy_manager()
    m.get_blocks("b").blocks[0][0].ref_cnt += 1
    with pytest.raises(InvariantViolation, match="host block"):
        check_invariants(m)


def test_an_unpinned_page_still_counted_as_held_is_caught():
    m, c = busy_manager()
    c.resident_managers[0].get_resident_page("a", 0).ref_cnt += 1
    with pytest.raises(InvariantViolation, match="device block .* in the free queue"):
        check_invariants(m)


def test_an_unwatched_unpinned_page_is_caught():
    m, c = busy_manager()
    block = c.resident_managers[0].get_resident_page("a", 1)
    del m.block_pool._watched[block.block_id]
    with pytest.raises(InvariantViolation, match="not watched"):
        check_invariants(m)


def test_a_page_missing_from_its_readers_is_caught():
    m, c = busy_manager()
    block = c.resident_managers[0].get_resident_page("a", 2)
    c._readers[block.block_id].clear()
    with pytest.raises(InvariantViolation, match="among its readers"):
        check_invariants(m)


def test_a_transfer_its_page_forgot_is_caught():
    m, c = busy_manager()
    state = c.request_states["b"]
    state.in_flight[0] = 999
    with pytest.raises(InvariantViolation, match="not that page's transfer"):
        check_invariants(m)


def test_a_ready_prefix_with_a_dirty_page_is_caught():
    m, c = busy_manager()
    c.request_states["a"].valid_pages.discard(1)
    with pytest.raises(InvariantViolation, match="ready prefix"):
        check_invariants(m)


def test_a_copy_index_that_disagrees_with_itself_is_caught():
    m, c = busy_manager()
    key = next(iter(c.copies))
    block = c.copies[key][0]
    c._copy_key_of[block.block_id] = b"elsewhere"
    with pytest.raises(InvariantViolation, match="not indexed under it"):
        check_invariants(m)


# -- the table-rows shape (0.31, profile hisparse_residency; spec §14.6) ---------------
# The same calls under 0.31's shape and 0.32's, where the two answer
# differently. A fresh manager hands device blocks out in id order: the
# indexer takes 1.., then the resident group, then the hot one.

P31 = get_profile("0.31")
P32 = P


def test_the_profiles_name_the_shapes():
    assert P31.hisparse_residency is HiSparseResidency.TABLE_ROWS
    assert P32.hisparse_residency is HiSparseResidency.OVERLAY
    assert get_profile("0.33").hisparse_residency is HiSparseResidency.OVERLAY
    assert make(profile=P31)[1].table_rows and not make(profile=P32)[1].table_rows


@pytest.mark.parametrize("caching", [True, False])
def test_an_allocation_plans_its_write_backs_only_in_the_table_rows_shape(caching):
    # 0.31: the resident group's cache step writes back the 2 full pages of
    # 9 tokens, prefix caching on or off. 0.32: allocation alone plans none
    # (the connector's advance_scheduled does).
    m31, c31 = make(caching=caching, profile=P31)
    assert m31.allocate_slots(request("r", 9), 9) is not None
    transfers = c31.build_offload_command().page_transfers
    assert [(t.host_block_id, t.resident_block_ids, t.after_forward) for t in transfers] == [
        (1, (4,), True), (2, (5,), True)]
    m32, c32 = make(caching=caching, profile=P32)
    assert m32.allocate_slots(request("r", 9), 9) is not None
    assert c32.build_offload_command().page_transfers == []
    check_invariants(m31)
    check_invariants(m32)


def test_a_delayed_cache_step_plans_nothing_in_either_shape():
    for profile in (P31, P32):
        m, c = make(profile=profile)
        assert m.allocate_slots(request("r", 8), 8, delay_cache_blocks=True)
        assert c.build_offload_command().page_transfers == []


def _host_reader(profile):
    """A request of 6 pages reading from the host (its hot region held),
    all its write-backs done: pages 0-3 unpinned, 4-5 the active tail."""
    m, c = make(profile=profile)
    r = request("r", 24)
    assert m.allocate_slots(r, 24) is not None
    for hot in c.hot_managers:
        hot.require_hot("r")
    assert m.allocate_slots(r, 24) is not None
    if profile is P32:
        c.advance_scheduled([("r", 24)])
        c.take_residency_updates(["r"])
    ack_all(c)
    return m, c


@pytest.mark.parametrize("profile", [P31, P32])
def test_a_lost_page_rewrites_the_table_only_in_the_table_rows_shape(profile):
    m, c = _host_reader(profile)
    resident_row = [b.block_id for b in m.get_blocks("r").blocks[2]]
    assert resident_row == [7, 8, 9, 10, 11, 12]
    assert [c.resident_managers[0].get_resident_page("r", p) is not None
            for p in range(6)] == [True] * 6
    assert c.take_block_table_updates() == {}
    # Take every free device block: the pool reuses the unpinned pages.
    m.block_pool.get_new_blocks(m.block_pool.get_num_free_blocks())
    resident = c.resident_managers[0]
    lost = [p for p in range(6) if resident.get_resident_page("r", p) is None]
    assert lost == [0, 1, 2, 3]
    ids = m.get_block_ids("r")
    if profile is P31:
        # The table itself now says where each page is read from ...
        assert ids[2] == [0, 0, 0, 0, 11, 12]
        # ... and the worker is sent every row of the request, once.
        assert c.take_block_table_updates() == {"r": tuple(list(g) for g in ids)}
        assert c.take_block_table_updates() == {}
    else:
        # The table stays append-only; only the overlay and its updates change.
        assert ids[2] == resident_row
        assert c.take_block_table_updates() == {}
        update = c.take_residency_updates(["r"])["r"]
        assert (update.pages, update.block_ids) == ([0, 1, 2, 3], ([0, 0, 0, 0],))


@pytest.mark.parametrize("profile", [P31, P32])
def test_an_adopted_copy_is_written_into_the_table_only_in_the_table_rows_shape(profile):
    m, c = make(profile=profile)
    original = request("original", 12)
    assert m.allocate_slots(original, 12) is not None
    if profile is P32:
        c.advance_scheduled([("original", 12)])
    ack_all(c)
    copies = [b.block_id for b in m.get_blocks("original").blocks[2]]
    assert copies == [4, 5, 6]
    m.free(original)
    resumed = request("resumed", 13)
    hit, num_hit = m.get_computed_blocks(resumed)[:2]
    assert num_hit == 12
    assert m.allocate_slots(resumed, 1, num_hit, hit) is not None
    if profile is P32:
        c.advance_scheduled([("resumed", 13)])
    row = [b.block_id for b in c.resident_managers[0].get_residency_row("resumed")]
    table = m.get_block_ids("resumed")[2]
    # Both shapes read the three prefix pages from the surviving copies ...
    assert row[:3] == copies
    # ... but only the table-rows shape shows them in the table.
    assert table[:3] == (copies if profile is P31 else [0, 0, 0])
    check_invariants(m)


def test_all_context_pages_resident_looks_only_at_the_span_in_the_table_rows_shape():
    # Page 1 of 3 read from the host: a span of page 0 alone is resident in
    # the table-rows shape; the overlay shape asks the whole row.
    answers = {}
    for profile in (P31, P32):
        m, c = make(profile=profile)
        assert m.allocate_slots(request("r", 12), 12) is not None
        assert c.all_context_pages_resident([("r", 0, 4)])
        assert c.resident_managers[0].drop_resident_page("r", 1) is not None
        c._all_resident.discard("r")
        answers[profile.name] = (c.all_context_pages_resident([("r", 0, 4)]),
                                 c.all_context_pages_resident([("r", 0, 8)]))
    assert answers == {"0.31": (True, False), "0.32": (False, False)}


def test_the_residency_checker_sees_a_table_row_that_lies():
    # Negative control for the invariants under the table-rows shape: a
    # resident page rewritten to a block the request already holds there.
    m, c = make(profile=P31)
    assert m.allocate_slots(request("r", 8), 8) is not None
    check_invariants(m)
    table = c.resident_managers[0].req_to_blocks["r"]
    table[0] = table[1]
    with pytest.raises(InvariantViolation):
        check_invariants(m)
