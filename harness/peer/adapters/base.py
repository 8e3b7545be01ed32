"""The forwarding every adapter shares: attribute reads and method calls go
to the impl object, with vLLM inputs translated to impl's on the way in and
impl objects wrapped in their adapters on the way out."""

from __future__ import annotations

import functools
from collections.abc import MutableMapping

from harness.peer import convert
from harness.peer.lacks import MissingImplAPI

# impl class -> adapter class (filled by the adapter modules).
ADAPTER_FOR: dict[type, type] = {}
# id(impl object) -> its adapter, so one impl object has one adapter.
_adapters: dict[int, Adapter] = {}


def register(impl_cls: type):
    def deco(adapter_cls: type) -> type:
        ADAPTER_FOR[impl_cls] = adapter_cls
        return adapter_cls

    return deco


def wrap(obj):
    """impl object -> its adapter (if it has one), else unchanged; lists,
    tuples and dicts of them are mapped too; impl events become vLLM's."""
    if isinstance(obj, (list, tuple)):
        if not obj:
            return obj
        mapped = [wrap(x) for x in obj]
        if all(a is b for a, b in zip(mapped, obj)):
            return obj
        return type(obj)(mapped) if isinstance(obj, tuple) else mapped
    cls = type(obj)
    for klass in cls.__mro__:
        adapter_cls = ADAPTER_FOR.get(klass)
        if adapter_cls is not None:
            adapter = _adapters.get(id(obj))
            if adapter is None or adapter._impl is not obj:
                adapter = adapter_cls.__new__(adapter_cls)
                object.__setattr__(adapter, "_impl", obj)
                _adapters[id(obj)] = adapter
            return adapter
    if cls.__module__ == "impl.kv_events":
        return convert.to_vllm_event(obj)
    return obj


def unwrap(obj):
    """An argument on its way into impl: adapters -> their impl object, vLLM
    requests -> impl's, vLLM specs -> impl's; containers shallowly."""
    if isinstance(obj, Adapter):
        return object.__getattribute__(obj, "_impl")
    if convert.is_vllm_request(obj):
        return convert.to_impl_request(obj)
    if type(obj).__module__ == "vllm.v1.kv_cache_interface" and hasattr(obj, "block_size"):
        return convert.to_impl_spec(obj)
    if isinstance(obj, (list, tuple)) and obj and any(
            isinstance(x, (Adapter, list, tuple)) for x in obj):
        # Lists of blocks per group hold adapters one level down.
        return type(obj)(unwrap(x) for x in obj)
    return obj


class UnwrappingDict(MutableMapping):
    """An impl object's dict as a test writes into it: values stored are
    unwrapped (a test may put adapter blocks in a block table), values read
    are impl's as they are."""

    def __init__(self, target: dict) -> None:
        self._target = target

    def __getitem__(self, key):
        return self._target[key]

    def __setitem__(self, key, value) -> None:
        self._target[key] = unwrap(value)

    def __delitem__(self, key) -> None:
        del self._target[key]

    def __iter__(self):
        return iter(self._target)

    def __len__(self) -> int:
        return len(self._target)

    def __contains__(self, key) -> bool:
        return key in self._target


def forward(fn, renames: dict[str, str] | None = None):
    """A callable that unwraps arguments (renaming vLLM keywords to impl's)
    and wraps the result."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        args = tuple(unwrap(a) for a in args)
        kwargs = {(renames or {}).get(k, k): unwrap(v) for k, v in kwargs.items()}
        return wrap(fn(*args, **kwargs))

    return call


def _install_on_impl(impl, name: str, fn) -> None:
    """Put a test's replacement of a method on the impl object, called with
    impl's arguments wrapped for the test and its result unwrapped for impl."""

    def replacement(*args, **kwargs):
        return unwrap(fn(*(wrap(a) for a in args), **{k: wrap(v) for k, v in kwargs.items()}))

    try:
        setattr(impl, name, replacement)
    except AttributeError:
        raise MissingImplAPI(type(impl).__name__, name) from None


class Adapter:
    """Forwards attribute reads to `_impl`; missing names raise MissingImplAPI."""

    # vLLM keyword names -> impl's, for forwarded methods.
    _renames: dict[str, str] = {}
    # vLLM's private names (tests read or call them) -> impl's names for the
    # same state or operation.
    _PRIVATE: dict[str, str] = {}

    def __getattr__(self, name: str):
        impl = object.__getattribute__(self, "_impl")
        name = type(self)._PRIVATE.get(name, name)
        try:
            value = getattr(impl, name)
        except AttributeError:
            raise MissingImplAPI(type(impl).__name__, name) from None
        if callable(value) and not isinstance(value, type):
            return forward(value, type(self)._renames)
        return wrap(value)

    def __setattr__(self, name: str, value) -> None:
        impl = object.__getattribute__(self, "_impl")
        replaces_method = callable(value) and callable(getattr(type(impl), name, None))
        if hasattr(type(self), name) or name.startswith("_kvconform"):
            attr = getattr(type(self), name, None)
            if isinstance(attr, property):
                attr.__set__(self, value)
                return
            object.__setattr__(self, name, value)
            if replaces_method:
                # A test replacing a method on the object (a spy) must see
                # impl's own calls of it too.
                _install_on_impl(impl, name, value)
            return
        if not hasattr(impl, name):
            # impl would take the new attribute silently and never read it.
            raise MissingImplAPI(type(impl).__name__, name)
        if replaces_method:
            _install_on_impl(impl, name, value)
            return
        try:
            setattr(impl, name, unwrap(value))
        except AttributeError:
            raise MissingImplAPI(type(impl).__name__, name) from None

    def __eq__(self, other) -> bool:
        return unwrap(self) is unwrap(other) or unwrap(self) == unwrap(other)

    def __hash__(self) -> int:
        return hash(id(object.__getattribute__(self, "_impl")))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {object.__getattribute__(self, '_impl')!r}>"
