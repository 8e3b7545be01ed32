"""The one exit-code module: how the codes of a run's parts combine."""

import pytest

from harness.core.exit_codes import ExitCode, worst


def test_worst_ranks_interrupted_environment_bad_input_divergence_ok():
    assert worst([]) is ExitCode.OK
    assert worst([0, 0]) is ExitCode.OK
    assert worst([0, 1, 0]) is ExitCode.DIVERGED
    assert worst([1, 2, 1]) is ExitCode.BAD_INPUT
    assert worst([2, 3, 1]) is ExitCode.ENVIRONMENT
    assert worst([3, 130, 0]) is ExitCode.INTERRUPTED
    assert worst(iter([ExitCode.DIVERGED, ExitCode.OK])) is ExitCode.DIVERGED


def test_a_code_outside_the_enum_is_a_bug():
    with pytest.raises(ValueError):
        worst([0, 7])
