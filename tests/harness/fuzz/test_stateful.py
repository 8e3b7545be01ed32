"""Hypothesis' stateful testing of impl against live vLLM."""

import pytest
from hypothesis import HealthCheck, settings

from harness.fuzz.stateful import make_machine
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P = get_profile("0.32")


def _vllm(config):
    from harness.backends.vllm_backend import VllmBackend

    return VllmBackend(config, P)


KVCacheMachine = make_machine(P, _vllm)
KVCacheMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow], derandomize=True,
)
TestKVCacheMachine = KVCacheMachine.TestCase
