"""Rules over a model's KV cache groups that both the coordinators and the
sizing read: whether prefix hits may end inside blocks. Below both (sizing
checks a prefix_match_unit against it before any coordinator exists);
specs/KV_CACHE_MANAGER.md §10 and §12.4.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.kv_cache_spec import KVCacheSpec, MambaSpec

# The lookup with impl's own kinds registered (impl/managers/__init__.py).
from impl.managers import manager_class_for
from impl.managers.base import SingleTypeKVCacheManager
from impl.profiles import PartialHitGating
from impl.uniform_type_spec import UniformTypeKVCacheSpecs


def partial_hash_hits_enabled(
    specs: Sequence[KVCacheSpec],
    manager_classes: Sequence[type[SingleTypeKVCacheManager]],
    hash_block_size: int,
    dcp_world_size: int,
    gating: PartialHitGating = PartialHitGating.EVERY_GROUP_FINE,
) -> bool:
    """Whether hits may end inside blocks (profile.partial_hit_gating): some
    Mamba "align" group's block is larger than the hash block (0.29+: or not
    smaller, under DCP), and (0.28+) every other cacheable group can look up
    at hash granularity or is at it."""
    any_mamba = gating is PartialHitGating.ANY_MAMBA_ALIGN

    def mamba_wider(spec) -> bool:
        if not (isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"):
            return False
        if dcp_world_size == 1:
            return spec.block_size > hash_block_size
        return not any_mamba and spec.block_size >= hash_block_size

    if not any(mamba_wider(spec) for spec in specs):
        return False
    if any_mamba:
        return True
    return all(
        not spec.prefix_cacheable or cls.supports_fine_grained_hash_lookup
        or spec.block_size * (dcp_world_size if spec.dcp_sharded else 1) == hash_block_size
        for spec, cls in zip(specs, manager_classes))


def hits_inside_blocks(specs: Sequence[KVCacheSpec | UniformTypeKVCacheSpecs],
                       hash_block_size: int, dcp_world_size: int) -> bool:
    """partial_hash_hits_enabled for groups' specs before their managers
    exist: each group's manager class is the one its spec is kept by (a
    uniform-type group's, its first layer's)."""
    layers = [s.first_spec if isinstance(s, UniformTypeKVCacheSpecs) else s for s in specs]
    return partial_hash_hits_enabled(specs, [manager_class_for(s) for s in layers],
                                     hash_block_size, dcp_world_size)
