"""KVCacheManager scenarios, each run on impl and live on vLLM with the same
hand-derived expected answers (see harness/scenarios.py for the derivations)."""

import pytest

from harness.scenarios import SCENARIOS, check_expected, documented_example


def run_and_check(backend, scenario):
    answers = []
    for i, (event, expected) in enumerate(scenario.steps):
        answer = backend.run(event)
        err = check_expected(answer, expected)
        assert err is None, f"step #{i} {event!r}: {err}"
        answers.append(answer)
    return answers


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario(make_backend, name):
    scenario = SCENARIOS[name]()
    run_and_check(make_backend(scenario.config, scenario.profile), scenario)


@pytest.mark.vllm
def test_scenarios_give_identical_full_answers_on_both_backends():
    """Beyond the checked fields, every answer (events, hashes, stats) agrees."""
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.vllm_backend import VllmBackend
    from impl.profiles import get_profile

    for name, make in SCENARIOS.items():
        scenario = make()
        ours = ImplBackend(scenario.config, get_profile(scenario.profile))
        theirs = VllmBackend(scenario.config, get_profile(scenario.profile))
        for i, event in enumerate(scenario.events):
            assert ours.run(event) == theirs.run(event), f"{name} step #{i} {event!r}"


def test_documented_example_0_17_matches_the_documentation():
    """With the 0.17 profile the free queue evolves exactly as the pictures in
    vLLM's prefix-caching design document show (their block n is our n+1)."""
    from harness.backends.impl_backend import ImplBackend
    from impl.profiles import get_profile

    scenario = documented_example("0.17")
    run_and_check(ImplBackend(scenario.config, get_profile("0.17"), check=True), scenario)


@pytest.mark.vllm017
def test_documented_example_0_17_live():
    from harness.backends.vllm_backend import VllmBackend
    from impl.profiles import get_profile

    scenario = documented_example("0.17")
    run_and_check(VllmBackend(scenario.config, get_profile("0.17")), scenario)
