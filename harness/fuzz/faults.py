"""Known faults to inject into impl, to prove the fuzzer finds real bugs.

Test-only: `kvconform fuzz --inject-fault NAME` (and the tests) patch one impl
method in this process for the duration of a `with inject(name)` block. impl
itself carries no fault switches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from impl.block_hash import RequestBlockHasher
from impl.block_pool import BlockPool
from impl.coordinator import HybridKVCacheCoordinator
from impl.hisparse.coordinator import HiSparseCoordinator
from impl.kv_cache_manager import KVCacheManager
from impl.managers.base import SingleTypeKVCacheManager
from impl.managers.full_attention import FullAttentionManager
from impl.managers.mamba import MambaManager


def _free_in_allocation_order(self, request_id):
    # Fault: frees head first, so a request's prefix is evicted before its tail.
    blocks = self.pop_blocks_for_free(request_id)
    if blocks:
        self.block_pool.free_blocks(blocks)


def _touch_without_unlinking(self, blocks):
    # Fault: a hit on a free cached block leaves it in the free queue.
    for block in blocks:
        block.ref_cnt += 1


_real_get_computed_blocks = KVCacheManager.get_computed_blocks


def _lookup_whole_prompt(self, request, max_cache_hit_length=None):
    # Fault: off by one in the longest-hit rule: the whole prompt may hit.
    coordinator = self.coordinator
    real = coordinator.find_longest_cache_hit
    coordinator.find_longest_cache_hit = lambda hashes, n: real(hashes, n + 1)
    try:
        return _real_get_computed_blocks(self, request, max_cache_hit_length)
    finally:
        del coordinator.find_longest_cache_hit


def _hash_without_parent(self, request):
    # Fault: every block hashed as if it were the first (no chaining).
    size, tokens = self.hash_block_size, request.all_token_ids
    start, new = len(request.block_hashes) * size, []
    while start + size <= len(tokens):
        new.append(self.hash_fn((self.none_hash, tuple(tokens[start:start + size]), None)))
        start += size
    return new


def _publish_before_durable(self, request_id):
    # Fault: HiSparse publishes every computed host page at once, before its
    # write-back (and those before it) completed.
    state = self.request_states.get(request_id)
    if state is None or state.publication is None:
        return
    pending = state.publication
    self.host_manager.publish_blocks(pending.request, pending.num_computed_tokens)
    state.publication = None


def _no_proof_margin(self, batch):
    # Fault: a dropping batch looks no further than the candidate, so after
    # its drop the hybrid hit lands one unit short.
    return 0


_real_full_lookup = FullAttentionManager.find_longest_cache_hit.__func__


def _full_attention_keeps_last_block(cls, *args, drop_eagle_block=False, **kwargs):
    # Fault: full attention ignores EAGLE and keeps the last matched block.
    return _real_full_lookup(cls, *args, **kwargs)


_real_key_prompt_state = MambaManager._key_prompt_state


def _prompt_state_ignoring_eagle(self, request, num_tokens):
    # Fault: under EAGLE a Mamba group keeps its prompt-tail state where a
    # plain hit would land, not one hash unit earlier where an EAGLE hit does.
    moved, self.drop_eagle_checkpoint_block = self.drop_eagle_checkpoint_block, False
    try:
        return _real_key_prompt_state(self, request, num_tokens)
    finally:
        self.drop_eagle_checkpoint_block = moved


# name -> (class, method, replacement)
FAULTS: dict[str, tuple[type, str, Callable]] = {
    "free-wrong-order": (SingleTypeKVCacheManager, "free", _free_in_allocation_order),
    "touch-keeps-free": (BlockPool, "touch", _touch_without_unlinking),
    "longest-hit-off-by-one": (KVCacheManager, "get_computed_blocks", _lookup_whole_prompt),
    "hash-without-parent": (RequestBlockHasher, "__call__", _hash_without_parent),
    "eagle-no-proof-margin": (HybridKVCacheCoordinator, "_margin", _no_proof_margin),
    "eagle-keeps-last-block": (FullAttentionManager, "find_longest_cache_hit",
                               classmethod(_full_attention_keeps_last_block)),
    "mamba-eagle-tail-not-moved": (MambaManager, "_key_prompt_state",
                                   _prompt_state_ignoring_eagle),
}
# The fuzz kinds a fault shows in (default: the plain full-attention config).
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    "eagle-no-proof-margin": ("hybrid_eagle",),
    "eagle-keeps-last-block": ("eagle", "hybrid_eagle"),
    "mamba-eagle-tail-not-moved": ("mamba_eagle",),
}
# Faults only a kind's own configs reach: name -> (kind config, class, method,
# replacement).
KIND_FAULTS: dict[str, tuple[str, type, str, Callable]] = {
    "hisparse-publish-before-durable": ("hisparse", HiSparseCoordinator, "_publish_ready",
                                        _publish_before_durable),
}


@contextmanager
def inject(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    if name in KIND_FAULTS:
        cls, method, replacement = KIND_FAULTS[name][1:]
    elif name in FAULTS:
        cls, method, replacement = FAULTS[name]
    else:
        raise ValueError(f"unknown fault '{name}' (known: {', '.join([*FAULTS, *KIND_FAULTS])})")
    original = cls.__dict__[method]
    setattr(cls, method, replacement)
    try:
        yield
    finally:
        setattr(cls, method, original)
