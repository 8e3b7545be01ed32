"""vLLM's hashing names (kv_cache_utils, vllm.utils.hashing) over
impl.block_hash."""

from __future__ import annotations

import os

from harness.peer import convert
from harness.peer.lacks import ImplLacks
from impl import block_hash as ihash
from impl import block_hash_view as iview
from impl.profiles import MMExtraKey

ALGORITHMS = tuple(ihash.HASH_FUNCTIONS)


class _State:
    # The none hash impl computed at the last init_none_hash (vLLM keeps it in
    # the module global NONE_HASH).
    none_hash: bytes | None = None
    seed: str | None = None


STATE = _State()


def _algorithm_of(hash_fn) -> str | None:
    """The impl algorithm name for a hash function (vLLM's or impl's)."""
    import vllm.utils.hashing as vh

    for name in ALGORITHMS:
        if hash_fn is getattr(vh, name, None) or hash_fn is ihash.HASH_FUNCTIONS[name]:
            return name
        if getattr(hash_fn, "__kvconform_algorithm__", None) == name:
            return name
    return None


def impl_hash_fn(hash_fn):
    """vLLM's hash function -> impl's of the same algorithm; a custom callable
    is passed through (impl's hasher takes any callable)."""
    name = _algorithm_of(hash_fn)
    return ihash.get_hash_fn(name) if name is not None else hash_fn


def _named(name: str):
    def fn(obj):
        return ihash.get_hash_fn(name)(obj)

    fn.__name__ = name
    fn.__kvconform_algorithm__ = name
    return fn


sha256 = _named("sha256")
sha256_cbor = _named("sha256_cbor")
xxhash = _named("xxhash")
xxhash_cbor = _named("xxhash_cbor")


def init_none_hash(hash_fn) -> None:
    # impl derives NONE_HASH from a named algorithm or any callable.
    name = _algorithm_of(hash_fn)
    seed = os.getenv("PYTHONHASHSEED")
    STATE.none_hash = ihash.none_hash(convert.PROFILE, hash_fn if name is None else name, seed)
    STATE.seed = seed


def none_hash() -> bytes:
    if STATE.none_hash is None:
        raise ImplLacks("NONE_HASH before init_none_hash")
    return STATE.none_hash


def _mm_offset() -> bool:
    """Whether a multimodal item's key carries its offset (profile.mm_extra_key)."""
    return convert.PROFILE.mm_extra_key is MMExtraKey.IDENTIFIER_OFFSET


def get_request_block_hasher(hash_block_size: int, caching_hash_fn,
                              num_hash_lookahead_tokens: int = 0):
    fn = impl_hash_fn(caching_hash_fn)

    def request_block_hasher(request):
        hasher = ihash.RequestBlockHasher.for_profile(hash_block_size, fn, none_hash(),
                                                      convert.PROFILE,
                                                      num_hash_lookahead_tokens)
        return hasher(convert.to_impl_request(request))

    return request_block_hasher


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    # vLLM's first block hashes from its process-wide NONE_HASH: the one
    # init_none_hash made (impl takes it as an argument).
    return ihash.hash_block_tokens(impl_hash_fn(hash_function), parent_block_hash,
                                   curr_block_token_ids, extra_keys,
                                   none_hash=STATE.none_hash)


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    return ihash.generate_block_hash_extra_keys(
        convert.to_impl_request(request), start_token_idx, end_token_idx, start_mm_idx,
        convert.PROFILE.tagged_extra_keys, _mm_offset())


def to_event_extra_keys(extra_keys):
    if not extra_keys:
        return None
    return [ihash.event_extra_keys(k) for k in extra_keys] or None


make_block_hash_with_group_id = ihash.make_block_hash_with_group_id
get_block_hash = ihash.get_block_hash
get_group_id = ihash.get_group_id


class _ViewMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, iview.BlockHashListWithBlockSize)


class BlockHashListWithBlockSize(metaclass=_ViewMeta):
    """Builds impl's view from vLLM's constructor arguments."""

    def __new__(cls, block_hashes, hash_block_size, target_block_size):
        return iview.BlockHashListWithBlockSize(block_hashes, hash_block_size,
                                                target_block_size,
                                                convert.PROFILE.coarse_block_hash)


def resolve_block_hashes(block_hashes, hash_block_size, block_size, *,
                         supports_fine_grained_hash_lookup=False, alignment_tokens=None):
    return iview.resolve_block_hashes(block_hashes, hash_block_size, block_size,
                                      convert.PROFILE.coarse_block_hash,
                                      supports_fine_grained_hash_lookup, alignment_tokens)


def maybe_convert_block_hash(hash_bytes):
    from harness.peer.adapters.pool import events_use_int_hashes

    return ihash.external_block_hash(hash_bytes, events_use_int_hashes())
