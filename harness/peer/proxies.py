"""The proxy modules a test sees in place of vLLM's KV-cache modules, by
module name (filled by harness/peer/rebind.py), and what a test set on one.

Apart from rebind so that an adapter can read a test's monkeypatch of a
proxy without importing rebind, which imports every adapter.
"""

from __future__ import annotations

import types

_proxies: dict[str, types.ModuleType] = {}


def get(module_name: str) -> types.ModuleType | None:
    return _proxies.get(module_name)


def store(module_name: str, module: types.ModuleType) -> types.ModuleType:
    _proxies[module_name] = module
    return module


def proxied_override(module_name: str, name: str):
    """What a test set on the proxy of `module_name` under `name` (e.g. a
    monkeypatched vLLM helper), None when nothing was."""
    module = _proxies.get(module_name)
    if module is None:
        return None
    value = module.__dict__.get(name)
    # monkeypatch's undo writes vLLM's own object back onto the proxy.
    if value is getattr(module.__dict__["_kvconform_real"], name, None):
        return None
    return value
