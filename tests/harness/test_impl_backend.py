import pytest

from harness.backends.base import BackendError
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest, Allocate, Checkpoint, Lookup
from impl.profiles import get_profile

CFG = CacheConfig(num_blocks=6, groups=(GroupConfig(4),))


def test_unknown_and_duplicate_requests_are_errors():
    b = ImplBackend(CFG, get_profile("0.32"))
    with pytest.raises(BackendError, match="no request 'ghost'"):
        b.run(Lookup("ghost"))
    b.run(AddRequest("a", [1, 2]))
    with pytest.raises(BackendError, match="already exists"):
        b.run(AddRequest("a", [1, 2]))


def test_checkpoint_answers_only_the_requested_fields():
    b = ImplBackend(CFG, get_profile("0.32"))
    assert b.run(Checkpoint(("num_free",))) == {"num_free": 5}
    with pytest.raises(ValueError, match="unknown checkpoint field"):
        Checkpoint(("everything",))


def test_allocate_advances_num_computed_tokens_like_the_scheduler():
    b = ImplBackend(CFG, get_profile("0.32"))
    b.run(AddRequest("a", list(range(8))))
    b.run(Lookup("a"))
    assert b.run(Allocate("a", 5)) == {"block_ids": [[1, 2]]}
    assert b.requests["a"].num_computed_tokens == 5
    assert b.run(Allocate("a", 3)) == {"block_ids": [[]]}
    assert b.requests["a"].num_computed_tokens == 8
