"""The cache configuration a trace (or a test, or the fuzzer) runs the KV cache
manager with. Both backends build their manager from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.core import kinds as K
from impl.kv_cache_sizing import resolve_kv_cache_block_sizes
from impl.kv_cache_spec import KVCacheGroupRole, KVCacheSpec
from impl.profiles import BlockSizesRule, VersionProfile

# Group fields only a Mamba group may set, with their unset value.
_MAMBA_FIELDS = {"mamba_cache_mode": None, "num_speculative_blocks": 0,
                 "num_prefill_checkpoint_blocks": 0, "prefill_checkpoint_alignment": None}
# HiSparse group roles a full-attention group may play (the source group's
# blocks are host blocks).
ROLES = ("hisparse_source", "hisparse_indexer")


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One KV cache group: its attention kind, block size and kind parameters."""

    block_size: int
    kind: str = "full_attention"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    sink_len: int | None = None
    # "none" or "align"; None: as vLLM picks it ("align" with prefix caching).
    mamba_cache_mode: str | None = None
    rswa_window: int | None = None
    # mla_attention: "sparse" (the attention's own cache) or "indexer" (a
    # sparse-attention indexer's keys: a group apart, managed the same).
    cache_role: str = "sparse"
    # Mamba: scratch blocks for draft tokens' states (speculative decoding);
    # prefill checkpoint blocks ("align") and the token step of their export.
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    blocks_per_request: int | None = None  # hisparse_hot groups: the region's size
    role: str | None = None  # full_attention groups of a HiSparse model: ROLES
    # The group holds an EAGLE / MTP drafter's layers (vLLM's is_eagle_group).
    is_eagle_group: bool = False
    # False: attention KV kept whole on every DCP rank (a replicated draft),
    # so a block spans only block_size tokens under DCP.
    dcp_sharded: bool = True
    # The fields of a kind registered at run time (harness/core/kinds.py
    # `register`) that GroupConfig has no attribute for: (name, value) pairs,
    # sorted; a trace writes them as the group's own fields.
    params: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        row = K.kind_row(self.kind)  # ValueError naming the known kinds
        for name in row.fields:
            if self.value(name) is None:
                raise ValueError(f"a {self.kind} group needs {name}")
        for name in K.all_kind_fields():
            if name not in row.fields and self.value(name) is not None:
                raise ValueError(f"{name} does not apply to a {self.kind} group")
        for name, _ in self.params:
            if name in GroupConfig.__slots__ or name not in K.all_kind_fields():
                raise ValueError(f"params: {name} is no registered kind's field")
        if self.kind != "mamba":
            for name, unset in _MAMBA_FIELDS.items():
                if getattr(self, name) != unset:
                    raise ValueError(f"{name} does not apply to a {self.kind} group")
        if self.cache_role != "sparse" and self.kind != "mla_attention":
            raise ValueError(f"cache_role does not apply to a {self.kind} group")
        if self.cache_role not in ("sparse", "indexer"):
            raise ValueError(f"cache_role '{self.cache_role}' is not sparse or indexer")
        if self.role is not None and (self.role not in ROLES or self.kind != "full_attention"):
            raise ValueError(f"role {self.role!r} does not apply to a {self.kind} group "
                             f"(full_attention groups may be {' or '.join(ROLES)})")
        if not self.dcp_sharded and not row.sharded:
            raise ValueError(f"dcp_sharded does not apply to a {self.kind} group (its "
                             "blocks are never sharded)")

    @classmethod
    def make(cls, block_size: int, kind: str = "full_attention", **fields) -> GroupConfig:
        """A group from its fields by name, a registered kind's among them
        (those go to params)."""
        own = {k: v for k, v in fields.items() if k in cls.__slots__}
        params = tuple(sorted((k, v) for k, v in fields.items() if k not in cls.__slots__))
        return cls(block_size, kind, **own, **({"params": params} if params else {}))

    def value(self, name: str):
        """A kind field's value: GroupConfig's own, or a registered kind's
        (params); None where unset."""
        if name in GroupConfig.__slots__:
            return getattr(self, name)
        return dict(self.params).get(name)

    def refused_by(self, profile: VersionProfile) -> str | None:
        """Why the release of `profile` has no such group (None: it has)."""
        flag = K.kind_row(self.kind).since
        if flag is not None and not getattr(profile, flag):
            return f"vLLM {profile.name} has no {self.kind} groups"
        if self.cache_role != "sparse" and not profile.sparse_mla_groups:
            return f"vLLM {profile.name} has no MLA cache roles (cache_role={self.cache_role})"
        return None

    @property
    def hisparse(self) -> bool:
        """A group of a HiSparse model's own (a role or a HiSparse kind)."""
        return self.role is not None or K.kind_row(self.kind).hisparse


@dataclass(frozen=True, slots=True)
class CacheConfig:
    num_blocks: int
    groups: tuple[GroupConfig, ...] = field(default_factory=lambda: (GroupConfig(16),))
    hash_algo: str = "sha256"
    # PYTHONHASHSEED for the NONE_HASH seed; None reproduces vLLM's unseeded
    # behaviour, which for some versions/algorithms is random (not replayable).
    hash_seed: str | None = "0"
    # The NONE_HASH (hex) the capture's vLLM used, when recorded: replays use
    # it rather than deriving one from hash_seed (an unseeded vLLM may have
    # drawn it at random).
    none_hash: str | None = None
    enable_caching: bool = True
    max_model_len: int = 1 << 16
    log_stats: bool = True
    enable_kv_cache_events: bool = True
    # KV events publish hashes as 64-bit ints (vLLM's default) or raw bytes.
    events_use_int_hashes: bool = True
    watermark: float = 0.0
    # vLLM's prefix_match_unit: hash every this many tokens (hybrid models
    # only; None: the GCD of the group block sizes).
    prefix_match_unit: int | None = None
    # Decode / prefill context parallelism world sizes.
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    # Tokens scheduled but not yet settled (caps sliding-window admission);
    # None: max_model_len, as vLLM's KVCacheManager defaults it.
    max_in_flight_tokens: int | None = None
    # Tokens after a block its hash also covers (0.33's lookahead hashing).
    num_hash_lookahead_tokens: int = 0
    # Sparse sliding-window / Mamba checkpoints (KVCacheConfig's; None:
    # dense, as a KVCacheConfig built without it; vLLM's engines default to 0).
    prefix_cache_retention_interval: int | None = None
    # Mamba "align" states at shared-prefix junctions (EAGLE models only).
    enable_mamba_shared_prefix_checkpoint: bool = False
    # Blocks of HiSparse's host pool (null block included): required with a
    # hisparse_source group, refused without one.
    hisparse_host_num_blocks: int | None = None

    def __post_init__(self) -> None:
        has_source = any(g.role == "hisparse_source" for g in self.groups)
        if has_source != (self.hisparse_host_num_blocks is not None):
            raise ValueError("hisparse_host_num_blocks goes with a hisparse_source group "
                             "(both or neither)")

    @property
    def hisparse(self) -> bool:
        """Whether the model has HiSparse groups (specs/KV_CACHE_MANAGER.md §14)."""
        return any(g.hisparse for g in self.groups)
    # Speculative decoding with an EAGLE / MTP drafter: prefix hits of the
    # draft groups (every group when none is flagged) drop their last unit.
    use_eagle: bool = False
    # Multi-module MTP: tokens after a chunk's end the drafter writes again.
    num_prefill_lookahead: int = 0

    @property
    def block_size(self) -> int:
        """The block size of the first group."""
        return self.groups[0].block_size

    def mamba_cache_mode(self, group: GroupConfig) -> str:
        if group.mamba_cache_mode is not None:
            return group.mamba_cache_mode
        return "align" if self.enable_caching else "none"

    def kv_cache_specs(self) -> tuple[KVCacheSpec, ...]:
        """impl's spec of every group (tiny heads: the manager never reads them)."""
        return tuple(self.kv_cache_spec(g) for g in self.groups)

    def kv_cache_spec(self, g: GroupConfig) -> KVCacheSpec:
        """Built from the kinds table (harness/core/kinds.py)."""
        return K.impl_spec(g, self)

    @property
    def reports_shared_prefix_boundary(self) -> bool:
        """Whether lookup answers carry the shared-prefix boundary: only in
        traces that use a knob reading it (sparse retention, Mamba prefill
        checkpoints, junction checkpoints), so traces recorded before it stay
        as they are."""
        return (self.prefix_cache_retention_interval is not None
                or self.enable_mamba_shared_prefix_checkpoint
                or any(g.num_prefill_checkpoint_blocks for g in self.groups))

    def group_role(self, g: GroupConfig) -> KVCacheGroupRole | None:
        return None if g.role is None else KVCacheGroupRole(g.role)

    @property
    def scheduler_block_size(self) -> int:
        """As the installed reference (0.32) resolves it; see block_sizes."""
        return self.block_sizes()[0]

    @property
    def hash_block_size(self) -> int:
        return self.block_sizes()[1]

    def block_sizes(self, profile: VersionProfile | None = None) -> tuple[int, int]:
        """(scheduler_block_size, hash_block_size) as `profile`'s vLLM
        resolves them (the 0.32 rule when no profile is given)."""
        rule = BlockSizesRule.LCM_GCD if profile is None else profile.block_sizes_rule
        return resolve_kv_cache_block_sizes(
            self.kv_cache_specs(), self.enable_caching, self.dcp_world_size,
            self.prefix_match_unit, rule=rule, pcp_world_size=self.pcp_world_size,
        )

    def fine_grained_hits(self, profile) -> bool:
        """Whether prefix hits may end inside blocks (0.32 hybrid models with a
        Mamba "align" group larger than the hash block)."""
        if not (self.enable_caching and len(self.groups) > 1 and profile.partial_block_hits):
            return False
        from impl.coordinator import partial_hash_hits_enabled
        from impl.managers import manager_class_for

        specs = self.kv_cache_specs()
        return partial_hash_hits_enabled(
            specs, [manager_class_for(s) for s in specs], self.block_sizes(profile)[1],
            self.dcp_world_size, profile.partial_hit_gating,
        )
