"""The fast seeded generator: a cache config and an action program per case.

Aimed at the corners: prompts cut from a few shared documents over a tiny token
alphabet (prefix hits, partial-block hits, identical blocks, long hash chains),
lengths at and around block multiples, growth by one token and by many,
lookahead, connector tokens (sync and async with delayed caching), finish in
any order, preemption, reset and eviction mid-run, salts and LoRA, pools from a
handful of blocks (always nearly full) to thousands.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.actions import (
    Ack,
    Action,
    Evict,
    Finish,
    FinishLoad,
    New,
    Observe,
    Preempt,
    Reset,
    Sample,
    Schedule,
    StepBoundary,
)
from harness.fuzz.configs import TEMPLATES, draw_cache_config
from impl.block_hash import HASH_FUNCTIONS

# Templates whose finishing requests may be KV producers (Mamba prompt tails).
FINALIZING = ("mamba_speculative", "mamba_checkpoints", "retention")


@dataclass(frozen=True, slots=True)
class FuzzConfig:
    """What cases are drawn from (`kvconform fuzz --config FILE`, YAML)."""

    block_sizes: tuple[int, ...] = (1, 2, 4, 16)
    # Mostly small pools (always nearly full), sometimes large ones.
    pool_sizes: tuple[int, ...] = (3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 128, 1024)
    hash_algos: tuple[str, ...] = tuple(HASH_FUNCTIONS)
    p_caching: float = 0.85
    vocab: int = 4
    documents: int = 3
    max_prompt_blocks: int = 6
    p_salt: float = 0.1
    p_lora: float = 0.1
    # Requests asking for full KV reports (hits re-announced as events); 0
    # draws nothing, so seeded programs of configs without it stay as they were.
    p_full_report: float = 0.0
    # Attention kinds / hybrids a case is drawn from (harness/fuzz/configs.py).
    kinds: tuple[str, ...] = ("full_attention",)
    weights: dict = field(default_factory=lambda: {
        "new": 14, "schedule": 30, "sample": 22, "finish": 8, "preempt": 4,
        "finish_load": 3, "reset": 1, "evict": 2, "step": 3, "observe": 6,
        # HiSparse's workers reporting (a HiSparse kind config weights it).
        "ack": 0,
    })

    @classmethod
    def from_dict(cls, d: dict) -> FuzzConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown fuzz config key(s): {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        if isinstance(kwargs.get("kinds"), str):
            kwargs["kinds"] = (kwargs["kinds"],)
        defaults = cls()
        for k, v in kwargs.items():
            _check_type(k, v, getattr(defaults, k))
        if "weights" in kwargs:
            kwargs["weights"] = {**cls().weights, **d["weights"]}
        unknown_kinds = [k for k in kwargs.get("kinds", ()) if k not in TEMPLATES]
        if unknown_kinds:
            raise ValueError(f"unknown fuzz kind(s): {', '.join(unknown_kinds)} "
                             f"(known: {', '.join(TEMPLATES)})")
        return cls(**kwargs)


def _check_type(key: str, value, default) -> None:
    """A config value of the default's type (ValueError naming the key): a
    string where numbers belong would fail deep inside a campaign."""
    def ok(v, like) -> bool:
        if isinstance(like, bool) or isinstance(v, bool):
            return type(v) is type(like)
        if isinstance(like, float):  # probabilities
            return isinstance(v, (int, float)) and 0 <= v <= 1
        if isinstance(like, int):  # sizes and counts
            return isinstance(v, int) and v >= 1
        return isinstance(v, type(like))

    if isinstance(default, tuple):
        if not isinstance(value, tuple) or not value or not all(ok(v, default[0])
                                                               for v in value):
            raise ValueError(f"{key}: a non-empty list, each {_what(default[0])}, not "
                             f"{value!r}")
    elif isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(v, int) and not isinstance(
                v, bool) and v >= 0 for v in value.values()):
            raise ValueError(f"{key}: a mapping to non-negative integers, not {value!r}")
    elif not ok(value, default):
        raise ValueError(f"{key}: {_what(default)}, not {value!r}")


def _what(like) -> str:
    if isinstance(like, float):
        return "a probability in [0, 1]"
    if isinstance(like, int) and not isinstance(like, bool):
        return "a positive integer"
    return f"a {type(like).__name__}"


# Knobs only some releases have (profile.hash_lookahead_tokens,
# profile.max_cache_hit_length): drawn for every case from a generator of
# their own, so that the rest of a case's program is the same for every
# release; the driver uses them where the profile has them.
P_HASH_LOOKAHEAD = 0.15
P_MAX_HIT = 0.15
# Lookahead hashing leaves a request's last blocks unhashed; vLLM 0.33's
# lookups that scan from the right (sliding window, chunked local, Mamba) then
# index past the hashes (IndexError), so only prefix-scan kinds get it.
_PREFIX_SCAN_KINDS = ("full_attention", "mla_attention", "sink_full_attention")


def draw_case(rng: random.Random, fc: FuzzConfig, max_ops: int,
              lookahead_hashing: bool = False) -> tuple[CacheConfig, list[Action]]:
    """A case's config and program. `lookahead_hashing`: the release hashes
    lookahead tokens, so some non-hybrid cases turn it on."""
    knobs = random.Random(str(rng.getstate()[1][:8]))
    bs = rng.choice(fc.block_sizes)
    num_blocks = rng.choice(fc.pool_sizes)
    hash_algo = rng.choice(fc.hash_algos)
    hash_seed = str(rng.randrange(1000))
    caching = rng.random() < fc.p_caching
    if fc.kinds == ("full_attention",):
        template = "full_attention"
        config = CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(bs),),
                             hash_algo=hash_algo, hash_seed=hash_seed,
                             enable_caching=caching, max_model_len=1 << 14)
    else:
        template = rng.choice(fc.kinds)
        config = draw_cache_config(template, rng, bs, num_blocks, hash_algo,
                                   hash_seed, caching, 1 << 14)
    ahead = knobs.choice((1, 2)) if knobs.random() < P_HASH_LOOKAHEAD else 0
    if ahead and lookahead_hashing and config.groups[0].kind in _PREFIX_SCAN_KINDS and (
            len(config.groups) == 1):
        config = replace(config, num_hash_lookahead_tokens=ahead)
    # Finishing requests hand a connector their Mamba prompt tails (the
    # templates made for it only: others keep their programs).
    finalizing = template in FINALIZING
    kinds = {g.kind for g in config.groups}
    # Encoder-decoder models and Mamba state take no connector (external) KV.
    no_external = bool(kinds & {"cross_attention", "mamba"})
    encoder = "cross_attention" in kinds
    hisparse = config.hisparse

    def finish_load(req: int) -> FinishLoad:
        # HiSparse imports may fail (then nothing they wrote is readable).
        return FinishLoad(req, failed=hisparse and rng.random() < 0.2)

    docs = [[rng.randrange(fc.vocab) for _ in range(fc.max_prompt_blocks * bs + bs)]
            for _ in range(fc.documents)]
    kinds = list(fc.weights)
    weights = [fc.weights[k] for k in kinds]
    actions: list[Action] = []
    created: list[int] = []

    def some_req() -> int:
        # Mostly recent requests: they are the ones still alive.
        return created[-1 - min(int(rng.expovariate(0.5)), len(created) - 1)]

    for _ in range(rng.randint(1, max_ops)):
        kind = rng.choices(kinds, weights)[0] if created else "new"
        if kind == "new":
            n_blocks = rng.randint(0, fc.max_prompt_blocks)
            cut = max(1, n_blocks * bs + rng.choice((0, 0, 0, 1, -1)))
            prompt = docs[rng.randrange(len(docs))][:cut] + [
                rng.randrange(fc.vocab) for _ in range(rng.choice((0, 0, 1, bs, 2 * bs)))]
            created.append(len(created))
            actions.append(New(
                created[-1], tuple(prompt or [0]),
                cache_salt=rng.choice(("a", "b")) if rng.random() < fc.p_salt else None,
                lora=rng.randint(1, 2) if rng.random() < fc.p_lora else None,
                encoder_tokens=rng.choice((1, bs, 3 * bs + 1, 50)) if encoder else 0,
                full_report=fc.p_full_report > 0 and rng.random() < fc.p_full_report,
            ))
        elif kind == "schedule":
            ext = 0 if no_external else rng.choice((0, 0, 0, bs, 2 * bs + 1))
            req = some_req()
            actions.append(Schedule(
                req,
                rng.choice((1, bs, 3 * bs, 1 << 12, 1 << 12)),
                lookahead=rng.choice((0, 0, 0, 1, bs + 1)),
                external=ext,
                delay_cache=ext > 0 and rng.random() < 0.4,
                full_sequence_must_fit=rng.random() < 0.1,
                reserved_blocks=rng.choice((0,) * 9 + (1,)),
                max_hit=knobs.random() if knobs.random() < P_MAX_HIT else None,
            ))
            # As a scheduler step would: often the model's tokens come right
            # back, or the KV load finishes.
            follow = rng.random()
            if follow < 0.5:
                n = rng.choice((1, 1, 1, 2, bs))
                actions.append(Sample(req, tuple(rng.randrange(fc.vocab) for _ in range(n))))
            elif follow < 0.6:
                actions.append(finish_load(req))
        elif kind == "sample":
            n = rng.choice((1, 1, 1, 2, bs, 3))
            actions.append(Sample(some_req(), tuple(rng.randrange(fc.vocab) for _ in range(n))))
        elif kind == "finish":
            actions.append(Finish(some_req(), finalize=finalizing and rng.random() < 0.5))
        elif kind == "preempt":
            actions.append(Preempt(some_req()))
        elif kind == "finish_load":
            actions.append(finish_load(some_req()))
        elif kind == "ack":
            actions.append(Ack(rng.choice((1, 1, 2, 4, 1 << 10)), workers=rng.choice((1, 1, 2)),
                               split=rng.random() < 0.2))
        elif kind == "reset":
            actions.append(Reset())
        elif kind == "evict":
            k = rng.randint(1, 3)
            actions.append(Evict(tuple(rng.randrange(config.num_blocks) for _ in range(k))))
        elif kind == "step":
            actions.append(StepBoundary())
        else:
            actions.append(Observe())
    actions.append(Observe())
    return config, actions
