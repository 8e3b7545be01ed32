"""Run on an unpacked vLLM release (PYTHONPATH=the release's files): import
its KV cache code and say how that went.

    python -m harness.releases.vllm_overlay_probe

prints one line `kvconform-probe: {JSON}` (vLLM may log to stdout too): the
release's version, the third-party modules the KV code needs and this venv
lacks, and the modules that did not import. The overlay builder
(harness/releases/vllm_overlay.py) adds the missing modules and refuses a release whose
KV cache code does not import.
"""

from __future__ import annotations

import importlib
import json
import sys

MARKER = "kvconform-probe: "
# The KV cache code, and what the harness imports next to it: the vLLM adapter,
# capture's Scheduler, sizing. An overlay without these is not built.
REQUIRED = (
    "vllm",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
    "vllm.distributed.kv_events",
    "vllm.utils.hashing",
    "vllm.sampling_params",
    "vllm.lora.request",
    "vllm.multimodal.inputs",
    "vllm.v1.core.sched.scheduler",
)
# Kept when the release has them and they import on this venv: some exist only
# in some releases (kv_cache_planning from 0.33), some need compiled ops.
OPTIONAL = (
    "vllm.envs",
    "vllm.config",
    "vllm.inputs",
    "vllm.platforms",
    "vllm.platforms.cpu",
    "vllm.v1.outputs",
    "vllm.v1.structured_output",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.core.kv_cache_planning",
    "vllm.v1.core.kv_cache_config_builder",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.v1.attention.ops.triton_unified_attention",
)


def probe() -> dict:
    missing: set[str] = set()
    failed: dict[str, str] = {}
    for name in REQUIRED + OPTIONAL:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top and top != "vllm" and name in REQUIRED:
                missing.add(top)
            failed[name] = f"{type(e).__name__}: {e}"
        except Exception as e:  # an optional module needing ops this build lacks
            failed[name] = f"{type(e).__name__}: {e}"
    try:
        import vllm

        version = vllm.__version__
    except Exception as e:
        version = None
        failed.setdefault("vllm", f"{type(e).__name__}: {e}")
    return {
        "version": version,
        "missing": sorted(missing),
        "failed": failed,
        "required_failed": sorted(n for n in REQUIRED if n in failed),
    }


def main() -> int:
    import logging

    logging.disable(logging.WARNING)
    print(MARKER + json.dumps(probe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
