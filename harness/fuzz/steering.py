"""The gate's fuzz budget steered by what each kind config still reaches in
vLLM's KV core (specs/FUZZING.md, "The gate's fuzz").

Half the budget explores: the even split of harness/fuzz/slices.py (every
kind config with two seeds) at half the time, each slice's branch coverage
measured (harness/fuzz/core_coverage.py). The other half is one slot for every
two kind configs, handed out by weight: a kind config weighs one plus the
code paths (coverage arcs) of vLLM's KV core that one of its two seeds took
and the other did not. Two seeds that agree mean the kind is saturated at
this budget; where they disagree, more seeds still find new paths, and new
paths are where the unfound bugs are.

The steered slots are the gate's last items, so by the time one runs every
exploring slice has ended; each computes the same allocation from the same
files. Without coverage data (vLLM not importable, coverage off) a slot runs
the kinds in turn with a third seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.fuzz.core_coverage import arcs_of, is_done
from harness.fuzz.slices import SEEDS_PER_KIND, fuzz_slices

EXPLORE_SHARE = 0.5
# How long a steered slot waits for the exploring slices before it gives up
# steering (an exploring slice that died): it then runs its unsteered pair.
WAIT_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class Plan:
    """The exploring slices (kind, seed, seconds), and the steered slots:
    how many and the seconds each."""

    explore: tuple[tuple[str, int, float], ...]
    slots: int
    slot_seconds: float
    seed: int

    def kinds(self) -> list[str]:
        return sorted({kind for kind, _, _ in self.explore})

    def first_free_seed(self) -> int:
        return self.seed + SEEDS_PER_KIND

    def unsteered(self, slot: int) -> tuple[str, int]:
        kinds = self.kinds()
        return kinds[slot % len(kinds)], self.first_free_seed() + slot // len(kinds)


def slice_name(kind: str, seed: int) -> str:
    return f"fuzz[{kind},seed={seed}]"


def plan(seconds: float, seed: int, profile=None) -> Plan:
    explore = fuzz_slices(seconds * EXPLORE_SHARE, seed, profile)
    slots = max(1, len({kind for kind, _, _ in explore}) // 2)
    return Plan(tuple(explore), slots, seconds * (1 - EXPLORE_SHARE) / slots, seed)


def kind_weights(arcs: dict[str, list[frozenset]]) -> dict[str, int]:
    """One plus the arcs one of a kind's seeds took and another did not."""
    weights = {}
    for kind, per_seed in arcs.items():
        weights[kind] = 1 + len(frozenset().union(*per_seed)
                                - frozenset.intersection(*per_seed))
    return weights


def allocate(weights: dict[str, int], slots: int) -> list[str]:
    """`slots` slots over the kinds in proportion to their weights (largest
    remainder; ties by name, so every worker computes the same list), each
    kind's slots together, kinds in name order."""
    total = sum(weights.values())
    if slots <= 0 or total <= 0:
        return []
    quota = {k: slots * w / total for k, w in weights.items()}
    counts = {k: int(q) for k, q in quota.items()}
    left = slots - sum(counts.values())
    for k in sorted(quota, key=lambda k: (counts[k] - quota[k], k))[:left]:
        counts[k] += 1
    return [k for k in sorted(counts) for _ in range(counts[k])]


@dataclass(frozen=True, slots=True)
class Steered:
    """What one steered slot runs, and why."""

    kind: str
    seed: int
    seconds: float
    # The kind's weight and slot count, or why it was not steered.
    why: str


def steered_slot(p: Plan, slot: int, data_dir: str | None,
                 wait_seconds: float = WAIT_SECONDS, poll: float = 0.2) -> Steered:
    """Slot `slot`'s kind config and seed, once every exploring slice is done."""
    even = p.unsteered(slot)
    if data_dir is None:
        return Steered(*even, p.slot_seconds, "not steered: coverage not measured")
    names = [(kind, slice_name(kind, seed)) for kind, seed, _ in p.explore]
    deadline = time.monotonic() + wait_seconds
    while not all(is_done(data_dir, n) for _, n in names):
        if time.monotonic() > deadline:
            return Steered(*even, p.slot_seconds, "not steered: an exploring slice never ended")
        time.sleep(poll)
    arcs: dict[str, list[frozenset]] = {}
    for kind, n in names:
        arcs.setdefault(kind, []).append(arcs_of(data_dir, n))
    if not any(a for per_seed in arcs.values() for a in per_seed):
        return Steered(*even, p.slot_seconds, "not steered: no coverage data")
    weights = kind_weights(arcs)
    kinds = allocate(weights, p.slots)
    kind = kinds[slot]
    nth = kinds[:slot].count(kind)
    return Steered(kind, p.first_free_seed() + nth, p.slot_seconds,
                   f"steered: weight {weights[kind]}, {kinds.count(kind)} of {p.slots} slots")
