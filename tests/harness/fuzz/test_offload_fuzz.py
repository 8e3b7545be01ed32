"""The offload tier's differential (harness/fuzz/offload_driver.py): impl's
CPU offload manager agrees with vLLM's over seeded programs, and a bug
planted in impl's LRU order or ARC's ghost lists is caught (negative
controls). Cost: about 2 s on one core (counts, not time, bound it)."""

from __future__ import annotations

import random

import vllm.v1.kv_offload.cpu.manager  # noqa: E402,F401  (fail loudly without vLLM)

from harness.backends.offload_base import OffloadConfig, key_of
from harness.backends.offload_impl import ImplOffloadBackend
from harness.fuzz import offload_driver
from harness.fuzz.offload_program import Model, draw_config, program
from impl.kv_offload.invariants import violations
from impl.kv_offload.policies.arc import ARCCachePolicy
from impl.kv_offload.policies.lru import LRUCachePolicy
from impl.profiles import get_profile

PROGRAMS = 40
PROFILE = get_profile("0.32")


def test_impl_agrees_with_vllm_over_seeded_programs():
    result = offload_driver.fuzz(seed=7, programs=PROGRAMS)
    assert [d.line() for d in result.divergences] == []
    assert result.ops > 5_000
    # The programs reach every operation of the protocol.
    assert set(result.by_op) >= {"new_request", "lookup", "prepare_load", "complete_load",
                                 "touch", "prepare_store", "complete_store", "finished",
                                 "schedule_end", "take_events", "stats", "reset"}


def test_programs_are_deterministic_by_seed():
    def ops(seed):
        rng = random.Random(seed)
        config = draw_config(rng)
        backend = ImplOffloadBackend(config, PROFILE)
        gen = program(rng, config, 200, Model())
        seen, answer = [], None
        try:
            op = next(gen)
            while True:
                seen.append(op)
                answer = backend.run(op)
                op = gen.send(answer)
        except StopIteration:
            return seen

    assert ops(3) == ops(3)
    assert ops(3) != ops(4)


def _first_divergence(programs=PROGRAMS):
    result = offload_driver.fuzz(seed=11, programs=programs)
    return result.divergences[0] if result.divergences else None


def test_negative_control_lru_order(monkeypatch):
    # The bug: touch re-ranks a prefix head first, so its tail outlives it.
    def touch_wrong_way(self, keys, req_context):
        self._renew(list(keys))

    monkeypatch.setattr(LRUCachePolicy, "touch", touch_wrong_way)
    div = _first_divergence()
    assert div is not None and div.config.cache_policy == "lru"


def test_negative_control_arc_ghosts(monkeypatch):
    # The bug: a ghost hit leaves the ghost where it is in its list.
    def ghost_hit_without_move(self, key):
        if key in self.b1:
            self.target_t1_size = min(self.target_t1_size + max(1, len(self.b2) / len(self.b1)),
                                      self.cache_capacity)
        elif key in self.b2:
            self.target_t1_size = max(self.target_t1_size - max(1, len(self.b1) / len(self.b2)), 0)

    monkeypatch.setattr(ARCCachePolicy, "_ghost_hit", ghost_hit_without_move)
    div = _first_divergence(programs=200)
    assert div is not None and div.config.cache_policy == "arc"


def test_negative_control_arc_ghost_adaptation(monkeypatch):
    # The bug: a B2 hit moves the target towards T1, like a B1 hit.
    real = ARCCachePolicy._ghost_hit

    def b2_hit_grows_t1(self, key):
        if key in self.b2:
            self.b1[key] = None
            del self.b2[key]
        real(self, key)

    monkeypatch.setattr(ARCCachePolicy, "_ghost_hit", b2_hit_grows_t1)
    div = _first_divergence()
    assert div is not None and div.config.cache_policy == "arc"


def test_invariants_catch_a_lost_slot_and_a_pinned_eviction():
    backend = ImplOffloadBackend(OffloadConfig(num_chunks=2), PROFILE)
    k1, k2, k3 = (key_of(h, 0) for h in (1, 2, 3))
    assert backend.run(("prepare_store", "a", [k1, k2]))["chunk_ids"] == [0, 1]
    backend.run(("complete_store", "a", [k1, k2], True))
    assert violations(backend.manager) == []
    backend.manager.free_slots.append(1)  # the planted bug: a held chunk's slot freed
    assert "a held chunk's slot is on the free list" in violations(backend.manager)
    backend.manager.free_slots.pop()
    # The scheduler's model pins k1; a manager that evicted it must be caught.
    model = Model(loads=[("b", [k1])])
    backend.run(("prepare_load", "b", [k1]))
    backend.manager.policy.held[k1].ref_cnt = 0  # the planted bug: a lost pin
    found = offload_driver._model_violations(backend, model, ("lookup", "b", k3), None)
    assert any("pinned 1x" in line for line in found)


def test_negative_control_arc_forgets_its_ghosts(monkeypatch):
    # The bug: evicted keys are not remembered in B1/B2.
    real = ARCCachePolicy.evict

    def evict_without_ghosts(self, n, protected):
        victims = real(self, n, protected)
        for key, _ in victims or ():
            self.b1.pop(key, None)
            self.b2.pop(key, None)
        return victims

    monkeypatch.setattr(ARCCachePolicy, "evict", evict_without_ghosts)
    div = _first_divergence()
    assert div is not None and div.config.cache_policy == "arc"
