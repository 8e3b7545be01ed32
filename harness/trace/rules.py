"""Configs and calls vLLM rejects, found before any backend runs.

The schema says what a trace may contain; these rules say what vLLM's KV cache
code refuses (it raises, or asserts) although the schema allows it, so that a
trace asking for it is bad input, one line naming the field, on every backend
alike: impl, being another implementation, might well accept it, and a replay
on impl alone would then call the trace conformant.

Each rule names the check in vLLM it mirrors (the same in 0.17 and 0.32;
anything that differs between releases is a profile field, impl/profiles.py).
Rules that need the run's state (a lookup for a running request, cache_blocks
beyond the blocks a request holds) are checked by the backends' shared
request bookkeeping (harness/backends/base.py); whatever no rule foresees is
still caught around each backend call (harness/lockstep.run_event) and
reported the same way.

`TraceRules(path, header)` checks the header's cache config at once and then
each event (`check(line, event)`), raising TraceError.
"""

from __future__ import annotations

from harness.core.trace_error import TraceError
from harness.trace.codec import TraceHeader

REJECTS = "vLLM rejects this: "
# Kinds whose hit search asserts DCP and PCP are off (the find_longest_cache_hit
# of vLLM's SlidingWindowManager, ChunkedLocalAttentionManager, MambaManager).
_NO_CONTEXT_PARALLEL = ("sliding_window", "chunked_local_attention", "mamba")


class TraceRules:
    __slots__ = ("path", "lookup_refusal", "no_lookup_reads")

    def __init__(self, path: str, header: TraceHeader) -> None:
        self.path = path
        profile = _profile(header.vllm_version)
        cache = header.cache
        self._check_cache(cache, profile)
        # Every lookup of a request that reads the prefix cache is refused
        # alike: (field, message), or None.
        self.lookup_refusal = _lookup_refusal(cache, profile) if cache.enable_caching else None
        # Requests whose lookups skip the cache (skip_reading_prefix_cache):
        # vLLM answers them without searching.
        self.no_lookup_reads: set[str] = set()

    def _fail(self, line: int, field: str, message: str):
        raise TraceError(self.path, line, field, REJECTS + message)

    def _check_cache(self, cache, profile) -> None:
        for i, g in enumerate(cache.groups):
            if g.kind == "sink_full_attention":
                # SinkFullAttentionManager.__init__ asserts the sink fills whole
                # blocks (of its DCP-scaled size).
                size = g.block_size * _dcp(cache, g)
                if g.sink_len % size:
                    self._fail(1, f"cache.groups[{i}].sink_len",
                               f"sink_len {g.sink_len} is not a multiple of the block size "
                               f"{size} (the sink must fill whole blocks)")
        if profile is not None and cache.prefix_match_unit is not None:
            # The block sizes vLLM resolves when it builds the KV cache config
            # (impl's rule for the trace's release) refuse a prefix_match_unit
            # that does not divide the groups' block sizes, or that differs
            # from a single group's block size.
            try:
                cache.block_sizes(profile)
            except ValueError as e:
                self._fail(1, "cache.prefix_match_unit", str(e))

    def check(self, line: int, event) -> None:
        """One event (harness/core/events.py) against the rules that need no
        backend state."""
        kind = event.kind
        if kind == "add_request":
            lora = event.lora
            if lora is not None and not lora.path:
                # LoRARequest's constructor asserts a non-empty lora_path.
                self._fail(line, "lora.path", "a LoRA request needs its adapter's path")
            if event.skip_reading_prefix_cache:
                self.no_lookup_reads.add(event.req)
        elif kind == "lookup":
            if self.lookup_refusal is not None and event.req not in self.no_lookup_reads:
                self._fail(line, *self.lookup_refusal)
        elif kind == "free" and self.no_lookup_reads:
            self.no_lookup_reads.discard(event.req)


def _profile(version: str):
    from impl.profiles import UnsupportedVersion, get_profile

    try:
        return get_profile(version)
    except UnsupportedVersion:
        return None  # the reader refuses the version itself (exit 3)


def _dcp(cache, g) -> int:
    return cache.dcp_world_size if cache.kv_cache_spec(g).dcp_sharded else 1


def _lookup_refusal(cache, profile) -> tuple[str, str] | None:
    """Why every prefix-cache lookup under `cache` raises in vLLM, if it does."""
    for i, g in enumerate(cache.groups):
        where = f"cache.groups[{i}].kind"
        if g.kind == "cross_attention":
            # CrossAttentionManager.find_longest_cache_hit raises
            # NotImplementedError (encoder-decoder models run without caching).
            return where, ("cross-attention groups have no prefix caching: every lookup "
                           "raises with enable_caching on")
        if g.kind in _NO_CONTEXT_PARALLEL and (
                cache.dcp_world_size > 1 or cache.pcp_world_size > 1) and \
                cache.kv_cache_spec(g).dcp_sharded:
            return where, (f"{g.kind} groups do not support decode/prefill context "
                           "parallelism: every lookup asserts dcp_world_size and "
                           "pcp_world_size are 1")
    if profile is None or len(cache.groups) < 2:
        return None
    # ChunkedLocalAttentionManager.find_longest_cache_hit asserts its block
    # size is the hit alignment: the hash block size with hits inside blocks,
    # the scheduler block size (the groups' LCM) otherwise.
    try:
        scheduler_block, hash_block = cache.block_sizes(profile)
    except ValueError:
        return None  # refused when the backends build the config
    alignment = hash_block if cache.fine_grained_hits(profile) else scheduler_block
    for i, g in enumerate(cache.groups):
        if g.kind == "chunked_local_attention" and g.block_size != alignment:
            return (f"cache.groups[{i}].block_size",
                    f"a chunked local attention group of block size {g.block_size} among "
                    f"groups that align hits to {alignment} tokens: every lookup asserts "
                    "they are equal (mixed block sizes)")
    return None


def random_none_hash(header: TraceHeader, profile) -> bool:
    """Whether the trace's NONE_HASH was drawn at random by its vLLM and not
    recorded: no replay can reproduce its block hashes (vLLM's
    init_none_hash without PYTHONHASHSEED, as the profile says)."""
    from impl.block_hash import CRYPTOGRAPHIC
    from impl.profiles import NoneHashSeed

    cache = header.cache
    if cache.hash_seed is not None or cache.none_hash is not None or profile is None:
        return False
    if profile.none_hash_seed is NoneHashSeed.SEED_OR_FIXED_FOR_CRYPTO:
        return cache.hash_algo not in CRYPTOGRAPHIC
    return True
