"""Policies by name: the built-in ones, names registered later, and any
class named by its module path (an out-of-tree policy)."""

import importlib
from collections.abc import Callable


def _builtin(module: str, name: str) -> Callable[[], type]:
    return lambda: getattr(importlib.import_module(module), name)


class PolicyRegistry:
    """Class-level, like the process-wide table it stands for."""

    _loaders: dict[str, Callable[[], type]] = {
        "lru": _builtin("impl.kv_offload.policies.lru", "LRUCachePolicy"),
        "arc": _builtin("impl.kv_offload.policies.arc", "ARCCachePolicy"),
    }

    @classmethod
    def register_cache_policy(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._loaders:
            raise ValueError(f"cache policy name {name!r} is already registered")
        cls._loaders[name] = _builtin(module_path, class_name)

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None,
                             request_ranked_lru: bool = False) -> type:
        # 0.33's LRU (the profile field offload_request_ranked_lru).
        if name == "lru" and request_ranked_lru:
            return _builtin("impl.kv_offload.policies.request_lru",
                            "RequestRankedLRUCachePolicy")()
        loader = cls._loaders.get(name)
        if loader is not None:
            return loader()
        if module_path is None:
            raise ValueError(f"Unknown cache policy {name!r} (known: {sorted(cls._loaders)}); "
                             "an out-of-tree policy needs its module path too")
        return getattr(importlib.import_module(module_path), name)
