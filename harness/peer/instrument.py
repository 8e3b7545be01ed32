"""Count calls into impl, so a test that passes without reaching impl is not
counted as impl passing; and calls into vLLM's own KV cache code, so a test
whose answers came (partly) from vLLM in the impl run (e.g. through vLLM's
Scheduler, which builds vLLM's KVCacheManager) is not counted either.

`install()` wraps, in this process only, every function, method, classmethod,
staticmethod and property getter defined in an impl module with a counter.
impl's source is untouched; internal calls between impl functions bound at
import time are not counted, which is fine: the question is only whether a
test reached impl at all (the adapters call impl through module attributes).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

_count = [0]
_installed = [False]
# vLLM's KV cache modules: calls of their non-dunder callables are counted by name.
VLLM_KV_MODULES = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.hisparse.coordinator",
    "vllm.v1.hisparse.layout",
    "vllm.v1.hisparse.block_pool",
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.policies.lru",
    "vllm.v1.kv_offload.cpu.policies.arc",
    "vllm.v1.worker.block_table",
    "vllm.v1.worker.cp_utils",
)
_vllm_calls: dict[str, int] = {}
_vllm_installed = [False]
# Not counted: reads of what a spec or config *is* (its layers, whether it
# takes part in prefix caching, its replay window), which vLLM's connectors and
# Scheduler make on the test's own input. They answer nothing about the KV
# cache; sizing answers (page sizes, memory use) stay counted. Nor is the
# registration of vLLM's spec classes with their manager classes, which its
# spec registry runs once, lazily, whoever first asks (a Scheduler being
# built, say): it fills a class table and computes nothing.
_DESCRIPTORS = {"prefix_cacheable", "prefix_replay_tokens", "iter_layer_specs",
                "has_mamba_layers", "register_all_kvcache_specs"}
# Dunders worth counting: construction and the protocols tests drive.
_DUNDERS = {"__init__", "__call__", "__iter__", "__len__", "__getitem__", "__post_init__"}


def calls() -> int:
    return _count[0]


def reset() -> None:
    _count[0] = 0
    _vllm_calls.clear()


def vllm_calls() -> dict[str, int]:
    """vLLM KV-cache callables called since reset(), by qualified name."""
    return dict(_vllm_calls)


def _counted_vllm(fn, qualname: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _building[0]:
            _vllm_calls[qualname] = _vllm_calls.get(qualname, 0) + 1
        return fn(*args, **kwargs)

    wrapper.__kvconform_counted__ = True
    return wrapper


# > 0 while a vLLM KV object is being built: what its constructor calls
# (e.g. MLAAttentionSpec padding its page) builds the test's own input.
_building = [0]


def _quiet_constructor(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _building[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _building[0] -= 1

    wrapper.__kvconform_counted__ = True
    return wrapper


def _wrap_vllm_class(cls: type) -> None:
    # Not dunders: constructing specs, configs and requests is the test's
    # own input, and equality/hash/repr answer nothing about the KV cache.
    if issubclass(cls, tuple) or getattr(cls, "__module__", "").startswith("enum"):
        return
    post_init = vars(cls).get("__post_init__")
    if post_init is not None and not getattr(post_init, "__kvconform_counted__", False):
        cls.__post_init__ = _quiet_constructor(post_init)
    for name, attr in list(vars(cls).items()):
        if name.startswith("__") or name in _DESCRIPTORS:
            continue
        qual = f"{cls.__name__}.{name}"
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(_counted_vllm(attr.__func__, qual)))
        elif isinstance(attr, classmethod):
            setattr(cls, name, classmethod(_counted_vllm(attr.__func__, qual)))
        elif isinstance(attr, property) and attr.fget is not None:
            setattr(cls, name, property(_counted_vllm(attr.fget, qual), attr.fset, attr.fdel,
                                        attr.__doc__))
        elif inspect.isfunction(attr) and not getattr(attr, "__kvconform_counted__", False):
            setattr(cls, name, _counted_vllm(attr, qual))


def release_module(name: str):
    """vLLM's module `name`, or None when the release running has no such
    module (an older release: `kvconform --vllm 0.17.1 peer`), so there is
    nothing in it to count or rebind."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise


def install_vllm() -> None:
    """Count calls into vLLM's KV cache modules (idempotent). Run before the
    test modules are imported, so names they import are the counted ones."""
    if _vllm_installed[0]:
        return
    import enum

    for module_name in VLLM_KV_MODULES:
        module = release_module(module_name)
        if module is None:
            continue
        for name, attr in list(vars(module).items()):
            if getattr(attr, "__module__", None) != module_name:
                continue
            if inspect.isclass(attr):
                if not issubclass(attr, enum.Enum):
                    _wrap_vllm_class(attr)
            elif inspect.isfunction(attr) and name not in _DESCRIPTORS:
                short = module_name.rsplit('.', 1)[1]
                setattr(module, name, _counted_vllm(attr, f"{short}.{name}"))
    _vllm_installed[0] = True


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _count[0] += 1
        return fn(*args, **kwargs)

    wrapper.__kvconform_counted__ = True
    return wrapper


def _wrap_class(cls: type) -> None:
    for name, attr in list(vars(cls).items()):
        if name.startswith("__") and name not in _DUNDERS:
            continue
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(_counted(attr.__func__)))
        elif isinstance(attr, classmethod):
            setattr(cls, name, classmethod(_counted(attr.__func__)))
        elif isinstance(attr, property) and attr.fget is not None:
            setattr(cls, name, property(_counted(attr.fget), attr.fset, attr.fdel, attr.__doc__))
        elif inspect.isfunction(attr) and not getattr(attr, "__kvconform_counted__", False):
            setattr(cls, name, _counted(attr))


def impl_modules():
    import impl

    yield impl
    for info in pkgutil.walk_packages(impl.__path__, "impl."):
        if ".kernels" in info.name:
            continue  # Triton kernels: not part of the KV cache manager's API
        yield importlib.import_module(info.name)


def install() -> None:
    """Wrap impl's callables (idempotent)."""
    if _installed[0]:
        return
    for module in impl_modules():
        for name, attr in list(vars(module).items()):
            if getattr(attr, "__module__", None) != module.__name__:
                continue  # imported from elsewhere: wrapped where it is defined
            if inspect.isclass(attr):
                _wrap_class(attr)
            elif inspect.isfunction(attr):
                setattr(module, name, _counted(attr))
    _installed[0] = True
