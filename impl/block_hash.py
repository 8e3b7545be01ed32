"""Prefix-cache block hashing, byte-identical to vLLM's.

A block's hash is hash_fn((parent_hash, tuple(block_token_ids), extra_keys)), with
the parent of a request's first block being NONE_HASH. hash_fn serialises that
tuple with pickle (highest protocol) or canonical CBOR and digests it with
SHA-256 or XXH3-128: the serialisation is part of the contract, so we use the
same serialisers.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import pickle
from collections.abc import Callable
from typing import Any

import cbor2

from impl.profiles import NoneHashSeed, VersionProfile
from impl.request import Request

try:
    import xxhash as xxhash_module
except ImportError:  # pragma: no cover - xxhash is a declared dependency
    xxhash_module = None

HashFn = Callable[[Any], bytes]
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxh3_128(data: bytes) -> bytes:
    if xxhash_module is None:
        raise ModuleNotFoundError("the xxhash hash algorithms need `pip install xxhash`")
    return xxhash_module.xxh3_128_digest(data)


def _xxhash(obj: Any) -> bytes:
    return _xxh3_128(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return _xxh3_128(cbor2.dumps(obj, canonical=True))


HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}
CRYPTOGRAPHIC = frozenset({"sha256", "sha256_cbor"})
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def get_hash_fn(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown hash algorithm '{name}' (known: {', '.join(HASH_FUNCTIONS)})"
        ) from None


def none_hash(profile: VersionProfile, algorithm: str, seed: str | None) -> bytes:
    """The parent hash of every request's first block.

    `seed` plays the role of PYTHONHASHSEED. Without one, some versions and
    algorithms draw a random seed: such hashes cannot be reproduced by anyone,
    which is why traces always carry a seed.
    """
    hash_fn = get_hash_fn(algorithm)
    if seed is not None:
        return hash_fn(seed)
    if profile.none_hash_seed is NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO:
        if algorithm in CRYPTOGRAPHIC:
            return hash_fn(DEFAULT_NONE_HASH_SEED)
        return hash_fn(os.urandom(32).hex())
    return os.urandom(32)


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The key of the cached-block map: the hash followed by a 4-byte group id."""
    return block_hash + group_id.to_bytes(4, "big")


def get_block_hash(key: bytes) -> bytes:
    return key[:-4]


def get_group_id(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


def _embeds_digest(request: Request, start: int, end: int) -> bytes:
    key = (start, end)
    digest = request.embeds_digests.get(key)
    if digest is None:
        row = request.embeds_row_bytes
        digest = hashlib.sha256(request.prompt_embeds[start * row : end * row]).digest()
        request.embeds_digests[key] = digest
    return digest


def block_extra_keys(
    request: Request, start: int, end: int, tagged: bool
) -> tuple[Any, ...] | None:
    """Extra keys of the block covering tokens [start, end), or None.

    Order matters (it is hashed): LoRA, multimodal features overlapping the block,
    cache salt (first block only), prompt-embeds digest.
    """
    keys: list[Any] = []
    lora = request.lora
    if lora is not None:
        keys.append(("lora", lora.name, lora.path) if tagged else lora.name)
    feats = request.mm_features
    if feats:
        # First feature ending after `start`; features are sorted and disjoint.
        i = bisect.bisect_right(feats, start, key=lambda f: f.offset + f.length)
        while i < len(feats) and feats[i].offset < end:
            f = feats[i]
            keys.append(("mm", f.identifier, f.offset - start) if tagged else f.identifier)
            i += 1
    if start == 0 and request.cache_salt:
        salt = request.cache_salt
        keys.append(("cache_salt", salt) if tagged else salt)
    if request.prompt_embeds is not None:
        digest = _embeds_digest(request, start, end)
        keys.append(("prompt_embeds", digest) if tagged else digest)
    return tuple(keys) if keys else None


def event_extra_keys(keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """Extra keys as KV events publish them: untagged, mm as (identifier, offset)."""
    if keys is None:
        return None
    out = []
    for key in keys:
        if isinstance(key, tuple):
            out.append(key[1:] if key[0] == "mm" else key[1])
        else:
            out.append(key)
    return tuple(out)


class RequestBlockHasher:
    """Computes the hashes of a request's newly completed blocks, incrementally.

    vLLM: get_request_block_hasher. Called on arrival and after output tokens are
    appended; only full `hash_block_size` blocks are hashed.
    """

    __slots__ = ("hash_block_size", "hash_fn", "none_hash", "tagged")

    def __init__(
        self, hash_block_size: int, hash_fn: HashFn, none_hash: bytes, tagged: bool
    ) -> None:
        self.hash_block_size = hash_block_size
        self.hash_fn = hash_fn
        self.none_hash = none_hash
        self.tagged = tagged

    def __call__(self, request: Request) -> list[bytes]:
        size = self.hash_block_size
        hashes = request.block_hashes
        start = len(hashes) * size
        tokens = request.all_token_ids
        if start + size > len(tokens):
            return []
        hash_fn = self.hash_fn
        # vLLM treats an empty parent like no parent ("if not parent").
        parent = (hashes[-1] if hashes else None) or self.none_hash
        plain = request.lora is None and not request.mm_features and (
            request.prompt_embeds is None
        ) and not request.cache_salt
        new: list[bytes] = []
        while start + size <= len(tokens):
            end = start + size
            extra = None if plain else block_extra_keys(request, start, end, self.tagged)
            parent = hash_fn((parent, tuple(tokens[start:end]), extra))
            new.append(parent)
            start = end
        return new

    def update(self, request: Request) -> list[bytes]:
        """Append hashes of any newly full blocks to the request; return them."""
        new = self(request)
        if new:
            request.block_hashes.extend(new)
        return new
