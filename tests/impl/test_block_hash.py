"""Block hashing: the documented formula, extra keys per profile, NONE_HASH seeding.

Expected values are computed here from the formula vLLM documents
(hash(serialise((parent, tuple(tokens), extra_keys)))) with hashlib/cbor2/pickle
directly, not through impl.
"""

import hashlib
import pickle

import cbor2
import pytest
import xxhash

from impl.block_hash import (
    RequestBlockHasher,
    block_extra_keys,
    event_extra_keys,
    get_hash_fn,
    get_request_block_hasher,
    none_hash,
)
from impl.profiles import get_profile
from impl.request import LoRA, MMFeature, Request

P032, P017 = get_profile("0.32"), get_profile("0.17")


def _pickle(o):
    return pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(o):
    return cbor2.dumps(o, canonical=True)


REFERENCE = {
    "sha256": lambda o: hashlib.sha256(_pickle(o)).digest(),
    "sha256_cbor": lambda o: hashlib.sha256(_cbor(o)).digest(),
    "xxhash": lambda o: xxhash.xxh3_128_digest(_pickle(o)),
    "xxhash_cbor": lambda o: xxhash.xxh3_128_digest(_cbor(o)),
}


@pytest.mark.parametrize("algo", sorted(REFERENCE))
def test_chained_hashes_follow_the_formula(algo):
    ref = REFERENCE[algo]
    parent = ref("42")
    tokens = list(range(10))
    expected = []
    for i in range(2):  # 10 tokens, block size 4: two full blocks
        parent = ref((parent, tuple(tokens[4 * i:4 * i + 4]), None))
        expected.append(parent)
    hasher = RequestBlockHasher(4, get_hash_fn(algo), none_hash(P032, algo, "42"), True)
    req = Request("r", tokens, len(tokens))
    assert hasher.update(req) == expected


def test_incremental_hashing_equals_hashing_at_once():
    hasher = RequestBlockHasher(4, get_hash_fn("sha256"), none_hash(P032, "sha256", "0"), True)
    whole = Request("a", list(range(23)), 23)
    hasher.update(whole)
    grown = Request("b", list(range(3)), 3)
    assert not hasher.update(grown)
    for t in range(3, 23):
        grown.all_token_ids.append(t)
        hasher.update(grown)
    assert grown.block_hashes == whole.block_hashes
    assert len(whole.block_hashes) == 5


def test_none_hash_seeding_per_profile():
    sha = REFERENCE["sha256"]
    assert none_hash(P032, "sha256", "7") == sha("7")
    assert none_hash(P017, "sha256", "7") == sha("7")
    # 0.32 without a seed: a fixed default for the cryptographic algorithms ...
    assert none_hash(P032, "sha256", None) == sha("vllm-none-hash")
    # ... and fresh randomness for xxhash; 0.17 is random for every algorithm.
    assert none_hash(P032, "xxhash", None) != none_hash(P032, "xxhash", None)
    assert none_hash(P017, "sha256", None) != none_hash(P017, "sha256", None)


def test_extra_keys_tagged_and_untagged():
    req = Request(
        "r", list(range(12)), 12,
        lora=LoRA("adapter", 3, "/loras/a"),
        cache_salt="salt",
        mm_features=(MMFeature("img0", 2, 3), MMFeature("img1", 5, 6)),
    )
    # Block [0, 4): lora, the image starting at 2, the salt (first block only).
    assert block_extra_keys(req, 0, 4, tagged=True) == (
        ("lora", "adapter", "/loras/a"), ("mm", "img0", 2), ("cache_salt", "salt"))
    # Untagged (0.19-0.30): the item with its offset; 0.17-0.18 the bare identifier.
    assert block_extra_keys(req, 0, 4, tagged=False) == ("adapter", ("img0", 2), "salt")
    assert block_extra_keys(req, 0, 4, tagged=False, mm_offset=False) == (
        "adapter", "img0", "salt")
    # Block [4, 8): img0 ends at 5 and img1 starts at 5; offsets are relative.
    assert block_extra_keys(req, 4, 8, tagged=True) == (
        ("lora", "adapter", "/loras/a"), ("mm", "img0", -2), ("mm", "img1", 1))
    # Block [8, 12): inside img1 (5..11), which started 3 tokens before the block.
    assert block_extra_keys(req, 8, 12, tagged=True) == (
        ("lora", "adapter", "/loras/a"), ("mm", "img1", -3))
    assert event_extra_keys(block_extra_keys(req, 4, 8, tagged=True)) == (
        "adapter", ("img0", -2), ("img1", 1))
    # Untagged keys are published as they are hashed.
    assert event_extra_keys(block_extra_keys(req, 4, 8, tagged=False), tagged=False) == (
        "adapter", ("img0", -2), ("img1", 1))


def test_an_item_ending_at_a_block_start_is_in_it_only_before_0_19():
    # img0 fills tokens 2..3 and ends exactly where the block [4, 8) starts.
    req = Request("r", list(range(8)), 8, mm_features=(MMFeature("img0", 2, 2),))
    assert block_extra_keys(req, 4, 8, tagged=False, mm_offset=False) == ("img0",)
    assert block_extra_keys(req, 4, 8, tagged=False) is None


def test_a_resumed_walk_keys_only_the_last_item_before_0_31():
    # Two items reach the block [4, 8); a hashing call beginning there (the
    # prompt's first block is hashed already) walks from the last one only
    # in 0.17-0.30, and keys both from 0.31 on.
    req = Request("r", list(range(8)), 8,
                  mm_features=(MMFeature("img0", 3, 2), MMFeature("img1", 6, 1)))
    assert block_extra_keys(req, 4, 8, tagged=False, walk_start=4,
                            resume_at_last_item=True) == (("img1", 2),)
    assert block_extra_keys(req, 4, 8, tagged=False, walk_start=4) == (
        ("img0", -1), ("img1", 2))
    # A walk from the prompt's start is no resumed walk.
    assert block_extra_keys(req, 4, 8, tagged=False, walk_start=0,
                            resume_at_last_item=True) == (("img0", -1), ("img1", 2))
    assert (get_profile("0.30").mm_resumed_walk_last_item,
            get_profile("0.31").mm_resumed_walk_last_item) == (True, False)


def test_no_extra_keys_is_none():
    assert block_extra_keys(Request("r", [1, 2], 2), 0, 2, tagged=True) is None


def test_extra_keys_enter_the_hash():
    algo = "sha256"
    nh = none_hash(P032, algo, "0")
    hasher = RequestBlockHasher(4, get_hash_fn(algo), nh, True)
    req = Request("r", list(range(4)), 4, cache_salt="s")
    (h,) = hasher.update(req)
    assert h == REFERENCE[algo]((nh, (0, 1, 2, 3), (("cache_salt", "s"),)))


def test_prompt_embeds_digest_is_per_block():
    row = 8  # 2 float32 values per token
    embeds = bytes(range(64))  # 8 tokens
    req = Request("r", [0] * 8, 8, prompt_embeds=embeds, embeds_row_bytes=row)
    keys = block_extra_keys(req, 4, 8, tagged=True)
    assert keys == (("prompt_embeds", hashlib.sha256(embeds[32:64]).digest()),)


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown hash algorithm 'md5'"):
        get_hash_fn("md5")


def test_builtin_hash_is_accepted_as_vllms_tests_pass_it():
    """vLLM's unit tests build requests with get_request_block_hasher(size,
    hash): the chained formula with the builtin hash (ints, not bytes)."""
    hasher = get_request_block_hasher(4, hash, P032, seed="0")
    req = Request("r", list(range(9)), 9)
    first = hash((hash("0"), (0, 1, 2, 3), None))
    second = hash((first, (4, 5, 6, 7), None))
    assert hasher.update(req) == [first, second] and req.block_hashes == [first, second]


def test_any_callable_is_accepted_with_none_hash_as_the_profile_says():
    def digest(obj):
        return hashlib.md5(repr(obj).encode()).digest()

    assert get_hash_fn(digest) is digest
    # 0.32 without a seed: the fixed seed, as for the cryptographic algorithms.
    assert none_hash(P032, digest, None) == digest("vllm-none-hash")
    assert none_hash(P032, digest, "5") == digest("5")
    hasher = get_request_block_hasher(2, digest, P017, seed="5")
    req = Request("r", [7, 8, 9], 3)
    assert hasher.update(req) == [digest((digest("5"), (7, 8), None))]
