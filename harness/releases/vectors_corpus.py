"""The inputs of the golden vectors (specs/VECTORS.md): which token sequences
and extra keys are hashed, and which small traces' KV events are published.

The same inputs go through every release, so two releases' files compare case
by case (`kvconform vectors diff`). Only the inputs live here; the answers come
from each release's own code (vectors_produce.py), and the checker reads the
inputs back from the files, not from this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import (
    AddRequest,
    Allocate,
    AppendTokens,
    Event,
    Free,
    Lookup,
    PromptEmbeds,
    ResetPrefixCache,
)
from impl.request import LoRA, MMFeature

# Hash block size of the corpus: small, so a case spans several blocks in a
# few tokens (the value only groups tokens; vLLM's default, 16, hashes the same way).
BLOCK_SIZE = 4
# PYTHONHASHSEED of the "seeded" NONE_HASH.
SEED = "0"
# The seed 0.29+ derives NONE_HASH from for sha256 / sha256_cbor without
# PYTHONHASHSEED: the "fixed" mode applies it to every release.
FIXED_SEED = "vllm-none-hash"
ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
# How NONE_HASH is derived, in the order files list them.
NONE_HASH_MODES = ("seeded", "unseeded", "fixed")
TOPIC = "kv-events"

# Token ids of every width the serialisers encode differently (pickle: 1, 2,
# 4 byte ints; CBOR: immediate, 1, 2, 4 byte heads).
_TOKENS = (0, 1, 23, 24, 255, 256, 1000, 65535, 65536, 151643, 7, 8, 9, 10, 11, 12, 13,
           2_147_483_647, 42, 43)
SEQUENCES: dict[str, tuple[int, ...]] = {
    "empty": (),
    "partial": _TOKENS[:3],
    "one-block": _TOKENS[:4],
    "one-block-and-partial": _TOKENS[:6],
    "three-blocks": _TOKENS[:12],
    "four-blocks-and-partial": _TOKENS[:18],
}
# The sequence the extra keys are tried on: several blocks and a partial one.
KEYED_SEQUENCE = "four-blocks-and-partial"


@dataclass(frozen=True, slots=True)
class Keys:
    """The extra keys of one hash case (all optional)."""

    lora: LoRA | None = None
    cache_salt: str | None = None
    # Items inside a block, one ending exactly at a block boundary (12) and one
    # spanning two blocks.
    mm: tuple[MMFeature, ...] = ()
    prompt_embeds: PromptEmbeds | None = None
    lookahead: int = 0


_LORA = LoRA("adapter-a", 7, "/loras/adapter-a")
_MM = (MMFeature("img-0", 2, 3), MMFeature("img-1", 8, 4), MMFeature("img-2", 14, 3))
KEY_SETS: dict[str, Keys] = {
    "lora": Keys(lora=_LORA),
    "cache_salt": Keys(cache_salt="salt-1"),
    "mm": Keys(mm=_MM),
    "prompt_embeds": Keys(prompt_embeds=PromptEmbeds(dim=2, seed=5)),
    "lora+mm+cache_salt": Keys(lora=_LORA, cache_salt="salt-1", mm=_MM),
    # 0.33's num_hash_lookahead_tokens (releases whose hasher takes it).
    "lookahead": Keys(lookahead=2),
}


@dataclass(frozen=True, slots=True)
class HashCase:
    algorithm: str
    none_hash: str  # a NONE_HASH_MODES entry
    sequence: str
    keys: str | None  # a KEY_SETS name

    @property
    def id(self) -> str:
        return f"{self.algorithm}/{self.none_hash}/{self.sequence}" + (
            f"+{self.keys}" if self.keys else "")


def hash_cases() -> list[HashCase]:
    """Every sequence and every key set under the seeded NONE_HASH; the plain
    and the fully keyed sequence under the others."""
    out = []
    for algo in ALGORITHMS:
        out += [HashCase(algo, "seeded", s, None) for s in SEQUENCES]
        out += [HashCase(algo, "seeded", KEYED_SEQUENCE, k) for k in KEY_SETS]
        for mode in NONE_HASH_MODES[1:]:
            out += [HashCase(algo, mode, KEYED_SEQUENCE, None),
                    HashCase(algo, mode, KEYED_SEQUENCE, "lora+mm+cache_salt")]
    return out


def seed_of(mode: str) -> str | None:
    """PYTHONHASHSEED for a NONE_HASH mode (None: unset)."""
    return {"seeded": SEED, "unseeded": None, "fixed": FIXED_SEED}[mode]


def hash_request(case: HashCase) -> AddRequest:
    tokens = list(SEQUENCES[case.sequence])
    keys = KEY_SETS[case.keys] if case.keys else Keys()
    if keys.prompt_embeds is not None:
        tokens = [0] * len(tokens)  # vLLM hashes zeros for embedded prompts
    return AddRequest(req="r", prompt=tokens, lora=keys.lora, cache_salt=keys.cache_salt,
                      mm=keys.mm, prompt_embeds=keys.prompt_embeds)


def hash_config(case: HashCase) -> CacheConfig:
    keys = KEY_SETS[case.keys] if case.keys else Keys()
    return CacheConfig(num_blocks=16, groups=(GroupConfig(BLOCK_SIZE),),
                       hash_algo=case.algorithm, hash_seed=seed_of(case.none_hash),
                       num_hash_lookahead_tokens=keys.lookahead)


# -- KV event traces ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventTrace:
    """A few scheduler steps; the events each step queues are one batch."""

    name: str
    what: str
    cache: CacheConfig
    steps: tuple[tuple[Event, ...], ...]


def _prompt(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _cache(as_int: bool, num_blocks: int = 16, **fields) -> CacheConfig:
    fields.setdefault("groups", (GroupConfig(BLOCK_SIZE),))
    return CacheConfig(num_blocks=num_blocks, events_use_int_hashes=as_int, **fields)


def _store_remove_clear(as_int: bool) -> EventTrace:
    # 4 usable blocks (and the null block): b's prompt evicts a's blocks.
    cache = _cache(as_int, num_blocks=5)
    a, b = _prompt(100, 10), _prompt(500, 16)
    return EventTrace(
        "store-remove-clear",
        "stores with parent hashes, a decode block, eviction (BlockRemoved), reset "
        "(AllBlocksCleared)",
        cache,
        (
            (AddRequest("a", a), Lookup("a"), Allocate("a", 10)),
            (AppendTokens("a", [110, 111]), Allocate("a", 2)),
            (Free("a"), AddRequest("b", b), Lookup("b"), Allocate("b", 16)),
            (Free("b"), ResetPrefixCache()),
        ),
    )


def _extra_keys(as_int: bool) -> EventTrace:
    cache = _cache(as_int)
    p = _prompt(200, 16)
    return EventTrace(
        "extra-keys",
        "LoRA (lora_id, lora_name), multimodal items and cache salt in extra_keys "
        "(an item ending where the second store starts), then the same prompt without them",
        cache,
        (
            (AddRequest("k", p, lora=_LORA, cache_salt="salt-1", mm=_MM[:2]),
             Lookup("k"), Allocate("k", 12)),
            (Allocate("k", 4),),
            (AddRequest("plain", p), Lookup("plain"), Allocate("plain", 16)),
        ),
    )


def _prompt_embeds(as_int: bool) -> EventTrace:
    cache = _cache(as_int)
    return EventTrace(
        "prompt-embeds",
        "prompt-embedding digests (bytes) in extra_keys",
        cache,
        ((AddRequest("e", [0] * 8, prompt_embeds=PromptEmbeds(dim=2, seed=5)),
          Lookup("e"), Allocate("e", 8)),),
    )


def _groups(as_int: bool) -> EventTrace:
    cache = _cache(as_int, groups=(GroupConfig(BLOCK_SIZE),
                                   GroupConfig(BLOCK_SIZE, "sliding_window", sliding_window=4)))
    p = _prompt(300, 12)
    return EventTrace(
        "groups",
        "a full-attention and a sliding-window group: group_idx and the group's "
        "spec kind and window",
        cache,
        (
            (AddRequest("g", p), Lookup("g"), Allocate("g", 12)),
            (Free("g"), ResetPrefixCache()),
        ),
    )


def _session(as_int: bool) -> EventTrace:
    cache = _cache(as_int)
    return EventTrace(
        "session",
        "a request's session_id (releases whose requests take one)",
        cache,
        ((AddRequest("s", _prompt(400, 8), session_id="sess-1"), Lookup("s"),
          Allocate("s", 8)),),
    )


def _lookahead(as_int: bool) -> EventTrace:
    cache = _cache(as_int, num_hash_lookahead_tokens=2)
    return EventTrace(
        "lookahead",
        "lookahead hashing: lookahead_token_ids (releases whose manager takes "
        "num_hash_lookahead_tokens)",
        cache,
        ((AddRequest("h", _prompt(600, 11)), Lookup("h"), Allocate("h", 11)),),
    )


_TRACES = (_store_remove_clear, _extra_keys, _prompt_embeds, _groups, _session, _lookahead)


def event_traces() -> list[tuple[EventTrace, bool]]:
    """Every trace with int hashes (vLLM's default) and with byte hashes."""
    return [(make(as_int), as_int) for as_int in (True, False) for make in _TRACES]
