"""Whether the installed vLLM can be run at all: every verb that needs it asks
before any work starts."""

from __future__ import annotations

from harness.core.exit_codes import ExitCode, fail


def check_vllm() -> ExitCode | None:
    """None when the installed vLLM imports and has a version profile;
    otherwise one line on stderr and ENVIRONMENT."""
    from harness.backends.vllm_backend import EnvironmentProblem, installed_vllm_profile

    try:
        installed_vllm_profile()
    except EnvironmentProblem as e:
        return fail(str(e), ExitCode.ENVIRONMENT)
    return None
