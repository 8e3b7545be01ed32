"""The fast seeded generator: a cache config and an action program per case.

Aimed at the corners: prompts cut from a few shared documents over a tiny token
alphabet (prefix hits, partial-block hits, identical blocks, long hash chains),
lengths at and around block multiples, growth by one token and by many,
lookahead, connector tokens (sync and async with delayed caching), finish in
any order, preemption, reset and eviction mid-run, salts and LoRA, pools from a
handful of blocks (always nearly full) to thousands.

Bursts bias a program toward one scheduler step in which several requests
meet on the same blocks: admitted together from one document's prefix, cut
around the same block boundary (shared full blocks, partial tails, hits that
end inside a block, so copy-on-write where the config has it), one of them
perhaps preempted before the step ends.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.kinds import kind_row
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
    items_inside,
)
from harness.fuzz.configs import draw_cache_config, templates
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
    # Requests with multimodal items (a document's own layout of items,
    # mostly, so that requests sharing a prefix share its items and hit),
    # and requests with prompt embeddings; 0 as above.
    p_mm: float = 0.0
    p_prompt_embeds: float = 0.0
    # Attention kinds / hybrids a case is drawn from (harness/fuzz/configs.py).
    kinds: tuple[str, ...] = ("full_attention",)
    weights: dict = field(default_factory=lambda: {
        "new": 14, "schedule": 30, "sample": 22, "finish": 8, "preempt": 4,
        "finish_load": 3, "reset": 1, "evict": 2, "step": 3, "observe": 6,
        # Several requests meeting on the same blocks within one step.
        "burst": 3,
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
        known_kinds = templates()
        unknown_kinds = [k for k in kwargs.get("kinds", ()) if k not in known_kinds]
        if unknown_kinds:
            raise ValueError(f"unknown fuzz kind(s): {', '.join(unknown_kinds)} "
                             f"(known: {', '.join(known_kinds)})")
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
# index past the hashes (IndexError), so only prefix-scan kinds
# (KindRow.prefix_scan) get it.


def draw_case(rng: random.Random, fc: FuzzConfig, max_ops: int,
              lookahead_hashing: bool = False) -> tuple[CacheConfig, list[Action]]:
    """A case's config and program. `lookahead_hashing`: the release hashes
    lookahead tokens, so some non-hybrid cases turn it on."""
    knobs = random.Random(str(rng.getstate()[1][:8]))
    bs, template, config = _draw_config(rng, fc)
    ahead = knobs.choice((1, 2)) if knobs.random() < P_HASH_LOOKAHEAD else 0
    if ahead and lookahead_hashing and len(config.groups) == 1 and (
            kind_row(config.groups[0].kind).prefix_scan):
        config = replace(config, num_hash_lookahead_tokens=ahead)
    program = _Program(rng, knobs, fc, config, template, bs)
    return config, program.draw(max_ops)


def _draw_config(rng: random.Random, fc: FuzzConfig) -> tuple[int, str, CacheConfig]:
    """The case's block size (the template's: groups may differ), template
    and cache config."""
    bs = rng.choice(fc.block_sizes)
    num_blocks = rng.choice(fc.pool_sizes)
    hash_algo = rng.choice(fc.hash_algos)
    hash_seed = str(rng.randrange(1000))
    caching = rng.random() < fc.p_caching
    if fc.kinds == ("full_attention",):
        return bs, "full_attention", CacheConfig(
            num_blocks=num_blocks, groups=(GroupConfig(bs),), hash_algo=hash_algo,
            hash_seed=hash_seed, enable_caching=caching, max_model_len=1 << 14)
    template = rng.choice(fc.kinds)
    return bs, template, draw_cache_config(template, rng, bs, num_blocks, hash_algo,
                                       hash_seed, caching, 1 << 14)


def _items(rng: random.Random, length: int, bs: int) -> tuple[tuple[str, int, int], ...]:
    """Up to three multimodal items over `length` tokens, sorted and
    disjoint: identifiers from a small set (equal ones at equal places hit),
    spans inside a block, across a boundary, or whole blocks."""
    items, pos = [], rng.randrange(max(1, bs))
    for _ in range(rng.randint(1, 3)):
        span = rng.choice((1, 2, bs, bs + 1, 2 * bs))
        if pos + span > length:
            break
        items.append((f"img-{rng.randrange(3)}", pos, span))
        pos += span + rng.choice((0, 1, bs))
    return tuple(items)


# The ops a program draws, each by its `_Program._<op>` method.
_OPS = ("new", "schedule", "sample", "finish", "preempt", "finish_load", "ack", "reset",
        "evict", "step", "observe", "burst")


class _Program:
    """One case's action program, drawn op by op (`ops`: the fuzz config's
    action weights, not attention kinds)."""

    def __init__(self, rng: random.Random, knobs: random.Random, fc: FuzzConfig,
                 config: CacheConfig, template: str, bs: int) -> None:
        self.rng, self.knobs, self.fc, self.config, self.bs = rng, knobs, fc, config, bs
        rows = [kind_row(g.kind) for g in config.groups]
        # Finishing requests hand a connector their Mamba prompt tails (the
        # templates made for it only: others keep their programs).
        self.finalizing = template in FINALIZING
        self.no_external = not all(r.external_kv for r in rows)
        self.encoder = any(r.encoder for r in rows)
        self.hisparse = config.hisparse
        self.actions: list[Action] = []
        self.created: list[int] = []
        self.docs: list[list[int]] = []
        self.doc_items: list[tuple[tuple[str, int, int], ...]] = []

    def draw(self, max_ops: int) -> list[Action]:
        rng, fc = self.rng, self.fc
        self.docs = [[rng.randrange(fc.vocab) for _ in range(fc.max_prompt_blocks * self.bs
                                                             + self.bs)]
                     for _ in range(fc.documents)]
        if fc.p_mm > 0:  # drawn only then: other configs keep their programs
            self.doc_items = [_items(rng, len(d), self.bs) for d in self.docs]
        ops = list(fc.weights)
        weights = [fc.weights[k] for k in ops]
        for _ in range(rng.randint(1, max_ops)):
            op = rng.choices(ops, weights)[0] if self.created else "new"
            # An op with no drawer of its own observes, as "observe" does.
            (getattr(self, f"_{op}") if op in _OPS else self._observe)()
        self.actions.append(Observe())
        return self.actions

    def _some_req(self) -> int:
        # Mostly recent requests: they are the ones still alive.
        created = self.created
        return created[-1 - min(int(self.rng.expovariate(0.5)), len(created) - 1)]

    def _finish_load_of(self, req: int) -> FinishLoad:
        # HiSparse imports may fail (then nothing they wrote is readable).
        return FinishLoad(req, failed=self.hisparse and self.rng.random() < 0.2)

    def _new(self) -> None:
        rng, fc, bs = self.rng, self.fc, self.bs
        n_blocks = rng.randint(0, fc.max_prompt_blocks)
        cut = max(1, n_blocks * bs + rng.choice((0, 0, 0, 1, -1)))
        self._add_request(rng.randrange(len(self.docs)), cut)

    def _add_request(self, doc: int, cut: int) -> int:
        """A new request whose prompt starts with document `doc`'s first
        `cut` tokens; its number."""
        rng, fc, bs = self.rng, self.fc, self.bs
        prompt = self.docs[doc][:cut] + [
            rng.randrange(fc.vocab) for _ in range(rng.choice((0, 0, 1, bs, 2 * bs)))]
        mm: tuple[tuple[str, int, int], ...] = ()
        if fc.p_mm > 0 and rng.random() < fc.p_mm:
            layout = (self.doc_items[doc] if rng.random() < 0.8
                      else _items(rng, len(prompt), bs))
            mm = items_inside(layout, len(prompt))
        embeds = (rng.randrange(3) if fc.p_prompt_embeds > 0
                  and rng.random() < fc.p_prompt_embeds else None)
        self.created.append(len(self.created))
        self.actions.append(New(
            self.created[-1], tuple(prompt or [0]),
            cache_salt=rng.choice(("a", "b")) if rng.random() < fc.p_salt else None,
            lora=rng.randint(1, 2) if rng.random() < fc.p_lora else None,
            encoder_tokens=rng.choice((1, bs, 3 * bs + 1, 50)) if self.encoder else 0,
            full_report=fc.p_full_report > 0 and rng.random() < fc.p_full_report,
            mm=mm, embeds_seed=embeds,
        ))
        return self.created[-1]

    def _schedule(self) -> None:
        rng, bs, knobs = self.rng, self.bs, self.knobs
        ext = 0 if self.no_external else rng.choice((0, 0, 0, bs, 2 * bs + 1))
        req = self._some_req()
        self.actions.append(Schedule(
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
            self.actions.append(Sample(req, tuple(rng.randrange(self.fc.vocab)
                                                  for _ in range(n))))
        elif follow < 0.6:
            self.actions.append(self._finish_load_of(req))

    def _sample(self) -> None:
        rng = self.rng
        n = rng.choice((1, 1, 1, 2, self.bs, 3))
        self.actions.append(Sample(self._some_req(), tuple(rng.randrange(self.fc.vocab)
                                                           for _ in range(n))))

    def _finish(self) -> None:
        self.actions.append(Finish(self._some_req(),
                                   finalize=self.finalizing and self.rng.random() < 0.5))

    def _preempt(self) -> None:
        self.actions.append(Preempt(self._some_req()))

    def _finish_load(self) -> None:
        self.actions.append(self._finish_load_of(self._some_req()))

    def _ack(self) -> None:
        rng = self.rng
        self.actions.append(Ack(rng.choice((1, 1, 2, 4, 1 << 10)), workers=rng.choice((1, 1, 2)),
                                split=rng.random() < 0.2))

    def _reset(self) -> None:
        self.actions.append(Reset())

    def _evict(self) -> None:
        rng = self.rng
        k = rng.randint(1, 3)
        self.actions.append(Evict(tuple(rng.randrange(self.config.num_blocks)
                                        for _ in range(k))))

    def _step(self) -> None:
        self.actions.append(StepBoundary())

    def _observe(self) -> None:
        self.actions.append(Observe())

    def _burst(self) -> None:
        rng, bs = self.rng, self.bs
        doc = rng.randrange(len(self.docs))
        boundary = rng.randint(1, self.fc.max_prompt_blocks) * bs
        self.actions.append(StepBoundary())
        reqs = []
        for _ in range(rng.randint(2, 4)):
            # Around the same boundary: equal full blocks, one token short of
            # it or past it, or half a block in (a hit ending inside a block).
            cut = max(1, boundary + rng.choice((0, 0, -1, 1, bs // 2)))
            req = self._add_request(doc, cut)
            reqs.append(req)
            self.actions.append(Schedule(req, rng.choice((1 << 12, 1 << 12, bs, 1)),
                                         lookahead=rng.choice((0, 0, 1))))
        if rng.random() < 0.3:  # preempted before the step ends, then back
            victim = rng.choice(reqs)
            self.actions += [Preempt(victim), Schedule(victim, 1 << 12)]
        for req in reqs:
            if rng.random() < 0.5:
                self.actions.append(Sample(req, (rng.randrange(self.fc.vocab),)))
        self.actions.append(StepBoundary())
