"""The gate's fuzz budget steered by coverage (harness/fuzz/steering.py):
half explores evenly, the steered half goes to the kind configs whose two
seeds still disagree on the paths they take through vLLM's KV core."""

from __future__ import annotations

import coverage

from harness.fuzz import core_coverage as cc
from harness.fuzz.steering import Plan, allocate, kind_weights, plan, steered_slot
from impl.profiles import get_profile

SOURCE = '''X = 1
if X:
    Y = 2


def f(a):
    if a:
        return 1
    return 2
'''


def _slice(data_dir, source, name: str, arcs) -> None:
    """A finished slice's data file taking `arcs` in `source`."""
    data = coverage.CoverageData(basename=str(data_dir / f".coverage.{cc._suffix(name)}"))
    data.add_arcs({str(source): arcs})
    data.write()
    (data_dir / "done").mkdir(exist_ok=True)
    (data_dir / "done" / cc._suffix(name)).touch()


def test_slots_follow_the_weights():
    assert allocate({"a": 1, "b": 1, "c": 8}, 5) == ["a", "c", "c", "c", "c"]
    assert allocate({"a": 1, "b": 1}, 4) == ["a", "a", "b", "b"]
    assert allocate({"a": 3, "b": 3}, 1) == ["a"]  # ties by name: every worker agrees
    assert len(allocate({k: 1 + i for i, k in enumerate("abcdefg")}, 13)) == 13
    assert allocate({}, 3) == [] and allocate({"a": 1}, 0) == []


def test_a_kind_whose_seeds_disagree_weighs_more():
    same = frozenset({("f", 1, 2), ("f", 2, 3)})
    w = kind_weights({"saturated": [same, same],
                      "open": [same, same | {("f", 3, 4), ("f", 4, 5)}]})
    assert w == {"saturated": 1, "open": 3}


def test_the_plan_halves_the_budget():
    p = plan(40.0, 7, get_profile("0.33"))
    explored = {kind for kind, _, _ in p.explore}
    assert {seed for _, seed, _ in p.explore} == {7, 8}
    assert abs(sum(s for _, _, s in p.explore) - 20.0) < 1e-9
    assert p.slots == len(explored) // 2 and abs(p.slots * p.slot_seconds - 20.0) < 1e-9


def test_a_slot_goes_where_the_paths_still_differ(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(SOURCE)
    data = tmp_path / "cov"
    data.mkdir()
    p = Plan((("a", 0, 1.0), ("a", 1, 1.0), ("b", 0, 1.0), ("b", 1, 1.0)), 2, 3.0, 0)
    # Kind a's seeds agree; b's second seed took the other branch of f.
    _slice(data, source, "fuzz[a,seed=0]", [(-1, 7), (7, 8)])
    _slice(data, source, "fuzz[a,seed=1]", [(-1, 7), (7, 8)])
    _slice(data, source, "fuzz[b,seed=0]", [(-1, 7), (7, 8)])
    _slice(data, source, "fuzz[b,seed=1]", [(-1, 7), (7, 9), (9, -6)])
    # a weighs 1, b 1 + 3 (its seeds disagree on (7, 8), (7, 9), (9, exit)).
    got = [steered_slot(p, i, str(data)) for i in range(2)]
    assert [(s.kind, s.seed) for s in got] == [("b", 2), ("b", 3)]
    assert got[0].seconds == 3.0 and got[0].why == "steered: weight 4, 2 of 2 slots"
    # Lines run at import (module level) are no path: a first slice in a
    # worker takes them all, which would make its kind look unsaturated.
    _slice(data, source, "fuzz[a,seed=1]", [(-1, 7), (7, 8), (1, 2), (2, 3)])
    assert [steered_slot(p, i, str(data)).kind for i in range(2)] == ["b", "b"]
    # Negative control: b's seeds agree too, so the slots are shared.
    _slice(data, source, "fuzz[b,seed=1]", [(-1, 7), (7, 8)])
    assert [steered_slot(p, i, str(data)).kind for i in range(2)] == ["a", "b"]


def test_without_data_the_slots_take_the_kinds_in_turn(tmp_path):
    p = Plan((("a", 0, 1.0), ("a", 1, 1.0), ("b", 0, 1.0), ("b", 1, 1.0)), 3, 1.0, 0)
    got = [steered_slot(p, i, None) for i in range(3)]
    assert [(s.kind, s.seed) for s in got] == [("a", 2), ("b", 2), ("a", 3)]
    assert all("not steered" in s.why for s in got)
    # An exploring slice that never ends: the slot waits, then runs unsteered.
    s = steered_slot(p, 1, str(tmp_path), wait_seconds=0.0, poll=0.0)
    assert (s.kind, s.seed) == ("b", 2) and "never ended" in s.why
