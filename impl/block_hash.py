"""Prefix-cache hashing of a request's tokens; specs/KV_CACHE_MANAGER.md §3.

Every `hash_block_size` tokens of a request get a hash that chains over the
whole prefix: H((parent, tokens of the block, extra keys)). The serialiser
(pickle or canonical CBOR) is as much part of the value as the digest, so we
use the same serialisers vLLM does and compare bytes, not semantics.
"""

import hashlib
import os
import pickle
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

from impl.profiles import MMExtraKey, NoneHashSeed, VersionProfile
from impl.request import Request

try:
    from xxhash import xxh3_128_digest
except ImportError:  # pragma: no cover - xxhash is a declared dependency
    xxh3_128_digest = None

HashFn = Callable[[Any], Any]


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _canonical_cbor(obj: Any) -> bytes:
    return cbor2.dumps(obj, canonical=True)


def _xxh3(data: bytes) -> bytes:
    if xxh3_128_digest is None:
        raise ModuleNotFoundError("xxhash algorithms need the xxhash package")
    return xxh3_128_digest(data)


def _sha256_of_pickle(obj: Any) -> bytes:
    # (The default algorithm, called per block: pickled inline, one call less.)
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_of_cbor(obj: Any) -> bytes:
    return hashlib.sha256(_canonical_cbor(obj)).digest()


def _xxh3_of_pickle(obj: Any) -> bytes:
    return _xxh3(_pickled(obj))


def _xxh3_of_cbor(obj: Any) -> bytes:
    return _xxh3(_canonical_cbor(obj))


# The one list of algorithm names (traces, configs and the CLI read it here).
HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256": _sha256_of_pickle,
    "sha256_cbor": _sha256_of_cbor,
    "xxhash": _xxh3_of_pickle,
    "xxhash_cbor": _xxh3_of_cbor,
}
# Whose NONE_HASH seed may be public: collisions cannot be precomputed.
CRYPTOGRAPHIC = frozenset({"sha256", "sha256_cbor"})
_FIXED_SEED = "vllm-none-hash"


def get_hash_fn(algorithm: str | HashFn) -> HashFn:
    """A named algorithm's function; a callable (the builtin `hash`, any
    function of one argument) is taken as it is, as vLLM takes one."""
    if callable(algorithm):
        return algorithm
    fn = HASH_FUNCTIONS.get(algorithm)
    if fn is None:
        known = ", ".join(HASH_FUNCTIONS)
        raise ValueError(f"unknown hash algorithm '{algorithm}' (known: {known})")
    return fn


def none_hash(profile: VersionProfile, algorithm: str | HashFn, seed: str | None) -> Any:
    """The parent of every request's first block.

    `seed` stands for PYTHONHASHSEED. Without it the value may be random for
    the life of the process (the profile says when), and hashes made with it
    cannot be reproduced anywhere else; traces therefore carry a seed.
    """
    fn = get_hash_fn(algorithm)
    if seed is not None:
        return fn(seed)
    if profile.none_hash_seed is NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO:
        secret = isinstance(algorithm, str) and algorithm not in CRYPTOGRAPHIC
        return fn(os.urandom(32).hex() if secret else _FIXED_SEED)
    return os.urandom(32)


# -- cache keys --------------------------------------------------------------

_GROUP_ID_BYTES = 4


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The pool's key: a group's blocks of equal content are distinct entries."""
    return block_hash + group_id.to_bytes(_GROUP_ID_BYTES, "big")


def get_block_hash(key: bytes) -> bytes:
    return key[:-_GROUP_ID_BYTES]


def get_group_id(key: bytes) -> int:
    return int.from_bytes(key[-_GROUP_ID_BYTES:], "big")


_LOW_64_BITS = (1 << 64) - 1


def external_block_hash(block_hash: bytes, as_int: bool) -> bytes | int:
    """A hash as KV events publish it: its low 64 bits (vLLM's default,
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) or the bytes themselves."""
    return int.from_bytes(block_hash, "big") & _LOW_64_BITS if as_int else block_hash


# -- extra keys ------------------------------------------------------------------


def _embeds_digest(request: Request, start: int, end: int) -> bytes:
    memo = request.embeds_digests
    digest = memo.get((start, end))
    if digest is None:
        width = request.embeds_row_bytes
        digest = hashlib.sha256(request.prompt_embeds[start * width:end * width]).digest()
        memo[(start, end)] = digest
    return digest


def _feature_end(feature) -> int:
    return feature.offset + feature.length


def block_extra_keys(
    request: Request, start: int, end: int, tagged: bool, mm_offset: bool = True,
    walk_start: int | None = None, resume_at_last_item: bool = False,
) -> tuple[Any, ...] | None:
    """What besides the tokens tells the block [start, end) apart, in hash
    order: LoRA adapter, overlapping multimodal items, salt (first block),
    prompt-embedding digest. None when there is nothing.

    `mm_offset` (profile.mm_extra_key): an item's key carries its offset in
    the block, and an item ending where the block starts is not in it;
    otherwise the key is the bare identifier and such an item still is, but
    only in the first block of a walk over blocks (`walk_start`, where the
    caller began; None: this block): later blocks have stepped past it.

    `resume_at_last_item` (profile.mm_resumed_walk_last_item): a walk that
    begins after the prompt's first block looks at the last item only (the
    blocks it hashes were filled by generated tokens, so 0.17-0.30 assume no
    earlier item reaches them)."""
    found: list[Any] = []
    if request.lora is not None:
        lora = request.lora
        found.append(("lora", lora.name, lora.path) if tagged else lora.name)
    features = request.mm_features
    if features:
        # Sorted and disjoint: skip those ending before `start` (or at it).
        at_walk_start = walk_start is None or walk_start == start
        i = (bisect_right(features, start, key=_feature_end)
             if mm_offset or not at_walk_start
             else bisect_left(features, start, key=_feature_end))
        if resume_at_last_item and walk_start:
            i = max(i, len(features) - 1)
        while i < len(features) and features[i].offset < end:
            item = features[i]
            if tagged:
                found.append(("mm", item.identifier, item.offset - start))
            elif mm_offset:
                found.append((item.identifier, item.offset - start))
            else:
                found.append(item.identifier)
            i += 1
    if start == 0 and request.cache_salt:
        found.append(("cache_salt", request.cache_salt) if tagged else request.cache_salt)
    if request.prompt_embeds is not None:
        digest = _embeds_digest(request, start, end)
        found.append(("prompt_embeds", digest) if tagged else digest)
    return tuple(found) if found else None


def generate_block_hash_extra_keys(request: Request, start: int, end: int,
                                   start_mm_idx: int, tagged: bool = True,
                                   mm_offset: bool = True
                                   ) -> tuple[tuple[Any, ...] | None, int]:
    """The block's extra keys, and where a caller walking the blocks in
    order resumes among the multimodal items: from `start_mm_idx` (negative
    counts from the end), past every item ending at or before `end`. With
    no item left at or after `start`, the index comes back as given."""
    keys = block_extra_keys(request, start, end, tagged, mm_offset)
    features = request.mm_features
    if not features or _feature_end(features[-1]) <= start:
        return keys, start_mm_idx
    index = start_mm_idx + len(features) if start_mm_idx < 0 else start_mm_idx
    while index < len(features) and _feature_end(features[index]) <= end:
        index += 1
    return keys, index


def hash_block_tokens(hash_fn: HashFn, parent_block_hash: Any, curr_block_token_ids,
                      extra_keys: tuple[Any, ...] | None = None, *,
                      none_hash: Any = None) -> Any:
    """One block's chained hash: its parent's hash (NONE_HASH for the first
    block, or whenever the parent is falsy), its tokens and its extra keys."""
    if not parent_block_hash:
        if none_hash is None:
            raise ValueError("the first block of a chain hashes from NONE_HASH; none given")
        parent_block_hash = none_hash
    return hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def event_extra_keys(keys: tuple[Any, ...] | None, tagged: bool = True
                     ) -> tuple[Any, ...] | None:
    """Extra keys in the shape KV events carry: never tagged; a multimodal
    item as (identifier, offset). Untagged keys are published as they are."""
    if keys is None or not tagged:
        return keys
    return tuple(
        (k[1:] if k[0] == "mm" else k[1]) if type(k) is tuple else k for k in keys
    )


# -- a request's hashes ---------------------------------------------------------------


class RequestBlockHasher:
    """Hashes the blocks a request's tokens have newly filled (vLLM builds the
    same function with get_request_block_hasher). Called when the request
    arrives and after tokens are appended; partial blocks wait.

    With `lookahead` L > 0 (0.33's num_hash_lookahead_tokens) a block's hash
    also covers the L tokens after it: it waits for them, and its extra keys
    become (keys of the block and those tokens, *those tokens)."""

    __slots__ = ("hash_block_size", "hash_fn", "none_hash", "tagged", "mm_offset",
                 "lookahead", "resume_at_last_item")

    def __init__(self, hash_block_size: int, hash_fn: HashFn, none_hash: Any,
                 tagged: bool, mm_offset: bool = True, lookahead: int = 0,
                 resume_at_last_item: bool = False) -> None:
        self.hash_block_size = hash_block_size
        self.hash_fn = hash_fn
        self.none_hash = none_hash
        self.tagged = tagged
        self.mm_offset = mm_offset
        self.lookahead = lookahead
        self.resume_at_last_item = resume_at_last_item

    @classmethod
    def for_profile(cls, hash_block_size: int, hash_fn: HashFn, none_hash: Any,
                    profile: VersionProfile, lookahead: int = 0) -> "RequestBlockHasher":
        """The hasher of the profile's release (its extra-key rules)."""
        return cls(hash_block_size, hash_fn, none_hash, profile.tagged_extra_keys,
                   profile.mm_extra_key is MMExtraKey.IDENTIFIER_OFFSET, lookahead,
                   profile.mm_resumed_walk_last_item)

    def __call__(self, request: Request) -> list:
        """The hashes of the full blocks after the last hashed one."""
        size = self.hash_block_size
        done = request.block_hashes
        tokens = request.all_token_ids
        begin = len(done) * size
        ahead = self.lookahead
        end = len(tokens) - ahead
        fresh: list = []
        if begin + size > end:
            return fresh
        fn = self.hash_fn
        # A falsy previous hash counts as none (vLLM tests `if not parent`).
        parent = (done[-1] if done else None) or self.none_hash
        plain = (request.lora is None and not request.mm_features
                 and request.prompt_embeds is None and not request.cache_salt)
        tagged, mm_offset, last_item = self.tagged, self.mm_offset, self.resume_at_last_item
        first = begin  # the walk over multimodal items starts here
        while begin + size <= end:
            stop = begin + size
            if ahead:
                keys = None if plain else block_extra_keys(request, begin, stop + ahead,
                                                           tagged, mm_offset, first, last_item)
                keys = (keys, *tokens[stop:stop + ahead])
            else:
                keys = None if plain else block_extra_keys(request, begin, stop, tagged,
                                                           mm_offset, first, last_item)
            parent = fn((parent, tuple(tokens[begin:stop]), keys))
            fresh.append(parent)
            begin = stop
        return fresh

    def update(self, request: Request) -> Sequence:
        """Hash what is newly full, extend the request's list, return the new ones."""
        if ((len(request.block_hashes) + 1) * self.hash_block_size + self.lookahead
                > len(request.all_token_ids)):
            return ()
        fresh = self(request)
        request.block_hashes.extend(fresh)
        return fresh


def get_request_block_hasher(
    hash_block_size: int,
    hash_fn: str | HashFn,
    profile: VersionProfile,
    seed: str | None = None,
) -> RequestBlockHasher:
    """vLLM's entry point by its name: a hasher for any algorithm name or
    callable, with NONE_HASH derived from it as the profile says."""
    fn = get_hash_fn(hash_fn)
    return RequestBlockHasher.for_profile(hash_block_size, fn,
                                          none_hash(profile, hash_fn, seed), profile)
