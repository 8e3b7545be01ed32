"""KV cache layouts: the order in which a strided tensor plan lays out the
logical axes of the cache (vLLM's KVCacheLayout names, one letter an axis);
specs/KV_CACHE_MANAGER.md §12.5.

Below the grouping (impl/kv_cache_packing.py packs groups only where blocks
are outermost) and the tensor plan (impl/kv_cache_sizing.py).
"""

# Logical axes of a strided plan: layer, block, head, state, content bytes.
AXIS_L, AXIS_B, AXIS_H, AXIS_N, AXIS_C = range(5)
KV_CACHE_LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def layout_order(layout: str | None) -> tuple[int, ...]:
    """The physical order of the logical axes; a layout must be known
    (resolved by the engine) before tensors are planned."""
    if layout is None:
        raise ValueError("the KV cache layout is not resolved yet: the engine resolves it "
                         "before planning the KV cache tensors")
    return KV_CACHE_LAYOUTS[layout]


def block_outermost(layout: str | None) -> bool:
    return layout_order(layout)[0] == AXIS_B


def layers_outermost(layout: str) -> bool:
    return layout_order(layout)[0] == AXIS_L


def pages_contiguous(layout: str) -> bool:
    """Whether each page's [H, N, C] bytes are one run (L and B outermost)."""
    return set(layout_order(layout)[:2]) == {AXIS_L, AXIS_B}
