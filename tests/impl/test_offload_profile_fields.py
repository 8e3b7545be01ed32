"""The CPU offload tier's two 0.33 behaviours (profile.offload_request_ranks,
profile.offload_failed_store_events), each against the 0.32 profile where it
is off (specs/KV_OFFLOAD.md, Releases)."""

from impl.kv_offload.context import RequestContext
from impl.kv_offload.keys import make_offload_key
from impl.kv_offload.manager import CPUOffloadingManager
from impl.profiles import get_profile


def _key(i: int) -> bytes:
    return make_offload_key(bytes([i]) * 4, 0)


def _store_running_request(manager) -> tuple[bytes, bytes, bytes]:
    """A request still running stores its head, tail, then middle (a
    backfill), one store batch each."""
    ctx = RequestContext(req_id="running")
    head, middle, tail = _key(1), _key(2), _key(3)
    for position, key in enumerate((head, middle, tail), 1):
        ctx.set_offload_key_position(key, 16 * position)
    for key in (head, tail, middle):
        assert manager.prepare_store([key], ctx) is not None
        manager.complete_store([key], ctx)
    return head, middle, tail


def test_a_running_request_loses_its_tail_first_with_request_ranks():
    manager = CPUOffloadingManager(3, profile=get_profile("0.33"))
    _, _, tail = _store_running_request(manager)
    plan = manager.prepare_store([_key(9)], RequestContext(req_id="other"))
    assert plan.evicted_keys == [tail]


def test_without_request_ranks_the_oldest_store_goes_first():
    # 0.32: every insert is a new rank, so the head (stored first) goes.
    manager = CPUOffloadingManager(3, profile=get_profile("0.32"))
    head, _, _ = _store_running_request(manager)
    plan = manager.prepare_store([_key(9)], RequestContext(req_id="other"))
    assert plan.evicted_keys == [head]


def test_an_older_request_does_not_demote_a_newer_use():
    manager = CPUOffloadingManager(3, profile=get_profile("0.33"))
    old, cold, newer = (RequestContext(req_id=n) for n in ("old", "cold", "newer"))
    pinned, unused, shared = _key(1), _key(2), _key(3)
    for ctx, key, position in ((old, pinned, 16), (cold, unused, 16), (newer, shared, 32)):
        ctx.set_offload_key_position(key, position)
        manager.prepare_store([key], ctx)
        manager.complete_store([key], ctx)
    manager.prepare_load([pinned], old)
    old.set_offload_key_position(shared, 32)
    manager.prepare_load([shared], old)
    manager.complete_load([shared], old)
    assert manager.prepare_store([_key(4)], RequestContext()).evicted_keys == [unused]


def _failed_then_retried(profile: str):
    manager = CPUOffloadingManager(4, enable_events=True, profile=get_profile(profile))
    ctx = RequestContext()
    manager.prepare_store([_key(1), _key(2)], ctx)
    manager.complete_store([_key(1), _key(2)], ctx, success=False)
    manager.prepare_store([_key(1)], ctx)  # the retry holds key 1 again
    manager.prepare_store([_key(3)], ctx)
    manager.complete_store([_key(3)], ctx)
    return manager


def test_a_failed_store_is_a_metadata_only_removal_pruned_at_drain():
    manager = _failed_then_retried("0.33")
    drain = manager.take_events()
    cleanup = next(drain)
    assert (cleanup.keys, cleanup.removed, cleanup.metadata_only) == ([_key(2)], True, True)
    # The batch left at the first read: a second drain finds nothing.
    assert list(manager.take_events()) == []
    assert [e.keys for e in drain] == [[_key(3)]]


def test_before_0_33_a_failed_store_announces_nothing():
    events = list(_failed_then_retried("0.32").take_events())
    assert [(e.keys, e.removed) for e in events] == [([_key(3)], False)]
