"""Test-by-test findings for impl failures no adapter can name by itself
(an assertion that differs), each after reading the test and impl.

A key is a test name (with or without its parameters); the verdict is
FAILED with a feature impl lacks, FAILED with a divergence to fix, or
NOT_APPLICABLE with the vLLM-only thing the test asserts on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    verdict: str
    reason: str
    feature: str | None = None


FINDINGS: dict[str, Finding] = {}


def lookup(test_name: str) -> Finding | None:
    if test_name in FINDINGS:
        return FINDINGS[test_name]
    return FINDINGS.get(test_name.split("[", 1)[0])
