"""The cache configuration a trace (or a test, or the fuzzer) runs the KV cache
manager with. Both backends build their manager from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from impl.kv_cache_sizing import resolve_kv_cache_block_sizes
from impl.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
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
)
# The field each kind requires besides block_size.
KIND_FIELDS = {
    "sliding_window": "sliding_window",
    "chunked_local_attention": "attention_chunk_size",
    "sink_full_attention": "sink_len",
}


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
        if self.mamba_cache_mode is not None and self.kind != "mamba":
            raise ValueError(f"mamba_cache_mode does not apply to a {self.kind} group")
        if not self.dcp_sharded and self.kind == "mamba":
            raise ValueError("dcp_sharded does not apply to a mamba group (its state is "
                             "never sharded)")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    num_blocks: int
    groups: tuple[GroupConfig, ...] = field(default_factory=lambda: (GroupConfig(16),))
    hash_algo: str = "sha256"
    # PYTHONHASHSEED for the NONE_HASH seed; None reproduces vLLM's unseeded
    # behaviour, which for some versions/algorithms is random (not replayable).
    hash_seed: str | None = "0"
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
            return MLAAttentionSpec(bs, **shard)
        if g.kind == "sink_full_attention":
            return SinkFullAttentionSpec(bs, sink_len=g.sink_len, **shard)
        if g.kind == "sliding_window":
            return SlidingWindowSpec(bs, sliding_window=g.sliding_window, **shard)
        if g.kind == "chunked_local_attention":
            return ChunkedLocalAttentionSpec(bs, attention_chunk_size=g.attention_chunk_size,
                                             **shard)
        if g.kind == "cross_attention":
            return CrossAttentionSpec(bs, **shard)
        return MambaSpec(bs, shapes=((1,),), dtype_sizes=(4,),
                         mamba_cache_mode=self.mamba_cache_mode(g))

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
            self.dcp_world_size,
        )
