"""vLLM's BlockPool, BlockHashToBlockMap, FreeKVCacheBlockQueue and
KVCacheBlock names over impl's."""

from __future__ import annotations

import inspect

from harness.peer import convert
from harness.peer import features as F
from harness.peer.adapters.base import Adapter, register, unwrap
from harness.peer.adapters.metrics import impl_collector
from harness.peer.lacks import require
from impl import block as iblock
from impl import block_hash_map as imap
from impl import block_pool as ipool
from impl import free_queue as iqueue


def events_use_int_hashes() -> bool:
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES setting, as impl's flag."""
    import vllm.envs as envs

    return bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)


@register(ipool.BlockPool)
class BlockPool(Adapter):
    def __init__(self, *args, **kwargs):
        # Bound to the running release's own signature: 0.33 put
        # num_hash_lookahead_tokens before medium.
        from vllm.v1.core.block_pool import BlockPool as VllmPool

        bound = inspect.signature(VllmPool.__init__).bind(None, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(arguments)))  # self
        self._init(**arguments)

    def _init(self, num_gpu_blocks, enable_caching, hash_block_size,
              enable_kv_cache_events=False, metrics_collector=None, medium="GPU",
              num_hash_lookahead_tokens=0):
        collector = impl_collector(metrics_collector)
        require(medium == "GPU", F.HISPARSE, f"BlockPool(medium={medium!r})")
        object.__setattr__(self, "_impl", ipool.BlockPool(
            num_gpu_blocks, enable_caching, hash_block_size,
            enable_kv_cache_events=enable_kv_cache_events, profile=convert.PROFILE,
            events_use_int_hashes=events_use_int_hashes(), metrics_collector=collector,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        ))

    # vLLM's private names for what impl does under its own (tests call them).
    _PRIVATE = {"_maybe_evict_cached_block": "evict_cached_block"}


@register(imap.BlockHashToBlockMap)
class BlockHashToBlockMap(Adapter):
    def __init__(self):
        object.__setattr__(self, "_impl", imap.BlockHashToBlockMap())

    def __len__(self) -> int:
        return len(unwrap(self))


@register(iqueue.FreeKVCacheBlockQueue)
class FreeKVCacheBlockQueue(Adapter):
    def __init__(self, blocks):
        object.__setattr__(self, "_impl", iqueue.FreeKVCacheBlockQueue(list(blocks)))

    def get_all_free_blocks(self):
        # impl's queue iterates its free blocks head to tail: the same list.
        return list(unwrap(self))

    def __iter__(self):
        return iter(unwrap(self))


class _BlockMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, iblock.KVCacheBlock)


class KVCacheBlock(metaclass=_BlockMeta):  # noqa: D101
    """Builds impl's KVCacheBlock from vLLM's constructor fields."""

    def __new__(cls, block_id, ref_cnt=0, *, pool=None, is_null=False, **rest):
        require(not rest, "KVCacheBlock fields", ", ".join(rest))
        block = iblock.KVCacheBlock(block_id)
        block.ref_cnt = ref_cnt
        block.is_null = is_null
        return block

