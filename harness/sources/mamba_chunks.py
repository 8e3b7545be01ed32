"""Where vLLM's scheduler ends a prefill chunk of a model with a Mamba group
in "align" mode (Scheduler._mamba_block_aligned_split): the seeded workloads
(harness/sources/workload.py) and the fuzz driver (harness/fuzz/driver.py) make their
calls the way that scheduler would.

A Mamba "align" group caches a state only where a chunk ends, so chunks end on
block boundaries, at the last cacheable boundary and, with hits inside blocks,
at the prompt's last hash boundary. Left out: prefill checkpoint blocks, EAGLE,
shared-prefix junctions.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.cache_config import CacheConfig
from impl.profiles import PromptTailBoundary, VersionProfile


@dataclass(frozen=True, slots=True)
class MambaChunking:
    block_size: int  # the Mamba group's
    hash_block_size: int
    # Hits may end inside blocks, so the prompt's tail boundary is a stop too.
    partial_hits: bool
    rule: PromptTailBoundary

    @classmethod
    def of(cls, config: CacheConfig, profile: VersionProfile) -> MambaChunking | None:
        """The chunking of a config, None when it has no Mamba "align" group."""
        block_size = next((g.block_size for g in config.groups if g.kind == "mamba"
                           and config.mamba_cache_mode(g) == "align"), None)
        if block_size is None:
            return None
        scheduler_block_size, hash_block_size = config.block_sizes(profile)
        partial = (hash_block_size < scheduler_block_size
                   and config.fine_grained_hits(profile))
        return cls(block_size, hash_block_size, partial, profile.prompt_tail_boundary)

    def split(self, start: int, num_new: int, num_prompt: int, num_tokens: int) -> int:
        """How many of `num_new` tokens from `start` the chunk takes."""
        prefill_end = max(num_prompt, num_tokens - 1)
        if start >= prefill_end:
            return num_new
        bs, rule = self.block_size, self.rule
        last_cache_position = rule.position(num_tokens, bs)
        end = start + num_new
        if end < prefill_end:
            end = end // bs * bs
        tail = rule.position(num_prompt, self.hash_block_size) if self.partial_hits else 0
        stops = (
            (start // bs + 1) * bs if start % bs else 0,
            last_cache_position,
            tail if last_cache_position < tail < num_prompt else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)
