"""Swap impl in, inside vLLM's test modules only.

For each test module (and the helper modules under tests/ it imports), every
global that *is* one of the vLLM objects in `table()` is replaced by its
adapter, and every global that is one of vLLM's KV-cache modules (imported as
`import vllm.v1.core.kv_cache_utils as kv_cache_utils`) by a proxy module
that serves the adapters for those names and vLLM's module for the rest.
vLLM itself is left alone: its own modules keep calling vLLM, with one
exception (`rebind_vllm_callers`): the two Mamba checkpoint helpers of the KV
cache interface that vLLM's Scheduler and model runner import (pure token
arithmetic: where a prefill chunk ends, which column a checkpoint is exported
to) are impl's there too, so the tests driving those check impl's arithmetic
instead of reading answers from vLLM's KV cache code.
"""

from __future__ import annotations

import sys
import types

from harness.peer import proxies

_table: dict[int, tuple[object, object]] | None = None


def _entries():
    """(vLLM object, adapter) for every vLLM name the release running has: an
    older release (`kvconform --vllm 0.17.1 peer`) lacks some modules and
    names, and its tests then cannot use them either."""
    import impl.block as iblock
    import impl.mamba_checkpoint as imc
    from harness.peer.adapters import (
        hashing,
        hisparse,
        manager,
        metrics,
        pool,
        single_type,
        sizing,
        worker,
    )
    from harness.peer.instrument import release_module

    wanted = [
        ("vllm.v1.core.kv_cache_manager", "KVCacheManager", manager.KVCacheManager),
        ("vllm.v1.core.kv_cache_manager", "KVCacheBlocks", manager.KVCacheBlocks),
        ("vllm.v1.core.block_pool", "BlockPool", pool.BlockPool),
        ("vllm.v1.core.block_pool", "BlockHashToBlockMap", pool.BlockHashToBlockMap),
        ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue", pool.FreeKVCacheBlockQueue),
        ("vllm.v1.core.kv_cache_utils", "KVCacheBlock", pool.KVCacheBlock),
        ("vllm.v1.core.single_type_kv_cache_manager", "get_manager_for_kv_cache_spec",
         single_type.get_manager_for_kv_cache_spec),
        ("vllm.v1.hisparse.coordinator", "get_hisparse_coordinator",
         hisparse.get_hisparse_coordinator),
        ("vllm.v1.core.kv_cache_metrics", "KVCacheMetricsCollector",
         metrics.KVCacheMetricsCollector),
        ("vllm.v1.core.kv_cache_metrics", "BlockMetricsState", metrics.BlockMetricsState),
    ]
    for name in ("SingleTypeKVCacheManager", "FullAttentionManager", "SinkFullAttentionManager",
                 "SlidingWindowManager", "ChunkedLocalAttentionManager", "MambaManager",
                 "CrossAttentionManager", "CircularBufferManager", "RSWAManager",
                 "HiSparseSourceManager", "HiSparseHotManager", "HiSparseResidentManager"):
        wanted.append(("vllm.v1.core.single_type_kv_cache_manager", name,
                       getattr(single_type, name)))
    for name in hashing.ALGORITHMS:
        wanted.append(("vllm.utils.hashing", name, getattr(hashing, name)))
    for name in ("init_none_hash", "get_request_block_hasher", "hash_block_tokens",
                 "generate_block_hash_extra_keys", "to_event_extra_keys",
                 "make_block_hash_with_group_id", "get_block_hash", "get_group_id",
                 "BlockHashListWithBlockSize", "resolve_block_hashes",
                 "maybe_convert_block_hash"):
        wanted.append(("vllm.v1.core.kv_cache_utils", name, getattr(hashing, name)))
    for name in sizing.REBOUND:
        wanted.append(("vllm.v1.core.kv_cache_utils", name, getattr(sizing, name)))
    for name in sizing.INTERFACE_REBOUND:
        wanted.append(("vllm.v1.kv_cache_interface", name, getattr(sizing, name)))
    for name in sizing.HISPARSE_LAYOUT_REBOUND:
        wanted.append(("vllm.v1.hisparse.layout", name, getattr(sizing, name)))
    # impl's own helper, same signature.
    wanted.append(("vllm.v1.core.kv_cache_utils", "null_head_len", iblock.null_head_len))
    # Mamba prefill checkpoint helpers: impl's own, same signature.
    wanted.append(("vllm.v1.kv_cache_interface", "get_mamba_prefill_checkpoint_position",
                   single_type.get_mamba_prefill_checkpoint_position))
    wanted.append(("vllm.v1.kv_cache_interface", "is_mamba_prefill_checkpoint_valid",
                   imc.is_mamba_prefill_checkpoint_valid))
    wanted.extend(worker.REBOUND)
    pairs = []
    for module_name, name, adapter in wanted:
        module = release_module(module_name)
        if module is not None and hasattr(module, name):
            pairs.append((getattr(module, name), adapter))
    pairs.extend(sizing.spec_classes())
    pairs.append(sizing.config_class())
    # The CPU offload tier (tests/v1/kv_offload/cpu/), where the release's
    # has the chunk-status shape impl's model has (0.30 on; 0.28's policies
    # have no ChunkStatus): its tests then check impl's answers, also where
    # the profile does not claim the tier (offload_cpu_tier) and they differ.
    policies = release_module("vllm.v1.kv_offload.cpu.policies.base")
    if policies is not None and hasattr(policies, "ChunkStatus"):
        from harness.peer.adapters import offload

        pairs.extend(offload.rebound())
    return pairs


# (vLLM module, name) whose global is impl's helper in the impl run.
_CALLER_HELPERS = (
    ("vllm.v1.core.sched.scheduler", "get_mamba_prefill_checkpoint_position"),
    ("vllm.v1.core.sched.scheduler", "is_mamba_prefill_checkpoint_valid"),
    ("vllm.model_executor.layers.mamba.checkpoint", "get_mamba_prefill_checkpoint_position"),
    ("vllm.model_executor.layers.mamba.checkpoint", "is_mamba_prefill_checkpoint_valid"),
)


# vLLM module -> its globals that read the specs of impl's managers, pointed
# at the sizing adapter's (which takes impl's specs as well as vLLM's) when
# a test imports the module (EngineCore is heavy: not imported otherwise).
_SPEC_READERS = {"vllm.v1.engine.core": ("is_full_attention_spec",)}


def rebind_vllm_callers() -> None:
    """Point the Scheduler's and model runner's checkpoint helpers at impl's,
    the model runner's input batch at impl's worker block tables, the
    Scheduler's KV cache manager at impl's, and the connectors' KV cache
    names at impl's."""
    import impl.mamba_checkpoint as imc
    from harness.peer.adapters import single_type, worker
    from harness.peer.instrument import release_module

    for module_name, name in _CALLER_HELPERS:
        module = release_module(module_name)
        if module is not None:  # an older release may not have it
            setattr(module, name, getattr(single_type, name, None) or getattr(imc, name))
    for module_name, name, adapter in (*worker.CALLERS, *_scheduler_builds()):
        module = release_module(module_name)
        if module is not None and hasattr(module, name):
            setattr(module, name, adapter)
    _rebind_caller_modules()


# vLLM's modules beside the KV cache that call into it: the connectors'
# scheduler sides (the OffloadingConnector, the simple CPU offload and the CPU
# pool it keeps). In the impl run their KV cache names are impl's, as in a
# test module, so a test driving a connector checks impl's answers.
_CALLER_MODULES = (
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.events",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.config",
    "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector",
    "vllm.v1.simple_kv_offload.manager",
)


def _rebind_caller_modules() -> None:
    from harness.peer.instrument import release_module

    for module_name in _CALLER_MODULES:
        try:
            module = release_module(module_name)
        except ImportError:  # a connector this build cannot import (a GPU library)
            continue
        if module is not None:
            rebind_module(module)
            registry = getattr(module, "KVCacheSpecRegistry", None)
            if registry is not None and not isinstance(registry, _RegistryView):
                module.KVCacheSpecRegistry = _RegistryView(registry)


class _RegistryView:
    """vLLM's spec registry as a connector sees it in the impl run: the
    manager class it names for a spec is impl's (its static answers, such as
    reachable_block_mask, are then impl's); the rest is vLLM's registry."""

    def __init__(self, registry) -> None:
        self._registry = registry

    def get_manager_class(self, *args, **kwargs):
        cls = self._registry.get_manager_class(*args, **kwargs)
        hit = table().get(id(cls))
        return hit[1] if hit is not None and hit[0] is cls else cls

    def __getattr__(self, name: str):
        return getattr(self._registry, name)


def _scheduler_builds():
    """The KV cache objects vLLM's Scheduler builds for itself: impl's in the
    impl run, so a test driving the Scheduler checks impl's manager."""
    from harness.peer.adapters import manager, metrics

    sched = "vllm.v1.core.sched.scheduler"
    return ((sched, "KVCacheManager", manager.KVCacheManager),
            (sched, "KVCacheMetricsCollector", metrics.KVCacheMetricsCollector))


def _rebind_spec_readers(module: types.ModuleType) -> None:
    from harness.peer.adapters import sizing

    for name in _SPEC_READERS.get(module.__name__, ()):
        if hasattr(module, name):
            setattr(module, name, getattr(sizing, name))


def table() -> dict[int, tuple[object, object]]:
    """id(vLLM object) -> (vLLM object, adapter)."""
    global _table
    if _table is None:
        _table = {}
        for v, a in _entries():
            _table[id(v)] = (v, a)
            # A module that imported the name before vLLM's callables were
            # wrapped for counting (a connector imported early) holds the
            # function itself: it is rebound all the same.
            raw = getattr(v, "__wrapped__", None)
            if raw is not None and getattr(v, "__kvconform_counted__", False):
                _table[id(raw)] = (raw, a)
    return _table


class _ProxyModule(types.ModuleType):
    """A vLLM module as a test sees it: rebound names from the adapters,
    everything else from vLLM's module."""

    def __init__(self, real: types.ModuleType, overrides: dict[str, object]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_kvconform_real"] = real
        self.__dict__.update(overrides)

    def __getattr__(self, name: str):
        if name == "NONE_HASH":
            from harness.peer.adapters import hashing

            return hashing.none_hash()
        return getattr(self.__dict__["_kvconform_real"], name)


_PROXIED = ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_manager",
            "vllm.v1.core.block_pool", "vllm.v1.core.single_type_kv_cache_manager",
            "vllm.utils.hashing", "vllm.v1.kv_cache_interface", "vllm.v1.hisparse.coordinator",
            "vllm.v1.core.kv_cache_metrics", "vllm.v1.hisparse.layout",
            "vllm.v1.worker.block_table", "vllm.v1.worker.cp_utils",
            "vllm.v1.attention.backends.utils")
# Proxied only for `from M import name` run by a test (inside a function:
# module-level names are rebound through the table anyway); a test holding
# the module itself keeps vLLM's, whose other names it monkeypatches (the
# worker's zeroing kernel) for vLLM's own callers to see.
_FROM_IMPORT_PROXIED = ("vllm.v1.worker.utils",)


def proxy(module: types.ModuleType) -> types.ModuleType:
    known = proxies.get(module.__name__)
    if known is None:
        entries = table()
        overrides = {}
        for name, value in vars(module).items():
            hit = entries.get(id(value))
            if hit is not None and hit[0] is value:
                overrides[name] = hit[1]
        known = proxies.store(module.__name__, _ProxyModule(module, overrides))
    return known


def rebind_module(module: types.ModuleType) -> int:
    """Rebind one test module's globals; returns how many were replaced."""
    if getattr(module, "__kvconform_rebound__", False):
        return 0
    entries = table()
    n = 0
    for name, value in list(vars(module).items()):
        rebind_instances(value)
        hit = entries.get(id(value))
        if hit is not None and hit[0] is value:
            setattr(module, name, hit[1])
            n += 1
        elif isinstance(value, types.ModuleType) and value.__name__ in _PROXIED:
            setattr(module, name, proxy(value))
            n += 1
    module.__kvconform_rebound__ = True
    return n


def _spec_classes() -> dict[type, type]:
    from harness.peer.adapters import sizing

    return dict(sizing.spec_classes())


def rebind_instances(obj, depth: int = 0) -> None:
    """Specs a test module built at import (module constants, parametrize
    values) become instances of the rebound classes, as if built after the
    swap: same fields, impl's sizing answers."""
    if depth > 4:
        return
    rebound = _spec_classes().get(type(obj))
    if rebound is not None:
        object.__setattr__(obj, "__class__", rebound)
        for inner in getattr(obj, "kv_cache_specs", {}).values():
            rebind_instances(inner, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            rebind_instances(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            rebind_instances(value, depth + 1)
    elif type(obj).__name__ == "ParameterSet":
        rebind_instances(obj.values, depth + 1)


def rebind_test_modules(prefix: str = "tests.") -> None:
    """Every loaded module under vLLM's tests/ package."""
    for name, module in list(sys.modules.items()):
        if module is not None and (name.startswith(prefix) or name.startswith("test_")):
            rebind_module(module)


_real_import = None


def _is_test_module(globals_) -> bool:
    name = (globals_ or {}).get("__name__", "") or ""
    return name.startswith("tests.") or name.startswith("test_")


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    module = _real_import(name, globals, locals, fromlist, level)
    if fromlist and level == 0 and _is_test_module(globals):
        if name in _PROXIED or name in _FROM_IMPORT_PROXIED:
            return proxy(module)
        if name in _SPEC_READERS:
            _rebind_spec_readers(module)
    return module


def install_import_hook() -> None:
    """`from vllm.v1.core.X import Y` executed inside a test function (not at
    module level) gets the adapter too: imports made by code of vLLM's test
    modules see the proxy modules; every other importer sees vLLM."""
    global _real_import
    import builtins

    if _real_import is None:
        _real_import = builtins.__import__
        builtins.__import__ = _import
