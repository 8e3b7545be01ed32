"""The offload tier's 0.33 fields (impl/profiles.py: offload_request_ranked_lru,
offload_failed_store_events) against vLLM 0.33.0's own CPU offload manager,
through its overlay (make test builds it): impl with the 0.33 profile agrees
over seeded programs, and impl with either field turned back to 0.32's value
diverges (each field is what makes it agree). Bounded by program counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OVERLAY = ROOT / ".vllm-0.33.0"
PROGRAMS = 40

FIELDS = ("offload_request_ranked_lru", "offload_failed_store_events")

# One process (one import of vLLM 0.33.0): the 0.33 profile, then each field
# turned off in turn; the programs stop at their first divergence.
_CHILD = """
import dataclasses, json, sys
from harness.fuzz import offload_driver
from impl.profiles import get_profile
out = {}
for field in [None, *json.loads(sys.argv[1])]:
    profile = get_profile("0.33")
    if field:
        profile = dataclasses.replace(profile, **{field: False})
    result = offload_driver.fuzz(seed=0, programs=int(sys.argv[2]), profile=profile)
    out[field or "0.33"] = {"ops": result.ops,
                            "divergences": [d.line() for d in result.divergences]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def on_033() -> dict:
    assert OVERLAY.is_dir(), "no vLLM 0.33.0 overlay: make overlays (make test builds it)"
    env = {**os.environ, "PYTHONPATH": str(OVERLAY)}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(FIELDS), str(PROGRAMS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_impl_agrees_with_vllm_033_over_seeded_programs(on_033):
    assert on_033["0.33"]["divergences"] == [] and on_033["0.33"]["ops"] > 5_000


@pytest.mark.parametrize("field", FIELDS)
def test_each_033_field_is_needed(on_033, field):
    assert on_033[field]["divergences"]
