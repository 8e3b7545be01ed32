"""Hand-written scenarios with hand-derived expected answers.

Each expectation below was worked out from vLLM's documented design
(docs/design/prefix_caching.md) and source, not recorded from any
implementation; the comments show the derivation. Both backends must produce
them, which makes them an oracle independent of impl and of vLLM.

Block ids: block 0 is the null block, so the documentation's block n is our n+1.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import cbor2

from harness.cache_config import CacheConfig, GroupConfig
from harness.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    Checkpoint,
    Event,
    EvictBlocks,
    Free,
    LoRA,
    Lookup,
    MMFeature,
    Preempt,
    PromptEmbeds,
    RecordStats,
    ResetPrefixCache,
)

FQ = ("free_queue",)


@dataclass(slots=True)
class Scenario:
    name: str
    config: CacheConfig
    # (event, expected answer fields or None); only the given fields are checked.
    steps: list[tuple[Event, dict | None]]
    profile: str = "0.32"
    doc: str = ""

    @property
    def events(self) -> list[Event]:
        return [e for e, _ in self.steps]


def check_expected(answer: dict, expected: dict | None) -> str | None:
    """None if `answer` has every expected field with the expected value."""
    if expected is None:
        return None
    for key, want in expected.items():
        if answer.get(key) != want:
            return f"{key}: expected {want!r}, got {answer.get(key)!r}"
    return None


def _cfg(num_blocks: int, block_size: int = 4, **kw) -> CacheConfig:
    return CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(block_size),), **kw)


def _tok(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def documented_example(profile: str = "0.32") -> Scenario:
    """vLLM's prefix-caching example: block size 4, 10 usable blocks."""
    req0 = _tok(0, 15)
    req1 = _tok(0, 10) + _tok(100, 4)  # shares 10 tokens = 2 full blocks
    req2 = _tok(0, 12) + _tok(200, 25)  # shares 12 tokens = 3 full blocks
    if profile == "0.32":
        # Unhashed freed blocks go to the head (reused first); hashed to the tail.
        after_req0 = [5, 8, 9, 10, 4, 3]  # 5 (1 token, unhashed) first; 4, 3 tail
        after_req1 = [7, 5, 8, 9, 10, 4, 3, 6, 2, 1]
        # req2 touches 1,2,3 out of the queue, then takes the 7 blocks at the head;
        # 4 and 6 are the least recently used cached blocks: evicted in that order.
        req2_new = [7, 5, 8, 9, 10, 4, 6]
    else:
        # 0.17 (and the documentation's pictures): every freed block is appended.
        after_req0 = [8, 9, 10, 5, 4, 3]
        after_req1 = [8, 9, 10, 5, 4, 3, 7, 6, 2, 1]
        req2_new = [8, 9, 10, 5, 4, 7, 6]
    steps: list[tuple[Event, dict | None]] = [
        # Time 1: 15 tokens -> 4 blocks, 3 of them full and cached.
        (AddRequest("req0", req0), None),
        (Lookup("req0"), {"hit_tokens": 0, "block_ids": [[]]}),
        (Allocate("req0", 15), {"block_ids": [[1, 2, 3, 4]]}),
        # Time 2: token 16 fills block 4 (cached, no new block); token 17 needs
        # block 5.
        (AppendTokens("req0", [15]), None),
        (Allocate("req0", 1), {"block_ids": [[]]}),
        (AppendTokens("req0", [16]), None),
        (Allocate("req0", 1), {"block_ids": [[5]]}),
        # Time 3: 14 tokens, the first 10 shared: only 2 blocks (8 tokens) hit,
        # the third block matches 2 of 4 tokens only.
        (AddRequest("req1", req1), None),
        (Lookup("req1"), {"hit_tokens": 8, "block_ids": [[1, 2]]}),
        (Allocate("req1", 6), {"block_ids": [[6, 7]]}),
        # Time 4: req0 finishes; its blocks are freed tail first (5, 4, 3); 1 and
        # 2 stay with req1.
        (Free("req0"), None),
        (Checkpoint(FQ), {"free_queue": after_req0}),
        # Time 5: req1 finishes.
        (Free("req1"), None),
        (Checkpoint(FQ), {"free_queue": after_req1}),
        # Time 6: 37 tokens, the first 12 shared with req0: 3 blocks hit.
        (AddRequest("req2", req2), None),
        (Lookup("req2"), {"hit_tokens": 12, "block_ids": [[1, 2, 3]]}),
        (Allocate("req2", 25), {"block_ids": [[*req2_new]]}),
        # 3 hit + 7 new = all 10 usable blocks.
        (Checkpoint(("free_queue", "num_free")), {"free_queue": [], "num_free": 0}),
    ]
    return Scenario(
        "documented-example", _cfg(11), steps, profile,
        "docs/design/prefix_caching.md, step by step, then a longer third request",
    )


def eviction_under_pressure() -> Scenario:
    a = _tok(0, 12)  # 3 full blocks
    b = _tok(500, 20)  # needs 5 blocks
    steps = [
        (AddRequest("a", a), None),
        (Lookup("a"), None),
        (Allocate("a", 12), {"block_ids": [[1, 2, 3]]}),
        (Free("a"), None),
        # Hashed blocks are appended tail-first: 3 is evicted before 2 before 1.
        (Checkpoint(FQ), {"free_queue": [4, 5, 6, 7, 3, 2, 1]}),
        (AddRequest("b", b), None),
        (Lookup("b"), {"hit_tokens": 0}),
        # 5 blocks: 4, 5, 6, 7 are free and unhashed, then 3 is evicted.
        (Allocate("b", 20), {"block_ids": [[4, 5, 6, 7, 3]]}),
        (Checkpoint(("free_queue", "events")), {"free_queue": [2, 1]}),
        # a's prefix now hits only its first two blocks.
        (AddRequest("a2", a), None),
        (Lookup("a2"), {"hit_tokens": 8, "block_ids": [[1, 2]]}),
    ]
    return Scenario("eviction-under-pressure", _cfg(8), steps)


def reset_refused_while_held() -> Scenario:
    p = _tok(0, 9)
    steps = [
        (AddRequest("a", p), None),
        (Lookup("a"), None),
        (Allocate("a", 9), {"block_ids": [[1, 2, 3]]}),
        (RecordStats("a", 0), None),
        (ResetPrefixCache(), {"ok": False}),  # a holds blocks
        (Free("a"), None),
        (ResetPrefixCache(), {"ok": True}),
        (Checkpoint(("stats", "events")), {
            "stats": {"requests": 1, "queries": 9, "hits": 0, "preempted_requests": 0,
                      "preempted_queries": 0, "preempted_hits": 0, "reset": True},
        }),
        # The same prompt no longer hits.
        (AddRequest("b", p), None),
        (Lookup("b"), {"hit_tokens": 0, "block_ids": [[]]}),
    ]
    return Scenario("reset-refused-while-held", _cfg(8), steps)


def lookahead_tokens() -> Scenario:
    steps = [
        (AddRequest("a", _tok(0, 6)), None),
        (Lookup("a"), None),
        # 6 tokens + 3 lookahead = 9 slots = 3 blocks; only 1 block is full of
        # finalized tokens, so only it is cached.
        (Allocate("a", 6, num_lookahead_tokens=3), {"block_ids": [[1, 2, 3]]}),
        (Checkpoint(("events",)), None),
        (AddRequest("b", _tok(0, 6) + [99, 98, 97]), None),
        (Lookup("b"), {"hit_tokens": 4, "block_ids": [[1]]}),
        # Decode with 5 lookahead: 6 computed + 1 + 5 = 12 slots fit in 3 blocks;
        # the next step needs 13 slots, a fourth block.
        (AppendTokens("a", [6]), None),
        (Allocate("a", 1, num_lookahead_tokens=5), {"block_ids": [[]]}),
        (AppendTokens("a", [7]), None),
        (Allocate("a", 1, num_lookahead_tokens=5), {"block_ids": [[4]]}),
    ]
    return Scenario("lookahead-tokens", _cfg(8), steps)


def allocation_refused_when_full() -> Scenario:
    steps = [
        (AddRequest("a", _tok(0, 16)), None),
        (Lookup("a"), None),
        (Allocate("a", 16), {"block_ids": [[1, 2, 3, 4]]}),
        (AddRequest("b", _tok(100, 9)), None),
        (Lookup("b"), None),
        # 3 blocks needed, 2 free: refused, and nothing changes.
        (Allocate("b", 9), {"refused": True}),
        (Checkpoint(("free_queue", "num_free", "usage")),
         {"free_queue": [5, 6], "num_free": 2, "usage": 1.0 - 2 / 6}),
        (Lookup("b"), None),
        (Allocate("b", 8), {"block_ids": [[5, 6]]}),
        (Checkpoint(("num_free", "usage")), {"num_free": 0, "usage": 1.0}),
        (Preempt("a"), None),
        # a's 4 blocks are all full and cached: appended tail first.
        (Checkpoint(FQ), {"free_queue": [4, 3, 2, 1]}),
        (Lookup("a"), {"hit_tokens": 12, "block_ids": [[1, 2, 3]]}),
    ]
    return Scenario("allocation-refused-when-full", _cfg(7), steps)


def exact_block_multiple() -> Scenario:
    p = _tok(0, 8)
    steps = [
        (AddRequest("a", p), None),
        (Lookup("a"), None),
        (Allocate("a", 8), {"block_ids": [[1, 2]]}),
        (Free("a"), None),
        (AddRequest("b", p), None),
        # Both blocks are cached, but the last token must be recomputed: at most
        # 7 tokens may hit, i.e. one block.
        (Lookup("b"), {"hit_tokens": 4, "block_ids": [[1]]}),
        (Allocate("b", 4), {"block_ids": [[3]]}),
        (Checkpoint(FQ), {"free_queue": [4, 5, 2]}),
    ]
    return Scenario("exact-block-multiple", _cfg(6), steps)


def salted_requests() -> Scenario:
    p = _tok(0, 12)
    steps = [
        (AddRequest("a", p, cache_salt="alice"), None),
        (Lookup("a"), None),
        (Allocate("a", 12), {"block_ids": [[1, 2, 3]]}),
        (AddRequest("b", p, cache_salt="bob"), None),
        # The salt enters the first block's hash, hence every chained hash.
        (Lookup("b"), {"hit_tokens": 0, "block_ids": [[]]}),
        (AddRequest("c", p, cache_salt="alice"), None),
        (Lookup("c"), {"hit_tokens": 8, "block_ids": [[1, 2]]}),
        (AddRequest("d", p), None),
        (Lookup("d"), {"hit_tokens": 0}),
    ]
    return Scenario("salted-requests", _cfg(8), steps)


def _expected_hashes(algo: str, seed: str, tokens: list[int], block_size: int) -> list[str]:
    """Block hashes from the documented formula, computed independently:
    hash(serialise((parent, tuple(block_tokens), None))), parent of the first
    block = hash(serialise(seed))."""
    if algo.endswith("_cbor"):
        ser = lambda o: cbor2.dumps(o, canonical=True)  # noqa: E731
    else:
        ser = lambda o: pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)  # noqa: E731
    if algo.startswith("sha256"):
        digest = lambda b: hashlib.sha256(b).digest()  # noqa: E731
    else:
        import xxhash

        digest = xxhash.xxh3_128_digest
    parent = digest(ser(seed))
    out = []
    for i in range(len(tokens) // block_size):
        parent = digest(ser((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), None)))
        out.append(parent.hex())
    return out


def hash_algorithm(algo: str) -> Scenario:
    p = _tok(7, 10)
    steps = [
        (AddRequest("a", p), {"block_hashes": _expected_hashes(algo, "0", p, 4)}),
        (AppendTokens("a", [1, 2]), {"block_hashes": _expected_hashes(algo, "0", p + [1, 2], 4)[2:]}),
        (Lookup("a"), None),
        (Allocate("a", 12), {"block_ids": [[1, 2, 3]]}),
        (AddRequest("b", p + [1, 2, 3]), None),
        (Lookup("b"), {"hit_tokens": 12}),
    ]
    return Scenario(f"hash-{algo}", _cfg(8, hash_algo=algo), steps)


def evict_given_blocks() -> Scenario:
    p = _tok(0, 12)
    steps = [
        (AddRequest("a", p), None),
        (Lookup("a"), None),
        (Allocate("a", 12), {"block_ids": [[1, 2, 3]]}),
        (Checkpoint(("events",)), None),
        # Evicting block 2 breaks the chain: only block 1 can hit afterwards,
        # while a still holds all three.
        (EvictBlocks([2]), None),
        (AddRequest("b", p), None),
        (Lookup("b"), {"hit_tokens": 4, "block_ids": [[1]]}),
        (Checkpoint(("num_free",)), {"num_free": 4}),
    ]
    return Scenario("evict-given-blocks", _cfg(8), steps)


def extra_keys() -> Scenario:
    """LoRA, multimodal features and prompt embeddings enter block hashes."""
    p = _tok(0, 12)
    lora = LoRA("adapter", 1, "/loras/adapter")
    img = (MMFeature("img-a", 5, 2),)  # tokens 5-6: the second block
    steps = [
        (AddRequest("l1", p, lora=lora), None),
        (Lookup("l1"), None),
        (Allocate("l1", 12), {"block_ids": [[1, 2, 3]]}),
        (AddRequest("plain", p), None),
        (Lookup("plain"), {"hit_tokens": 0}),  # the LoRA is in every block's keys
        (AddRequest("l2", p, lora=lora), None),
        (Lookup("l2"), {"hit_tokens": 8, "block_ids": [[1, 2]]}),
        (AddRequest("m1", p, mm=img), None),
        (Lookup("m1"), None),
        (Allocate("m1", 12), {"block_ids": [[4, 5, 6]]}),
        # A different image at the same place: the first block still hits.
        (AddRequest("m2", p, mm=(MMFeature("img-b", 5, 2),)), None),
        (Lookup("m2"), {"hit_tokens": 4, "block_ids": [[4]]}),
        # The same image one token later: offsets differ, and so do the hashes
        # in 0.32 (tagged keys carry the offset).
        (AddRequest("m3", p, mm=(MMFeature("img-a", 6, 2),)), None),
        (Lookup("m3"), {"hit_tokens": 4}),
        (AddRequest("e1", p, prompt_embeds=PromptEmbeds(dim=2, seed=5)), None),
        (Lookup("e1"), {"hit_tokens": 0}),
        (Allocate("e1", 12), {"block_ids": [[7, 8, 9]]}),
        (AddRequest("e2", p, prompt_embeds=PromptEmbeds(dim=2, seed=5)), None),
        (Lookup("e2"), {"hit_tokens": 8}),
        (AddRequest("e3", p, prompt_embeds=PromptEmbeds(dim=2, seed=6)), None),
        (Lookup("e3"), {"hit_tokens": 0}),
        (Checkpoint(("events",)), None),
    ]
    return Scenario("extra-keys", _cfg(12), steps)


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "documented-example": documented_example,
    "eviction-under-pressure": eviction_under_pressure,
    "reset-refused-while-held": reset_refused_while_held,
    "lookahead-tokens": lookahead_tokens,
    "allocation-refused-when-full": allocation_refused_when_full,
    "exact-block-multiple": exact_block_multiple,
    "salted-requests": salted_requests,
    "hash-sha256_cbor": lambda: hash_algorithm("sha256_cbor"),
    "hash-xxhash": lambda: hash_algorithm("xxhash"),
    "hash-sha256": lambda: hash_algorithm("sha256"),
    "hash-xxhash_cbor": lambda: hash_algorithm("xxhash_cbor"),
    "evict-given-blocks": evict_given_blocks,
    "extra-keys": extra_keys,
}
