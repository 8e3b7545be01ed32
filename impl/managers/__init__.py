"""Single-type KV cache managers, one per attention kind."""

from impl.kv_cache_spec import FullAttentionSpec, KVCacheSpec
from impl.managers.base import SingleTypeKVCacheManager
from impl.managers.full_attention import FullAttentionManager

_MANAGER_FOR_SPEC: dict[type[KVCacheSpec], type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
}


def manager_class_for(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    try:
        return _MANAGER_FOR_SPEC[type(spec)]
    except KeyError:
        raise NotImplementedError(f"no manager for {type(spec).__name__}") from None
