"""EAGLE / MTP draft groups: which groups give up the tail of a prefix hit,
and by how much; specs/KV_CACHE_MANAGER.md section 15.

A drafter reads the hidden state of the token before the generation point,
and its own layers' KV of the last matched unit depend on tokens the hash
does not cover. So a hit in a dropping group ends one unit early and the
request recomputes that unit. The kinds apply the drop in their lookups
(`drop_eagle_block`); this module only decides who drops and the unit.
"""

import dataclasses
from collections.abc import Sequence

from impl.kv_cache_spec import KVCacheGroupSpec
from impl.profiles import EagleDropGroups, TrailingDraftLayers, VersionProfile


class UnsupportedByProfile(ValueError):
    """A configuration the version profile's vLLM behaves in a way impl does
    not model (e.g. EAGLE under 0.17)."""


def draft_group_ids(groups: Sequence[KVCacheGroupSpec], use_eagle: bool) -> set[int]:
    """vLLM's `eagle_group_ids`: the groups flagged as holding draft layers;
    when none is and the manager was built for EAGLE, every group (nothing
    tells which layers draft)."""
    flagged = {i for i, group in enumerate(groups) if group.is_eagle_group}
    if use_eagle and not flagged:
        return set(range(len(groups)))
    return flagged


def dropping_group_ids(draft_ids: set[int], use_eagle: bool,
                       profile: VersionProfile, num_groups: int = 0) -> set[int]:
    """The groups whose lookups drop the last matched unit."""
    rule = profile.eagle_drop_groups
    if rule is None:
        if num_groups == 1:
            # One group (the unitary coordinator): it drops when it is a
            # draft group, flagged or by use_eagle, in every release; the
            # rules that moved over 0.20-0.30 are the hybrid coordinator's.
            return set(draft_ids)
        if draft_ids:
            raise UnsupportedByProfile(
                f"EAGLE draft groups of a hybrid model under vLLM {profile.name}: "
                "impl does not model this release's hybrid EAGLE lookups")
        return set()
    if rule is EagleDropGroups.FLAGGED_IF_USE_EAGLE and not use_eagle:
        return set()
    return set(draft_ids)


def eagle_proof_margin(block_size: int, hash_block_size: int, fine_grained: bool) -> int:
    """Tokens a dropping lookup matches beyond the candidate and then gives
    back: a hash block when it probes inside blocks, else a whole block."""
    if fine_grained and block_size > hash_block_size:
        return hash_block_size
    return block_size


# -- finding the draft groups when layers are grouped --------------------------------

# Models whose multi-token-prediction drafter reuses the target's decoder
# layer under a method other than "mtp" (its layers carry no marker either).
_TRAILING_DRAFT_MODELS = frozenset({"deepseek_v4", "deepseek_v41"})


def uses_trailing_draft_layers(method: str | None, model_type: str | None,
                               rule: TrailingDraftLayers) -> bool:
    """Whether grouping takes the drafter's KV layers to be the last ones
    registered (an MTP block: nothing in its specs tells it from the
    target's)."""
    if model_type in _TRAILING_DRAFT_MODELS:
        return True
    return rule is TrailingDraftLayers.MTP_OR_DEEPSEEK_V4 and method == "mtp"


def annotate_draft_groups(groups: Sequence[KVCacheGroupSpec], layer_order: Sequence[str],
                          trailing_layers: bool, marked_layers: frozenset[str] = frozenset()
                          ) -> list[KVCacheGroupSpec]:
    """The groups of a model served with an EAGLE / MTP drafter, its draft
    groups flagged (specs §15): every group holding a layer its spec marks as
    a drafter's; and, for drafters registered after the target, the group
    holding the last layer, when the groups cover every layer exactly once
    (else "last" means nothing)."""
    flagged = [any(name in marked_layers for name in g.layer_names) for g in groups]
    if trailing_layers and layer_order:
        names = [name for g in groups for name in g.layer_names]
        if len(names) == len(layer_order) and set(names) == set(layer_order):
            last = layer_order[-1]
            flagged = [f or last in g.layer_names for f, g in zip(flagged, groups)]
    return [dataclasses.replace(g, is_eagle_group=True) if f and not g.is_eagle_group else g
            for f, g in zip(flagged, groups)]
