"""Which single-type manager keeps which spec: one lookup, filled by
`register_manager` (impl's own kinds in `impl/managers/__init__.py`, a
platform plugin's kind wherever the plugin registers it)."""

from __future__ import annotations

from impl.kv_cache_spec import KVCacheGroupRole, KVCacheSpec
from impl.managers.base import SingleTypeKVCacheManager

# Looked up along the spec's class hierarchy, most specific first: an MLA
# spec is a FullAttentionSpec and is kept like one.
_BY_SPEC: dict[type, type[SingleTypeKVCacheManager]] = {}
# A group's role, where it picks the manager before the spec does.
_BY_ROLE: dict[KVCacheGroupRole, type[SingleTypeKVCacheManager]] = {}


def register_manager(spec_class: type[KVCacheSpec],
                     manager_class: type[SingleTypeKVCacheManager]) -> None:
    """Keep every spec of `spec_class` (and its subclasses without a row of
    their own) with `manager_class`. Registering a class twice with another
    manager is refused: two rows for one kind would make the order of imports
    decide which manager runs."""
    known = _BY_SPEC.get(spec_class)
    if known is not None and known is not manager_class:
        raise ValueError(f"{spec_class.__name__} is kept by {known.__name__} already, "
                         f"not {manager_class.__name__}")
    _BY_SPEC[spec_class] = manager_class


def register_role_manager(role: KVCacheGroupRole,
                          manager_class: type[SingleTypeKVCacheManager]) -> None:
    _BY_ROLE[role] = manager_class


def manager_class_for(spec: KVCacheSpec, role: KVCacheGroupRole | None = None
                      ) -> type[SingleTypeKVCacheManager]:
    if role in _BY_ROLE:
        return _BY_ROLE[role]
    for kind in type(spec).__mro__:
        if kind in _BY_SPEC:
            return _BY_SPEC[kind]
    raise NotImplementedError(f"no manager keeps a {type(spec).__name__}")
