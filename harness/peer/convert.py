"""vLLM's objects to impl's and back: types and call conventions only.

Every function here copies fields from one representation to the other; none
decides an answer. A vLLM input with no impl counterpart (a spec field set to
something impl cannot express, a group role, a config knob) raises ImplLacks
naming the feature, so the test fails for that reason and no other.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from harness.core import kinds
from harness.peer import features as F
from harness.peer import fetch
from harness.peer.lacks import Checks, ImplLacks, require
from impl import kv_cache_sizing as isizing
from impl import kv_cache_spec as ispec
from impl import request as ireq
from impl.profiles import get_profile

# The profile of the release whose tests run (run.py sets it, having checked
# the release has one); else that of the vLLM this process imports.
_VERSION = os.environ.get(fetch.PROFILE_ENV) or fetch.installed_vllm_version()
PROFILE = get_profile(_VERSION)

# -- specs --------------------------------------------------------------------------

# Not checked: fields that only label a Mamba spec (mamba_type).


def _defaults_only(spec, fields: dict[str, str]) -> None:
    """Raise ImplLacks(feature) for the fields in `fields` set to a
    non-default value (impl has no counterpart for them), after checking all."""
    with Checks() as checks:
        for name, feature in fields.items():
            checks.run(_default_only, spec, name, feature)


def _default_only(spec, name: str, feature: str) -> None:
    f = {f.name: f for f in dataclasses.fields(spec)}.get(name)
    if f is None:
        return
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    value = getattr(spec, name)
    if value != default and not (name == "tokens_per_state" and value in (1, -1)):
        raise ImplLacks(feature, f"{type(spec).__name__}.{name}={value!r}")


_ATTENTION_UNSUPPORTED = {
    "non_causal": F.NON_CAUSAL,
}


def _dtype_size(dtype) -> int:
    return dtype.itemsize


def _stride_alignment(spec) -> int | None:
    """vLLM's block_stride_alignment as bytes (impl has no kernel-block form)."""
    # Older releases' specs have no such field (0.17.1: none; impl's default).
    value = getattr(spec, "block_stride_alignment", None)
    if value is not None and not isinstance(value, int):
        raise ImplLacks(F.BLOCK_STRIDE_ALIGNMENT, f"{type(spec).__name__}."
                        f"block_stride_alignment={value!r} (in kernel blocks)")
    return value


# Fields newer releases added to the attention specs, absent from an older
# release's (0.17.1 has none of them): left out, so impl's defaults apply.
_NEWER_SPEC_FIELDS = {
    "kv_quant_mode": int, "max_tp_shards": None, "num_head_slots": None,
    "state_content_bytes": None, "tokens_per_state": None, "dcp_sharded": None,
    "page_size_padded": None,
}


def _attention_geometry(spec) -> dict:
    """The page-shaping fields every attention spec has, as impl names them."""
    out = dict(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        dtype_size=_dtype_size(spec.dtype),
        dtype_label=str(spec.dtype),
        block_stride_alignment=_stride_alignment(spec),
    )
    for name, cast in _NEWER_SPEC_FIELDS.items():
        if hasattr(spec, name):
            value = getattr(spec, name)
            out[name] = cast(value) if cast is not None else value
    return out


def _mla_labels(spec) -> dict:
    return dict(cache_dtype_str=spec.cache_dtype_str, alignment=spec.alignment,
                model_version=spec.model_version)


# vLLM spec kinds impl serves with another kind's manager but whose sizing
# differs from that kind's: the sizing adapter refuses them.
SIZED_APART = ("KpoolTailSpec",)


def to_impl_spec(spec):
    """A vLLM KVCacheSpec as impl's spec (impl.kv_cache_spec)."""
    from vllm.v1 import kv_cache_interface as v

    if isinstance(spec, ispec.KVCacheSpec) or isinstance(spec, isizing.UniformTypeKVCacheSpecs):
        return spec
    name = type(spec).__name__
    if name in ("HiSparseHotSpec", "HiSparseResidentSpec"):
        return _hisparse_spec(spec)
    if name in SIZED_APART:
        # 0.31's KpoolTailSpec: a one-block ring per request, kept by a
        # manager that is the circular buffer's (KpoolTailManager adds
        # nothing): impl's circular buffer. Not for sizing (SIZED_APART).
        return ispec.CircularBufferSpec(**_attention_geometry(spec))
    if name == "EncoderOnlyAttentionSpec":
        raise ImplLacks(F.ENCODER_ONLY, name)
    if isinstance(spec, v.UniformTypeKVCacheSpecs):
        return isizing.UniformTypeKVCacheSpecs(
            spec.block_size,
            {layer: to_impl_spec(s) for layer, s in spec.kv_cache_specs.items()},
        )
    if isinstance(spec, v.MambaSpec):
        _defaults_only(spec, {
            "num_heads": F.MAMBA_TP_REPLICATED,
            "tokens_per_state": F.MAMBA_TP_REPLICATED,
            "tp_replicated": F.MAMBA_TP_REPLICATED,
        })
        # 0.29's checkpoint blocks are an older shape impl does not model.
        require(not getattr(spec, "num_prefill_checkpoint_blocks", 0)
                or bool(PROFILE.mamba_prefill_checkpoints), F.MAMBA_CHECKPOINTS,
                f"prefill checkpoint blocks under vLLM {PROFILE.name}")
        return ispec.MambaSpec(
            block_size=spec.block_size,
            shapes=tuple(tuple(s) if isinstance(s, (list, tuple)) else (s,)
                         for s in spec.shapes),
            dtype_sizes=tuple(_dtype_size(d) for d in spec.dtypes),
            page_size_padded=spec.page_size_padded,
            mamba_cache_mode=spec.mamba_cache_mode,
            num_speculative_blocks=spec.num_speculative_blocks,
            block_stride_alignment=_stride_alignment(spec),
            # (absent before the prefill checkpoints: impl's defaults)
            **{f: getattr(spec, f) for f in ("num_prefill_checkpoint_blocks",
                                             "prefill_checkpoint_alignment")
               if hasattr(spec, f)},
        )
    row = kinds.row_of_vllm_spec(spec)
    if row is None or not isinstance(spec, v.AttentionSpec):
        raise ImplLacks("KV cache spec kind", name)
    _defaults_only(spec, _ATTENTION_UNSUPPORTED)
    if row.name == "sliding_window_mla":
        _defaults_only(spec, {"bounded_replay": F.REPLAY_BOUNDARIES})
    if row.name in ("mla_attention", "sliding_window_mla"):
        # non_causal_multi_token_decode marks a drafter's layers: grouping
        # reads it (the sizing adapter passes the marked layers on by name).
        # (Before 0.28 an MLA spec inherits full attention's default V head,
        # as wide as K, which its page size never reads: no V head either.)
        require(getattr(spec, "head_size_v", None) in (0, None, spec.head_size),
                "MLA spec with a V head", name)
    common = _attention_geometry(spec)
    if row.name not in ("mla_attention", "sliding_window_mla"):
        # impl writes "V head as wide as K" as None; vLLM fills the number in.
        # (older releases' specs other than full attention have no V head field)
        head_size_v = getattr(spec, "head_size_v", spec.head_size)
        common["head_size_v"] = None if head_size_v == spec.head_size else head_size_v
    return _same_fields(_impl_class(row, spec), spec, common)


def _impl_class(row, spec) -> type:
    """impl's class of `spec`: its own namesake where impl has one below the
    row's class (an MLA spec's hidden-state cache), else the row's."""
    own = getattr(ispec, type(spec).__name__, None)
    if isinstance(own, type) and issubclass(own, row.impl_spec):
        return own
    return row.impl_spec


def _same_fields(cls: type, spec, common: dict):
    """`cls` from `common` and every other field of vLLM's spec that impl's
    dataclass has under the same name (enums by their value)."""
    values = dict(common)
    for f in dataclasses.fields(cls):
        if f.name in values or not hasattr(spec, f.name) or f.name == "head_size_v":
            continue
        value = getattr(spec, f.name)
        values[f.name] = getattr(value, "value", value)
    return cls(**values)


def _hisparse_spec(spec):
    from impl.hisparse import specs as hspecs

    _defaults_only(spec, {"block_stride_alignment": F.BLOCK_STRIDE_ALIGNMENT,
                          "dcp_sharded": F.DCP_UNSHARDED})
    if type(spec).__name__ == "HiSparseHotSpec":
        return hspecs.HiSparseHotSpec(block_size=spec.block_size, page_size=spec.page_size,
                                      blocks_per_request=spec.blocks_per_request)
    return hspecs.HiSparseResidentSpec(block_size=spec.block_size, page_size=spec.page_size)


def to_impl_role(role):
    """vLLM's group role as impl's (None for an ordinary group)."""
    if role is None or role.value == ispec.KVCacheGroupRole.DEFAULT.value:
        return None
    return ispec.KVCacheGroupRole(role.value)


def to_impl_group(group):
    with Checks() as checks:
        spec = checks.run(to_impl_spec, group.kv_cache_spec)
    # Older releases' groups have no role or flags (impl's defaults then).
    return ispec.KVCacheGroupSpec(tuple(group.layer_names), spec,
                                  to_impl_role(getattr(group, "role", None)),
                                  getattr(group, "host_resident", False),
                                  is_eagle_group=getattr(group, "is_eagle_group", False),
                                  enable_kv_transfer=getattr(group, "enable_kv_transfer", True))


def to_impl_config(config) -> ispec.KVCacheConfig:
    """A vLLM KVCacheConfig as impl's (the groups and num_blocks; the tensor
    plan is the sizing's output, not the manager's input)."""
    with Checks() as checks:
        # Older releases' configs lack these fields (their defaults then).
        checks.require(getattr(config, "cache_hit_alignment_tokens", None) is None,
                       F.CACHE_HIT_ALIGNMENT)
        replicas = getattr(config, "kv_tp_replicas", 1)
        checks.require(replicas == 1, F.TP_REPLICAS, f"kv_tp_replicas={replicas}")
        groups = tuple(checks.run(to_impl_group, g) for g in config.kv_cache_groups)
    return ispec.KVCacheConfig(
        num_blocks=config.num_blocks, kv_cache_groups=groups,
        prefix_cache_retention_interval=_retention_interval(config),
        hisparse_host_num_blocks=getattr(config, "hisparse_host_num_blocks", None),
        # vLLM's config answers it by a property of its own: impl's rule here.
        needs_kv_cache_zeroing=isizing.needs_kv_cache_zeroing(groups))


def _retention_interval(config) -> int | None:
    """The retention interval where the running release takes it: its
    KVCacheConfig (0.29+), or the engine's environment (0.23-0.28, read as its
    coordinator does, when the manager is built). The profile's shape says
    which."""
    if PROFILE.prefix_cache_retention and not PROFILE.prefix_cache_retention.in_kv_cache_config:
        from vllm import envs

        return getattr(envs, "VLLM_PREFIX_CACHE_RETENTION_INTERVAL", None)
    return getattr(config, "prefix_cache_retention_interval", None)


def to_impl_specs(specs: Mapping[str, object]) -> dict[str, object]:
    return {layer: to_impl_spec(s) for layer, s in specs.items()}


# -- requests -------------------------------------------------------------------------

_STATUS = {s.name: s for s in ireq.RequestStatus}


def _lora(request) -> ireq.LoRA | None:
    lora = request.lora_request
    if not lora:
        return None
    return ireq.LoRA(name=lora.lora_name, int_id=lora.lora_int_id, path=lora.lora_path or "")


def _mm_features(request) -> tuple[ireq.MMFeature, ...]:
    out = []
    for f in request.mm_features or ():
        pos = f.mm_position
        out.append(ireq.MMFeature(identifier=f.identifier, offset=pos.offset, length=pos.length))
    return tuple(out)


def _embeds(request) -> tuple[bytes | None, int]:
    import torch

    embeds = request.prompt_embeds
    if embeds is None:
        return None, 0
    flat = embeds.detach().contiguous().cpu()
    row = flat[0].numel() * flat.element_size() if flat.shape[0] else 0
    return flat.view(torch.uint8).numpy().tobytes(), row


def to_impl_request(request) -> ireq.Request:
    """The impl Request mirroring a vLLM Request now. One impl Request per
    vLLM Request (impl caches per-request state on it, e.g. embeds digests);
    its fields are refreshed from the vLLM request on every call, and the
    block hash list is the vLLM request's own list object."""
    if isinstance(request, ireq.Request):
        return request
    mirror = getattr(request, "_kvconform_impl_request", None)
    # vLLM's Request calls its block hasher from its constructor, before it
    # has set its scheduling fields: those are copied once they exist.
    vstatus = getattr(request, "status", None)
    status = _STATUS.get(vstatus.name) if vstatus is not None else ireq.RequestStatus.WAITING
    if status is None:
        raise ImplLacks("request status", vstatus.name)
    if mirror is None:
        embeds, row = _embeds(request)
        mirror = ireq.Request(
            request_id=request.request_id,
            all_token_ids=list(request.all_token_ids),
            num_prompt_tokens=request.num_prompt_tokens,
            prompt_embeds=embeds,
            embeds_row_bytes=row,
        )
        request._kvconform_impl_request = mirror
    mirror.request_id = request.request_id
    mirror.all_token_ids = list(request.all_token_ids)
    mirror.num_prompt_tokens = request.num_prompt_tokens
    mirror.lora = _lora(request)
    mirror.cache_salt = request.cache_salt
    mirror.mm_features = _mm_features(request)
    mirror.skip_reading_prefix_cache = getattr(request, "skip_reading_prefix_cache", False)
    mirror.session_id = getattr(request, "session_id", None)
    mirror.kv_cache_report_mode = getattr(request, "kv_cache_report_mode", "incremental")
    mirror.num_computed_tokens = getattr(request, "num_computed_tokens", 0)
    mirror.num_in_flight_tokens = getattr(request, "num_in_flight_tokens", 0)
    mirror.num_preemptions = getattr(request, "num_preemptions", 0)
    mirror.status = status
    mirror.shared_prefix_boundary = getattr(request, "shared_prefix_boundary", 0)
    mirror.block_hashes = request.block_hashes
    return mirror


def is_vllm_request(obj) -> bool:
    return type(obj).__name__ == "Request" and type(obj).__module__ == "vllm.v1.request"


# -- events ---------------------------------------------------------------------------


def to_vllm_event(event):
    """impl's KV event as vLLM's event struct (the same fields)."""
    from vllm.distributed import kv_events as v

    from impl import kv_events as e

    if isinstance(event, e.BlockStored):
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        return v.BlockStored(**{k: val for k, val in fields.items()
                                if k in v.BlockStored.__struct_fields__})
    if isinstance(event, e.BlockRemoved):
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        return v.BlockRemoved(**{k: val for k, val in fields.items()
                                 if k in v.BlockRemoved.__struct_fields__})
    if isinstance(event, e.AllBlocksCleared):
        return v.AllBlocksCleared()
    return event


def to_vllm_eviction_event(event):
    """impl's block residency sample as vLLM's KVCacheEvictionEvent (the same fields)."""
    from vllm.v1.metrics.stats import KVCacheEvictionEvent

    return KVCacheEvictionEvent(**{f.name: getattr(event, f.name)
                                   for f in dataclasses.fields(event)})
