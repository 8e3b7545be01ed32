"""In the impl run, vLLM's Scheduler and the OffloadingConnector's scheduler
side reach impl's KV cache (harness/peer/rebind.rebind_vllm_callers): the
manager the Scheduler builds, the connector's sizing helpers (also a name the
module imported before vLLM's callables were wrapped for counting) and the
manager class the spec registry names. Run in a process of its own: the
rebinding changes vLLM's modules for the rest of the process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]

_PROBE = r"""
import json, torch
from harness.peer import instrument, rebind
from harness.peer.adapters import manager, sizing
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import config as oc
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as osched
from vllm.v1.core.sched import scheduler as sched
from vllm.v1.kv_cache_interface import FullAttentionSpec

spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)

def look():
    cls = osched.KVCacheSpecRegistry.get_manager_class(spec)
    return {"manager": sched.KVCacheManager is manager.KVCacheManager,
            "sizing": oc.resolve_kv_cache_block_sizes is sizing.resolve_kv_cache_block_sizes,
            "registry": cls.__module__.startswith("harness.peer")}

before = look()
instrument.install()
instrument.install_vllm()
rebind.rebind_vllm_callers()
print(json.dumps({"before": before, "after": look()}))
"""


def test_the_scheduler_and_the_connector_reach_impl_only_in_the_impl_run():
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    # Before the rebinding every one of them is vLLM's (the control), after
    # it impl's.
    assert seen["before"] == {"manager": False, "sizing": False, "registry": False}
    assert seen["after"] == {"manager": True, "sizing": True, "registry": True}
