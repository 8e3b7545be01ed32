"""Shrinking a failing fuzz case to a small one that still fails the same way.

Greedy passes, repeated until none helps: drop whole requests, drop runs of
actions (halving chunk sizes, as delta debugging does), shorten prompts and
sampled token lists, simplify scheduling arguments, drop evicted ids, shrink the
pool and the block size. Every candidate is a valid program because the driver
skips actions that no longer apply. Deterministic: same input, same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from harness.core.cache_config import CacheConfig
from harness.fuzz.actions import Action, Evict, New, Sample, Schedule, items_inside

Predicate = Callable[[CacheConfig, list[Action]], bool]

_SIMPLE_SCHEDULE = dict(lookahead=0, external=0, delay_cache=False,
                        full_sequence_must_fit=False, reserved_blocks=0, max_hit=None)


# Candidates tried at most (each one case run on every backend).
MAX_CHECKS = 3000


def shrink(config: CacheConfig, actions: list[Action], fails: Predicate,
           max_checks: int = MAX_CHECKS) -> tuple[CacheConfig, list[Action]]:
    checks = 0
    actions = list(actions)

    def ok(c: CacheConfig, a: list[Action]) -> bool:
        nonlocal checks
        checks += 1
        return fails(c, a)

    progress = True
    while progress and checks < max_checks:
        progress = False
        # 1. Whole requests.
        for req in sorted({a.req for a in actions if isinstance(a, New)}, reverse=True):
            cand = [a for a in actions if getattr(a, "req", None) != req]
            if cand != actions and ok(config, cand):
                actions, progress = cand, True
        # 2. Runs of actions, long runs first.
        chunk = max(1, len(actions) // 2)
        while chunk >= 1:
            i = 0
            while i < len(actions):
                cand = actions[:i] + actions[i + chunk:]
                if cand and ok(config, cand):
                    actions, progress = cand, True
                else:
                    i += chunk
            chunk //= 2
        # 3. Simpler actions.
        for i, a in enumerate(actions):
            for simpler in _simpler(a):
                cand = actions[:i] + [simpler] + actions[i + 1:]
                if ok(config, cand):
                    actions[i] = a = simpler
                    progress = True
        # 4. A smaller config.
        for smaller in _smaller_configs(config):
            if ok(smaller, actions):
                config, progress = smaller, True
                break
    return config, actions


def _simpler(a: Action) -> list[Action]:
    out: list[Action] = []
    if isinstance(a, New):
        p = a.prompt
        for cut in (len(p) // 2, len(p) - 1):
            if 1 <= cut < len(p):
                out.append(replace(a, prompt=p[:cut], mm=items_inside(a.mm, cut)))
        if a.cache_salt is not None or a.lora is not None:
            out.append(replace(a, cache_salt=None, lora=None))
        if a.mm or a.embeds_seed is not None:
            out.append(replace(a, mm=(), embeds_seed=None))
        if any(t != 0 for t in p):
            out.append(replace(a, prompt=tuple(0 for _ in p)))
    elif isinstance(a, Schedule):
        if any(getattr(a, k) != v for k, v in _SIMPLE_SCHEDULE.items()):
            out.append(replace(a, **_SIMPLE_SCHEDULE))
        for k, v in _SIMPLE_SCHEDULE.items():
            if getattr(a, k) != v:
                out.append(replace(a, **{k: v}))
        if a.num_new_tokens != 1 << 12:
            out.append(replace(a, num_new_tokens=1 << 12))
    elif isinstance(a, Sample) and len(a.tokens) > 1:
        out.append(replace(a, tokens=a.tokens[:1]))
    elif isinstance(a, Evict) and len(a.block_ids) > 1:
        out.extend(replace(a, block_ids=(b,)) for b in a.block_ids)
    return out


def _smaller_configs(c: CacheConfig) -> list[CacheConfig]:
    out = []
    for n in sorted({c.num_blocks // 2, c.num_blocks - 1}, reverse=True):
        if n >= 2 and n != c.num_blocks:
            out.append(replace(c, num_blocks=n))
    if all(g.block_size > 1 and g.block_size % 2 == 0 for g in c.groups):
        # Every group's blocks halved together keeps their ratios (a sink's
        # length stays a multiple of its block).
        pmu = c.prefix_match_unit
        if pmu is None or pmu % 2 == 0:
            halved = _try(lambda: replace(
                c, groups=tuple(replace(g, block_size=g.block_size // 2) for g in c.groups),
                prefix_match_unit=None if pmu is None else pmu // 2))
            if halved is not None:
                out.append(halved)
    for i in range(len(c.groups)):
        # Drop a group, unless it leaves none or a lone cross-attention group.
        rest = c.groups[:i] + c.groups[i + 1:]
        if rest and any(g.kind != "cross_attention" for g in rest):
            smaller = _try(lambda rest=rest: replace(c, groups=rest, prefix_match_unit=None))
            if smaller is not None:
                out.append(smaller)
    if c.hash_algo != "sha256":
        out.append(replace(c, hash_algo="sha256"))
    if c.num_hash_lookahead_tokens:
        out.append(replace(c, num_hash_lookahead_tokens=0))
    return out


def _try(make):
    """A candidate config, or None where it is not one vLLM accepts."""
    try:
        config = make()
        config.block_sizes()
        return config
    except (ValueError, AssertionError):
        return None
