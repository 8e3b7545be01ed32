"""The cache configuration a trace (or a test, or the fuzzer) runs the KV cache
manager with. Both backends build their manager from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from impl.hisparse.specs import HiSparseHotSpec, HiSparseResidentSpec
from impl.kv_cache_sizing import resolve_kv_cache_block_sizes
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from impl.profiles import BlockSizesRule, VersionProfile

# Attention kinds, by the name vLLM's KV events give them.
KINDS = (
    "full_attention",
    "mla_attention",
    "sink_full_attention",
    "sliding_window",
    "chunked_local_attention",
    "mamba",
    "cross_attention",
    # Sparse MLA models (DeepSeek V4): a window over MLA latents.
    "sliding_window_mla",
    # Named after their specs: events call them full_attention and unknown.
    "rswa",
    "circular_buffer",
    # HiSparse's device groups (specs/KV_CACHE_MANAGER.md §14; vLLM's events
    # call both kinds "unknown", the trace names them).
    "hisparse_resident",
    "hisparse_hot",
)
# The field each kind requires besides block_size.
KIND_FIELDS = {
    "sliding_window": "sliding_window",
    "sliding_window_mla": "sliding_window",
    "chunked_local_attention": "attention_chunk_size",
    "sink_full_attention": "sink_len",
    "rswa": "rswa_window",
    "hisparse_hot": "blocks_per_request",
}
# The profile flag a release must have for a kind (impl/profiles.py).
KIND_SINCE = {
    "sliding_window_mla": "sparse_mla_groups",
    "rswa": "rswa_groups",
    "circular_buffer": "circular_buffer_groups",
}


# Group fields only a Mamba group may set, with their unset value.
_MAMBA_FIELDS = {"mamba_cache_mode": None, "num_speculative_blocks": 0,
                 "num_prefill_checkpoint_blocks": 0, "prefill_checkpoint_alignment": None}
# HiSparse group roles a full-attention group may play (the source group's
# blocks are host blocks).
ROLES = ("hisparse_source", "hisparse_indexer")
HISPARSE_KINDS = ("hisparse_resident", "hisparse_hot")


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

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown attention kind '{self.kind}' (known: {', '.join(KINDS)})")
        needed = KIND_FIELDS.get(self.kind)
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"a {self.kind} group needs {needed}")
        for name in KIND_FIELDS.values():
            if name != needed and getattr(self, name) is not None:
                raise ValueError(f"{name} does not apply to a {self.kind} group")
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
        if not self.dcp_sharded and self.kind in ("mamba", *HISPARSE_KINDS):
            raise ValueError(f"dcp_sharded does not apply to a {self.kind} group (its "
                             "blocks are never sharded)")

    def refused_by(self, profile: VersionProfile) -> str | None:
        """Why the release of `profile` has no such group (None: it has)."""
        flag = KIND_SINCE.get(self.kind)
        if flag is not None and not getattr(profile, flag):
            return f"vLLM {profile.name} has no {self.kind} groups"
        if self.cache_role != "sparse" and not profile.sparse_mla_groups:
            return f"vLLM {profile.name} has no MLA cache roles (cache_role={self.cache_role})"
        return None

    @property
    def hisparse(self) -> bool:
        """A group of a HiSparse model's own (a role or a HiSparse kind)."""
        return self.role is not None or self.kind in HISPARSE_KINDS


def hisparse_page_size(block_size: int) -> int:
    """Bytes of a HiSparse page: the manager never reads it (the one float32
    head of the other groups' specs)."""
    return block_size * 4


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
        bs = g.block_size
        shard = {} if g.dcp_sharded else {"dcp_sharded": False}
        if g.kind == "full_attention":
            return FullAttentionSpec(bs, **shard)
        if g.kind == "mla_attention":
            return MLAAttentionSpec(bs, cache_role=g.cache_role, **shard)
        if g.kind == "sliding_window_mla":
            return SlidingWindowMLASpec(bs, sliding_window=g.sliding_window, **shard)
        if g.kind == "rswa":
            return RSWASpec(bs, rswa_window=g.rswa_window, **shard)
        if g.kind == "circular_buffer":
            return CircularBufferSpec(bs, **shard)
        if g.kind == "sink_full_attention":
            return SinkFullAttentionSpec(bs, sink_len=g.sink_len, **shard)
        if g.kind == "sliding_window":
            return SlidingWindowSpec(bs, sliding_window=g.sliding_window, **shard)
        if g.kind == "chunked_local_attention":
            return ChunkedLocalAttentionSpec(bs, attention_chunk_size=g.attention_chunk_size,
                                             **shard)
        if g.kind == "cross_attention":
            return CrossAttentionSpec(bs, **shard)
        if g.kind == "hisparse_resident":
            return HiSparseResidentSpec(bs, page_size=hisparse_page_size(bs))
        if g.kind == "hisparse_hot":
            return HiSparseHotSpec(bs, page_size=hisparse_page_size(bs),
                                   blocks_per_request=g.blocks_per_request)
        return MambaSpec(bs, shapes=((1,),), dtype_sizes=(4,),
                         mamba_cache_mode=self.mamba_cache_mode(g),
                         num_speculative_blocks=g.num_speculative_blocks,
                         num_prefill_checkpoint_blocks=g.num_prefill_checkpoint_blocks,
                         prefill_checkpoint_alignment=g.prefill_checkpoint_alignment)

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
