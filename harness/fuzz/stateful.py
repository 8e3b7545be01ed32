"""The same fuzz actions as Hypothesis stateful rules.

Hypothesis brings what the fast generator lacks: coverage-guided choice of the
next rule, its own shrinking to a minimal failing rule sequence, and an example
database that replays past failures first. It runs the same Driver (valid calls
only, every answer compared, impl's invariants checked), so a failure here is a
failure of the same contract.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.actions import (
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
from harness.fuzz.driver import Driver
from harness.report.text import format_failure
from impl.profiles import VersionProfile

VOCAB = 3


def make_machine(profile: VersionProfile, backend_factory) -> type[RuleBasedStateMachine]:
    """A state machine class running impl against `backend_factory(config)`."""

    class KVCacheMachine(RuleBasedStateMachine):
        @initialize(
            block_size=st.sampled_from([1, 2, 4]),
            num_blocks=st.integers(2, 12),
            caching=st.booleans(),
            algo=st.sampled_from(["sha256", "xxhash_cbor"]),
        )
        def setup(self, block_size, num_blocks, caching, algo):
            self.config = CacheConfig(num_blocks=num_blocks, groups=(GroupConfig(block_size),),
                                      hash_algo=algo, enable_caching=caching)
            backends = [backend_factory(self.config), ImplBackend(self.config, profile,
                                                                  check=True)]
            self.driver = Driver(self.config, profile, backends)
            self.num_new = 0

        def _do(self, action):
            self.driver.apply(action)

        def _req(self, data):
            return data.draw(st.integers(0, max(self.num_new - 1, 0)), label="req")

        @rule(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
              salt=st.sampled_from([None, None, "s"]))
        def new(self, prompt, salt):
            self._do(New(self.num_new, tuple(prompt), cache_salt=salt))
            self.num_new += 1

        @rule(data=st.data(), n=st.sampled_from([1, 2, 3, 4096]),
              lookahead=st.sampled_from([0, 0, 1, 3]), external=st.sampled_from([0, 0, 2]),
              delay=st.booleans())
        def schedule(self, data, n, lookahead, external, delay):
            self._do(Schedule(self._req(data), n, lookahead, external, delay and external > 0))

        @rule(data=st.data(), tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1,
                                              max_size=3))
        def sample(self, data, tokens):
            self._do(Sample(self._req(data), tuple(tokens)))

        @rule(data=st.data())
        def finish(self, data):
            self._do(Finish(self._req(data)))

        @rule(data=st.data())
        def preempt(self, data):
            self._do(Preempt(self._req(data)))

        @rule(data=st.data())
        def finish_load(self, data):
            self._do(FinishLoad(self._req(data)))

        @rule()
        def reset(self):
            self._do(Reset())

        @rule(ids=st.lists(st.integers(0, 11), min_size=1, max_size=3))
        def evict(self, ids):
            self._do(Evict(tuple(ids)))

        @rule()
        def step(self):
            self._do(StepBoundary())

        @rule()
        def observe(self):
            self._do(Observe())

        @invariant()
        def conformant(self):
            if getattr(self, "driver", None) is not None and self.driver.run.failed:
                raise AssertionError(format_failure(self.driver.run.failure))

    return KVCacheMachine
