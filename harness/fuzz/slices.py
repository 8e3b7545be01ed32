"""The gate's fuzz budget, sliced: every kind config of harness/fuzz/kind_configs/
(one attention kind or hybrid shape each) fuzzed with each of several seeds, so
that a short campaign still covers every kind (a single full-attention
campaign missed 0.33's Mamba-hybrid change).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from harness.fuzz.generate import FuzzConfig

KIND_CONFIGS = Path(__file__).resolve().parent / "kind_configs"
# Each kind config is fuzzed with this many seeds (the gate's seed and the
# ones after it), every (kind, seed) pair getting an equal share of the time.
SEEDS_PER_KIND = 2


def kind_names() -> list[str]:
    """The kind configs, one attention kind or hybrid shape each (all.yaml,
    their union, is for long campaigns and left out)."""
    return sorted(p.stem for p in KIND_CONFIGS.glob("*.yaml") if p.stem != "all")


@cache
def load_kind_config(name: str):
    """A kind config: a FuzzConfig, or (a document whose one key is
    `sizing`) a SizingFuzzConfig, fuzzing model shapes' sizing instead, or
    (`offload`) an OffloadFuzzConfig, fuzzing the CPU offload tier."""
    import yaml

    with open(KIND_CONFIGS / f"{name}.yaml") as f:
        return fuzz_config_of(yaml.safe_load(f) or {})


def fuzz_config_of(doc: dict):
    if isinstance(doc, dict) and "offload" in doc:
        from harness.fuzz.offload_driver import OffloadFuzzConfig

        if set(doc) != {"offload"}:
            raise ValueError("an offload kind config has `offload:` and nothing else")
        return OffloadFuzzConfig.from_dict(doc["offload"] or {})
    if isinstance(doc, dict) and "sizing" in doc:
        from harness.fuzz.sizing import SizingFuzzConfig

        if set(doc) != {"sizing"}:
            raise ValueError("a sizing kind config has `sizing:` and nothing else")
        return SizingFuzzConfig.from_dict(doc["sizing"] or {})
    return FuzzConfig.from_dict(doc)


def fuzz_slices(seconds: float, seed: int, profile=None,
                seeds_per_kind: int = SEEDS_PER_KIND) -> list[tuple[str, int, float]]:
    """(kind config, seed, seconds) for every slice of a `seconds` budget;
    with a profile, only the kind configs its release has the groups of."""
    from harness.fuzz.configs import kinds_supported

    kinds = [k for k in kind_names()
             if profile is None or kinds_supported(load_kind_config(k).kinds, profile)]
    pairs = [(kind, seed + i) for kind in kinds for i in range(seeds_per_kind)]
    share = seconds / len(pairs)
    return [(kind, s, share) for kind, s in pairs]
