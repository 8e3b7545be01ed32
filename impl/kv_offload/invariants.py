"""What must hold of the CPU offload manager between any two calls: slots
never over capacity nor shared, counts matching the chunks, the policies'
own bookkeeping (ARC's ghost lists, LRU's evictable set)."""

from impl.kv_offload.chunk import STORING
from impl.kv_offload.policies.arc import ARCCachePolicy
from impl.kv_offload.policies.lru import LRUCachePolicy


def held_chunks(policy) -> dict:
    if isinstance(policy, ARCCachePolicy):
        return {**policy.t1, **policy.t2}
    return dict(policy.held)


def violations(manager) -> list[str]:
    out: list[str] = []
    policy = manager.policy
    chunks = held_chunks(policy)
    n = manager.num_chunks
    if len(chunks) > n:
        out.append(f"{len(chunks)} chunks held, capacity {n}")
    ids = [c.chunk_id for c in chunks.values()]
    if len(set(ids)) != len(ids):
        out.append("two keys share a CPU slot")
    if any(not 0 <= i < manager.handed_out for i in ids):
        out.append("a held chunk's slot was never handed out")
    if set(ids) & set(manager.free_slots):
        out.append("a held chunk's slot is on the free list")
    if len(chunks) + len(manager.free_slots) != manager.handed_out:
        out.append("slots lost: held + free != handed out")
    idle = sum(1 for c in chunks.values() if c.ref_cnt == 0)
    storing = sum(1 for c in chunks.values() if c.ref_cnt == STORING)
    if idle != manager.num_evictable:
        out.append(f"evictable count {manager.num_evictable}, chunks with ref_cnt 0: {idle}")
    if storing != manager.num_storing:
        out.append(f"write-pending count {manager.num_storing}, chunks storing: {storing}")
    if any(c.ref_cnt < STORING for c in chunks.values()):
        out.append("a ref_cnt below -1")
    if isinstance(policy, ARCCachePolicy):
        out.extend(_arc(policy))
    elif isinstance(policy, LRUCachePolicy):
        want = {k for k, c in chunks.items() if c.ref_cnt == 0}
        if policy.idle != want:
            out.append("LRU's evictable set is not the chunks with ref_cnt 0")
        live = {k for r, k in policy.queue if policy.rank.get(k) == r}
        if not policy.idle <= live:
            out.append("an evictable LRU key has no current heap entry")
    return out


def _arc(policy: ARCCachePolicy) -> list[str]:
    out = []
    if set(policy.t1) & set(policy.t2):
        out.append("a key in both T1 and T2")
    if set(policy.b1) & set(policy.b2):
        out.append("a key in both ghost lists")
    if (set(policy.b1) | set(policy.b2)) & (set(policy.t1) | set(policy.t2)):
        out.append("a held key in a ghost list")
    cap = policy.cache_capacity
    if len(policy.b1) > cap or len(policy.b2) > cap:
        out.append("a ghost list over capacity")
    if not 0 <= policy.target_t1_size <= cap:
        out.append(f"target_t1_size {policy.target_t1_size} outside [0, {cap}]")
    return out
