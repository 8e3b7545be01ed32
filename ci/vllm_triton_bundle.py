#!/usr/bin/env python3
"""Copy vLLM's Triton attention kernels out of the installed vLLM into a small
folder that runs without vLLM (for `make gpu-check` on a GPU machine that
cannot install it).

    ci/vllm_triton_bundle.py OUT     # OUT/vllm/... ; OUT is emptied first

Copied verbatim: vllm/v1/attention/ops/triton_unified_attention.py,
triton_reshape_and_cache_flash.py and the one op module they import,
triton_attention_helpers.py. Every other vllm name they import is written as a
thin stand-in, from the installed vLLM where it is plain code:

- vllm.envs: the values the copied files read (`envs.NAME`), as installed;
- vllm.logger: init_logger -> logging.getLogger;
- vllm.platforms: current_platform, answering from torch.cuda (CUDA, OCP fp8;
  without a GPU, for the interpreter dry run, it answers as a Hopper GPU);
- vllm.triton_utils: triton and triton.language;
- vllm.utils.torch_utils.is_quantized_kv_cache,
  vllm.v1.kv_cache_interface.KVQuantMode,
  vllm.model_executor.layers.quantization.utils.quant_utils (FP8_DTYPE,
  get_fp8_min_max): their source, taken from the installed vLLM.

The folder also gets MANIFEST.txt: the vLLM version and each file's origin.
Imports the copied files make that are none of these fail at import time in
the bundle, so a vLLM release that needs more shows up as an error, not as a
kernel run against the wrong code.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.core.exit_codes import ExitCode  # noqa: E402

OPS = ("triton_unified_attention.py", "triton_reshape_and_cache_flash.py",
       "triton_attention_helpers.py")

_PLATFORM = '''"""Stand-in for vllm.platforms (kvconform gpu-check bundle): a CUDA platform
answering from torch.cuda; without a GPU (the interpreter dry run) it answers
as a Hopper (9.0) GPU."""

import torch


class _Capability(tuple):
    def to_int(self) -> int:
        return self[0] * 10 + self[1]


class _Platform:
    device_type = "cuda"

    @staticmethod
    def get_device_capability(device_id: int = 0):
        if torch.cuda.is_available():
            return _Capability(torch.cuda.get_device_capability(device_id))
        return _Capability((9, 0))

    @classmethod
    def has_device_capability(cls, capability, device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return tuple(cls.get_device_capability(device_id)) >= capability
        return cls.get_device_capability(device_id).to_int() >= capability

    @classmethod
    def is_device_capability(cls, capability, device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return tuple(cls.get_device_capability(device_id)) == capability
        return cls.get_device_capability(device_id).to_int() == capability

    @classmethod
    def is_device_capability_family(cls, capability: int, device_id: int = 0) -> bool:
        return cls.get_device_capability(device_id).to_int() // 10 == capability // 10

    @staticmethod
    def fp8_dtype():
        return torch.float8_e4m3fn

    @staticmethod
    def is_fp8_fnuz() -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


current_platform = _Platform()
'''

_LOGGER = '''"""Stand-in for vllm.logger (kvconform gpu-check bundle)."""

import logging


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
'''

_TRITON_UTILS = '''"""Stand-in for vllm.triton_utils (kvconform gpu-check bundle)."""

import triton
import triton.language as tl

HAS_TRITON = True
'''


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _package_inits(root: str) -> None:
    for folder, _, files in os.walk(os.path.join(root, "vllm")):
        if "__init__.py" not in files:
            _write(os.path.join(folder, "__init__.py"),
                   '"""Part of the kvconform gpu-check bundle of vLLM\'s Triton kernels."""\n')


def build(out: str) -> list[str]:
    import vllm
    import vllm.envs as envs
    from vllm.model_executor.layers.quantization.utils import quant_utils
    from vllm.utils import torch_utils
    from vllm.v1.kv_cache_interface import KVQuantMode

    src_ops = os.path.join(os.path.dirname(vllm.__file__), "v1", "attention", "ops")
    if os.path.exists(out):
        shutil.rmtree(out)
    ops = os.path.join(out, "vllm", "v1", "attention", "ops")
    os.makedirs(ops)
    manifest = [f"vLLM {vllm.__version__}, from {os.path.dirname(vllm.__file__)}"]
    used_env: set[str] = set()
    for name in OPS:
        shutil.copyfile(os.path.join(src_ops, name), os.path.join(ops, name))
        manifest.append(f"vllm/v1/attention/ops/{name}: copied")
        with open(os.path.join(src_ops, name), encoding="utf-8") as f:
            used_env |= set(re.findall(r"envs\.([A-Z][A-Z0-9_]*)", f.read()))

    env_lines = [f"{n} = {getattr(envs, n)!r}" for n in sorted(used_env)]
    _write(os.path.join(out, "vllm", "envs.py"),
           '"""Stand-in for vllm.envs: the values the copied kernels read, as installed."""\n\n'
           + "\n".join(env_lines) + "\n")
    _write(os.path.join(out, "vllm", "logger.py"), _LOGGER)
    _write(os.path.join(out, "vllm", "platforms", "__init__.py"), _PLATFORM)
    _write(os.path.join(out, "vllm", "triton_utils", "__init__.py"), _TRITON_UTILS)
    _write(os.path.join(out, "vllm", "utils", "torch_utils.py"),
           '"""From vllm.utils.torch_utils (kvconform gpu-check bundle)."""\n\n'
           + inspect.getsource(torch_utils.is_quantized_kv_cache))
    _write(os.path.join(out, "vllm", "v1", "kv_cache_interface.py"),
           '"""From vllm.v1.kv_cache_interface (kvconform gpu-check bundle)."""\n\n'
           "from enum import IntEnum\n\n\n" + inspect.getsource(KVQuantMode))
    _write(os.path.join(out, "vllm", "model_executor", "layers", "quantization", "utils",
                        "quant_utils.py"),
           '"""From vllm...quantization.utils.quant_utils (kvconform gpu-check bundle)."""\n\n'
           "import torch\n\nfrom vllm.platforms import current_platform\n\n"
           "FP8_DTYPE = current_platform.fp8_dtype()\n\n\n"
           + inspect.getsource(quant_utils.get_fp8_min_max))
    manifest += [f"vllm/envs.py: stand-in ({', '.join(sorted(used_env)) or 'no values'})",
                 "vllm/logger.py, vllm/platforms, vllm/triton_utils: stand-ins",
                 "vllm/utils/torch_utils.py: is_quantized_kv_cache (source)",
                 "vllm/v1/kv_cache_interface.py: KVQuantMode (source)",
                 "vllm/model_executor/layers/quantization/utils/quant_utils.py: FP8_DTYPE, "
                 "get_fp8_min_max (source)"]
    _package_inits(out)
    _write(os.path.join(out, "MANIFEST.txt"), "\n".join(manifest) + "\n")
    return manifest


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: ci/vllm_triton_bundle.py OUT", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        manifest = build(sys.argv[1])
    except ImportError as e:
        print(f"vllm_triton_bundle: the installed vLLM lacks what the bundle copies: {e}",
              file=sys.stderr)
        return ExitCode.ENVIRONMENT
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(sys.argv[1]) for f in fs)
    print(f"vllm_triton_bundle: {sys.argv[1]} ({size / 1024:.0f} KiB): {manifest[0]}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
