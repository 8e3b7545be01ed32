"""Cache configs the fuzzer draws, one template per attention kind or hybrid.

Every template is a configuration vLLM itself would build: cross attention
only with prefix caching off (encoder-decoder models disable it), Mamba in
"align" mode with caching and "none" mode without, chunked local attention
only next to groups of its own block size, context parallelism only for the
kinds that support it, Mamba prefill checkpoints in "align" mode only, a
retention interval on a multiple of the scheduler block size.

A kind's own template comes from its row of the kinds table
(harness/core/kinds.py); the hybrids, and the kinds' templates that must be
drawn beside other groups, are written here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from functools import cache

from harness.core import kinds
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.kinds import draw_window

Groups = tuple[tuple[GroupConfig, ...], dict]
# Draws a template's groups and the other CacheConfig fields it sets
# (rng, block size, caching).
Draw = Callable[[random.Random, int, bool], Groups]

# Templates drawing EAGLE / MTP drafters: only for profiles that model EAGLE
# (profile.eagle_drop_groups; 0.17 does not).
EAGLE_TEMPLATES = ("eagle", "hybrid_eagle", "context_parallel_draft", "mamba_eagle")


def _alone(row: kinds.KindRow) -> Draw:
    """A template of one kind: one group, its fields drawn as its row says."""
    def draw(rng: random.Random, bs: int, caching: bool) -> Groups:
        fields = {f: d(rng, bs) for f, d in zip(row.fields, row.draws, strict=True)}
        return (GroupConfig.make(bs, row.name, **fields),), {}
    return draw


def _cross_attention(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Encoder-decoder models disable prefix caching.
    return (GroupConfig(bs), GroupConfig(rng.choice((bs, 2 * bs)), "cross_attention")), {
        "enable_caching": False}


def _context_parallel(rng: random.Random, bs: int, caching: bool) -> Groups:
    group = rng.choice((GroupConfig(bs), GroupConfig(bs, "mla_attention")))
    return (group,), {"dcp_world_size": rng.choice((2, 4)),
                      "pcp_world_size": rng.choice((1, 1, 2))}


def _hybrid_sliding_window(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Gemma-like: full attention next to one or more window groups, at the
    # same, half or double the block size.
    sw_bs = rng.choice((bs, bs, 2 * bs, max(bs // 2, 1)))
    sw = GroupConfig(sw_bs, "sliding_window", sliding_window=draw_window(rng, sw_bs))
    groups = [GroupConfig(bs), sw] if rng.random() < 0.5 else [sw, GroupConfig(bs)]
    if rng.random() < 0.3:
        groups.append(sw)  # an equal group: looked up together
    return tuple(groups), {}


def _hybrid_chunked_local(rng: random.Random, bs: int, caching: bool) -> Groups:
    chunk = rng.choice((bs, 2 * bs, 4 * bs))
    return (GroupConfig(bs), GroupConfig(bs, "chunked_local_attention",
                                         attention_chunk_size=chunk)), {}


def _hybrid_mamba(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Jamba / Qwen3-Next-like: attention and Mamba at the cache block size;
    # a finer prefix_match_unit turns on hits inside blocks.
    extra = {}
    if caching and bs > 1 and rng.random() < 0.6:
        extra["prefix_match_unit"] = rng.choice([d for d in (1, 2, 4, 8) if d < bs
                                                 and bs % d == 0])
    groups = [GroupConfig(bs), GroupConfig(bs, "mamba")]
    if rng.random() < 0.3:
        groups.insert(1, GroupConfig(bs, "mamba"))
    return tuple(groups), extra


def _hybrid_mixed(rng: random.Random, bs: int, caching: bool) -> Groups:
    sw = GroupConfig(bs, "sliding_window", sliding_window=draw_window(rng, bs))
    return (GroupConfig(bs), sw, GroupConfig(bs, "mamba")), {}


def _rswa(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Image + text prompts read whole, decoded tokens a window back.
    rswa = GroupConfig(bs, "rswa", rswa_window=kinds.kind_row("rswa").draws[0](rng, bs))
    if rng.random() < 0.4:
        return (rswa,), {}
    return ((GroupConfig(bs), rswa) if rng.random() < 0.5 else (rswa, GroupConfig(bs))), {}


def _sparse_mla(rng: random.Random, bs: int, caching: bool) -> Groups:
    # DeepSeek V4-like: the MLA cache, its indexer's keys (a group of its
    # own role), a window over MLA latents, sometimes a K-pool tail ring.
    mla = GroupConfig(bs, "mla_attention")
    indexer = GroupConfig(bs, "mla_attention", cache_role="indexer")
    sw_bs = rng.choice((bs, bs, 2 * bs))
    window = GroupConfig(sw_bs, "sliding_window_mla", sliding_window=draw_window(rng, sw_bs))
    groups = [mla, indexer, window]
    if rng.random() < 0.3:
        groups.append(GroupConfig(bs, "circular_buffer"))
    return tuple(groups), {}


def _mamba_speculative(rng: random.Random, bs: int, caching: bool) -> Groups:
    # MTP / EAGLE models: scratch blocks for the draft tokens' states,
    # alone or next to attention, "align" with caching, "none" without.
    mamba = GroupConfig(bs, "mamba", num_speculative_blocks=rng.choice((1, 2, 3)))
    if rng.random() < 0.3:
        return (mamba,), {}
    return (GroupConfig(bs), mamba), _fine_hash(rng, bs, caching)


def _mamba_checkpoints(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Qwen3-Next-like with a backend that exports a state inside a prefill
    # chunk; "align" needs prefix caching.
    mamba = GroupConfig(bs, "mamba", num_prefill_checkpoint_blocks=1,
                        prefill_checkpoint_alignment=rng.choice((1, 1, 2, 4)),
                        num_speculative_blocks=rng.choice((0, 0, 1, 2)))
    return (GroupConfig(bs), mamba), {"enable_caching": True, **_fine_hash(rng, bs, True)}


def _retention(rng: random.Random, bs: int, caching: bool) -> Groups:
    # Sparse checkpoints (vLLM's engine default is 0): sliding-window
    # models, alone or Gemma-like, and Mamba hybrids, some with
    # checkpoint blocks.
    shape = rng.choice(("sliding_window", "hybrid_sliding_window", "hybrid_mamba",
                        "mamba_checkpoints"))
    groups, extra = draw_groups(shape, rng, bs, caching)
    return groups, {**extra, "enable_caching": True}


def _eagle(name: str) -> Draw:
    return lambda rng, bs, caching: draw_eagle_groups(name, rng, bs, caching)


def _hand_templates() -> dict[str, tuple[Draw, tuple[str, ...]]]:
    """The templates written here: a kind's own ("own" in its row; the row's
    profile flag gates it) and the hybrids, each with the profile flags
    (impl/profiles.py) its groups need beyond its kinds' own."""
    return {
        "cross_attention": (_cross_attention, ()),
        "circular_buffer": (lambda rng, bs, caching: _draw_circular_buffer(rng, bs, caching),
                            ()),
        "rswa": (_rswa, ()),
        "context_parallel": (_context_parallel, ()),
        "hybrid_sliding_window": (_hybrid_sliding_window, ()),
        "hybrid_chunked_local": (_hybrid_chunked_local, ()),
        "hybrid_mamba": (_hybrid_mamba, ()),
        "hybrid_mixed": (_hybrid_mixed, ()),
        "sparse_mla": (_sparse_mla, ("sparse_mla_groups", "circular_buffer_groups")),
        "mamba_speculative": (_mamba_speculative, ()),
        "mamba_checkpoints": (_mamba_checkpoints, ("mamba_prefill_checkpoints",)),
        # Its Mamba groups reserve prefill checkpoint blocks too (0.30+).
        "retention": (_retention, ("prefix_cache_retention", "mamba_prefill_checkpoints")),
        "hisparse": (lambda rng, bs, caching: _hisparse_groups(rng, bs), ("hisparse",)),
        # EAGLE / MTP drafters: only profiles that model EAGLE (0.17 does not).
        **{t: (_eagle(t), ("eagle_drop_groups",)) for t in EAGLE_TEMPLATES},
        # Its Mamba groups may reserve prefill checkpoint blocks (0.30+).
        "mamba_eagle": (_eagle("mamba_eagle"),
                        ("eagle_drop_groups", "mamba_prefill_checkpoints")),
    }


_HAND = _hand_templates()


def templates() -> dict[str, tuple[Draw, tuple[str, ...]]]:
    """Every template a fuzz config may name (FuzzConfig.kinds): one per kind
    the kinds table has the fuzzer draw (a registered kind included), then
    the hybrids; each with its draw and the profile flags it needs."""
    return _templates_at(kinds.version())


@cache
def _templates_at(table_version: int) -> dict[str, tuple[Draw, tuple[str, ...]]]:
    out = {}
    for row in kinds.rows():
        if row.fuzz is None:
            continue
        draw = _alone(row) if row.fuzz == "alone" else _HAND[row.name][0]
        out[row.name] = (draw, (row.since,) if row.since else ())
    out.update((name, t) for name, t in _HAND.items() if name not in out)
    return out


# The built-in templates (a kind registered later shows in templates()).
TEMPLATES = tuple(templates())
# The profile flags (impl/profiles.py) a built-in template's groups need: a
# release without them refuses the template's configs.
TEMPLATE_NEEDS = {name: needs for name, (_, needs) in templates().items() if needs}


def template_supported(kind: str, profile) -> bool:
    needs = templates().get(kind, (None, ()))[1]
    return all(getattr(profile, flag) for flag in needs)


def kinds_supported(kinds, profile) -> bool:
    """Whether a fuzz config drawing from `kinds` fits the release of
    `profile` (a kind config for a feature the release lacks is left out of
    its campaigns, rather than fail on the first call)."""
    return all(template_supported(k, profile) for k in kinds)


def templates_for(profile) -> tuple[str, ...]:
    """The templates whose groups the release of `profile` has."""
    return tuple(t for t in templates() if template_supported(t, profile))


def draw_groups(kind: str, rng: random.Random, bs: int, caching: bool) -> Groups:
    """The groups of a `kind` case with block size `bs`, and other CacheConfig
    fields the template sets."""
    template = templates().get(kind)
    if template is None:
        raise ValueError(f"unknown fuzz kind '{kind}' (known: {', '.join(templates())})")
    return template[0](rng, bs, caching)


def _draw_circular_buffer(rng: random.Random, bs: int, caching: bool
                          ) -> tuple[tuple[GroupConfig, ...], dict]:
    """A ring per request (the K-pool tail of compressed sparse attention)
    next to full attention, at its own block size, sometimes with Mamba "align"
    hashed finer than its blocks (GLM-5-like), sometimes alone."""
    ring = GroupConfig(rng.choice((bs, bs, max(bs // 2, 1), 2 * bs)), "circular_buffer")
    if rng.random() < 0.15:
        return (ring,), {}
    groups = [GroupConfig(bs), ring]
    extra = {}
    if caching and rng.random() < 0.4:
        groups.insert(1, GroupConfig(bs, "mamba"))
        finer = [d for d in (1, 2, 4, 8) if d < bs and bs % d == 0]
        if finer and rng.random() < 0.6:
            extra["prefix_match_unit"] = rng.choice(finer)
    return tuple(groups), extra


def _fine_hash(rng: random.Random, bs: int, caching: bool) -> dict:
    """Sometimes a prefix_match_unit below the block (hits inside blocks)."""
    if caching and bs > 1 and rng.random() < 0.5:
        return {"prefix_match_unit": rng.choice([d for d in (1, 2, 4, 8) if d < bs
                                                 and bs % d == 0])}
    return {}


def _hisparse_groups(rng: random.Random, bs: int) -> tuple[tuple[GroupConfig, ...], dict]:
    """A HiSparse model (specs/KV_CACHE_MANAGER.md §14): the host-backed
    source group, usually an indexer, and one to three resident + hot pairs,
    all of one block size; a host pool from a few blocks to plenty."""
    groups = [GroupConfig(bs, role="hisparse_source")]
    if rng.random() < 0.8:
        groups.append(GroupConfig(bs, role="hisparse_indexer"))
    hot = GroupConfig(bs, "hisparse_hot", blocks_per_request=rng.choice((1, 2, 3)))
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        groups += [GroupConfig(bs, "hisparse_resident"), hot]
    extra = {"hisparse_host_num_blocks": rng.choice((3, 6, 12, 24, 48, 64, 128, 256))}
    if rng.random() < 0.4:
        # A small in-flight window makes requests move to host reads early.
        extra["max_in_flight_tokens"] = rng.choice((1, bs, 2 * bs, 4 * bs))
    return tuple(groups), extra


def draw_eagle_groups(kind: str, rng: random.Random, bs: int, caching: bool
                      ) -> tuple[tuple[GroupConfig, ...], dict]:
    """Speculative decoding with an EAGLE / MTP drafter (specs/KV_CACHE_MANAGER.md
    section 15): one group; a hybrid whose draft group is flagged (or none,
    then every group drops); a draft kept whole on every rank beside a
    DCP-sharded target; a Mamba hybrid (mamba_eagle). Never chunked local
    attention (vLLM refuses its hits with EAGLE)."""
    extra = {"use_eagle": rng.random() < 0.85}
    if kind == "eagle":
        group = rng.choice((GroupConfig(bs), GroupConfig(bs, "mla_attention"),
                            GroupConfig(bs, "sliding_window", sliding_window=draw_window(rng, bs))))
        if rng.random() < 0.3:
            group = GroupConfig(**{**_fields(group), "is_eagle_group": True})
        groups: tuple[GroupConfig, ...] = (group,)
    elif kind == "hybrid_eagle":
        sw_bs = rng.choice((bs, bs, 2 * bs, max(bs // 2, 1)))
        sw = GroupConfig(sw_bs, "sliding_window", sliding_window=draw_window(rng, sw_bs))
        draft_full = GroupConfig(rng.choice((bs, 2 * bs)), is_eagle_group=True)
        groups = rng.choice((
            (GroupConfig(bs), GroupConfig(**{**_fields(sw), "is_eagle_group": True})),
            (GroupConfig(bs, is_eagle_group=True), sw),
            (GroupConfig(bs), sw, draft_full),
            (GroupConfig(bs), sw),  # none flagged: every group drops
            (GroupConfig(bs), draft_full),
        ))
    elif kind == "mamba_eagle":
        groups, mamba_extra = _draw_mamba_eagle(rng, bs, caching)
        extra.update(mamba_extra)
    else:
        draft = rng.choice((GroupConfig(bs, dcp_sharded=False),
                            GroupConfig(bs, "mla_attention", dcp_sharded=False),
                            GroupConfig(bs, "sliding_window", sliding_window=draw_window(rng, bs),
                                        dcp_sharded=False)))
        draft = GroupConfig(**{**_fields(draft), "is_eagle_group": rng.random() < 0.8})
        target = rng.choice((GroupConfig(bs), GroupConfig(bs, "mla_attention")))
        groups = (target, draft) if rng.random() < 0.85 else (draft,)
        # A lone group is looked up with the process's PCP size, which a
        # sliding window refuses.
        lone_window = len(groups) == 1 and draft.kind == "sliding_window"
        extra.update(dcp_world_size=rng.choice((2, 4)),
                     pcp_world_size=1 if lone_window else rng.choice((1, 1, 2)))
    if kind != "mamba_eagle" and rng.random() < 0.3:
        # (Not beside Mamba: the driver does not model the scheduler's
        # re-prefilled lookahead over Mamba chunks.)
        # Multi-module MTP: with caching and a draft group, vLLM wants the
        # scheduler block to hold the lookahead.
        scheduler_block = CacheConfig(num_blocks=2, groups=groups,
                                      **extra).scheduler_block_size
        choices = [n for n in (2, 3, bs) if 2 <= n <= scheduler_block] if caching else [2, 3]
        if choices:
            extra["num_prefill_lookahead"] = rng.choice(choices)
    return groups, extra


def _draw_mamba_eagle(rng: random.Random, bs: int, caching: bool
                      ) -> tuple[tuple[GroupConfig, ...], dict]:
    """A Mamba hybrid served with an MTP drafter (Qwen3-Next-like): attention,
    usually flagged as the draft group (else every group drops), beside
    Mamba with scratch blocks for draft states; with caching ("align") often
    hits inside blocks, sometimes a prefill checkpoint block and junction
    checkpoints, so Mamba's EAGLE-shifted checkpoints are exercised."""
    checkpoints = {}
    extra: dict = {}
    if caching:
        extra.update(_fine_hash(rng, bs, caching))
        if rng.random() < 0.3:
            checkpoints = dict(num_prefill_checkpoint_blocks=1,
                               prefill_checkpoint_alignment=rng.choice((1, 2, 4)))
        if rng.random() < 0.5:
            extra["enable_mamba_shared_prefix_checkpoint"] = True
    mamba = GroupConfig(bs, "mamba", num_speculative_blocks=rng.choice((1, 1, 2)),
                        **checkpoints)
    attention = GroupConfig(bs, is_eagle_group=rng.random() < 0.7)
    return (attention, mamba), extra


def _fields(group: GroupConfig) -> dict:
    return {name: getattr(group, name) for name in GroupConfig.__dataclass_fields__}


def draw_cache_config(kind: str, rng: random.Random, bs: int, num_blocks: int,
                      hash_algo: str, hash_seed: str, caching: bool,
                      max_model_len: int) -> CacheConfig:
    groups, extra = draw_groups(kind, rng, bs, caching)
    if any(g.kind == "mamba" for g in groups) and not caching and rng.random() < 0.5:
        # vLLM's default without caching: one block holds a whole request.
        groups = tuple(GroupConfig(max_model_len, "mamba") if g.kind == "mamba" else g
                       for g in groups)
    fields = dict(num_blocks=num_blocks, groups=groups, hash_algo=hash_algo,
                  hash_seed=hash_seed, enable_caching=caching, max_model_len=max_model_len)
    fields.update(extra)
    # (HiSparse's template draws its own.)
    capped = any(kinds.kind_row(g.kind).in_flight_cap and not g.hisparse for g in groups)
    if capped and rng.random() < 0.3:
        # A small in-flight budget makes the recycling kinds' admission cap bite.
        fields["max_in_flight_tokens"] = rng.choice((1, bs, 2 * bs + 1))
    config = CacheConfig(**fields)
    if kind == "retention":
        # 0 (vLLM's engine default) or a few scheduler blocks.
        interval = rng.choice((0, 0, 1, 2, 4)) * config.scheduler_block_size
        config = replace(config, prefix_cache_retention_interval=interval)
    return config
