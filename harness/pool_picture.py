"""The block pool over time, drawn: one column per event, one row per block.

Colour says who holds a block after each event: one colour per request, dark
for a block shared through prefix hits, light grey for a free block still in
the prefix cache, white for a free empty block, black for the null block. The
diverging event, if any, is a red line. Pure drawing of a replay's
observations (TraceOutcome.pool_timeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.base import POOL_FREE, POOL_FREE_CACHED, POOL_NULL, POOL_SHARED
from impl.math_utils import cdiv

# Beyond this many events the picture keeps every k-th event plus the last
# ones before the divergence, so that a column stays at least a pixel wide.
MAX_COLUMNS = 1600
DIVERGENCE_RGB = (0.85, 0.05, 0.05)


@dataclass(slots=True)
class Picture:
    path: str
    width: int
    height: int
    # Pixel column of the red divergence line (None without a divergence).
    divergence_x: int | None


def _columns(n: int, divergence: int | None) -> list[int]:
    if n <= MAX_COLUMNS:
        return list(range(n))
    step = cdiv(n, MAX_COLUMNS - 64)
    cols = set(range(0, n, step))
    if divergence is not None:
        cols.update(range(max(0, divergence - 63), divergence + 1))
    return sorted(cols)


def draw_pool(
    timeline: list[tuple[int, str, list[int]]],
    num_requests: int,
    path: str,
    divergence_index: int | None = None,
    title: str = "",
) -> Picture:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cols = _columns(len(timeline), divergence_index)
    num_blocks = max(len(codes) for _, _, codes in timeline)
    # Palette: 4 fixed states, then one colour per request (tab20, cycled).
    fixed = [(1, 1, 1), (0.82, 0.82, 0.82), (0, 0, 0), (0.25, 0.25, 0.35)]
    tab = plt.get_cmap("tab20").colors
    palette = fixed + [tab[i % len(tab)] for i in range(max(num_requests, 1))]
    remap = {POOL_FREE: 0, POOL_FREE_CACHED: 1, POOL_NULL: 2, POOL_SHARED: 3}
    grid = np.zeros((num_blocks, len(cols)), dtype=np.int32)
    for j, i in enumerate(cols):
        codes = timeline[i][2]
        grid[: len(codes), j] = [remap.get(c, 4 + c) for c in codes]

    width_in = min(18.0, max(9.0, len(cols) / 60))
    height_in = min(12.0, max(4.0, num_blocks / 12 + 1.5))
    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=100)
    ax.imshow(grid, aspect="auto", interpolation="nearest", origin="lower",
              cmap=ListedColormap(palette), vmin=0, vmax=len(palette) - 1)
    ax.set_xlabel("event (trace order)")
    ax.set_ylabel("block id")
    ticks = np.linspace(0, len(cols) - 1, num=min(8, len(cols))).astype(int)
    ax.set_xticks(ticks, [str(timeline[cols[t]][0]) for t in ticks])
    ax.set_xlabel("trace line of the event")
    div_col = None
    if divergence_index is not None and divergence_index in cols:
        div_col = cols.index(divergence_index)
        ax.axvline(div_col, color=DIVERGENCE_RGB, linewidth=2.5)
        right = div_col > len(cols) * 0.6
        ax.annotate(f"first divergence: line {timeline[divergence_index][0]} "
                    f"({timeline[divergence_index][1]})",
                    (div_col, num_blocks - 0.5), xytext=(-6 if right else 6, -14),
                    textcoords="offset points", color=DIVERGENCE_RGB, fontsize=9,
                    ha="right" if right else "left",
                    bbox=dict(boxstyle="round", fc="white", ec=DIVERGENCE_RGB, alpha=0.9))
    legend = [Patch(facecolor=c, edgecolor="0.5", label=label) for c, label in (
        (fixed[0], "free"), (fixed[1], "free, cached"), (fixed[3], "shared (prefix hit)"),
        (fixed[2], "null block"))]
    if num_requests:
        legend.append(Patch(facecolor=tab[0], edgecolor="0.5",
                            label="held by a request (one colour each)"))
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5,
              fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.canvas.draw()
    x_px = None
    if div_col is not None:
        # Where the line landed in the saved image (origin top-left).
        x_px = int(round(ax.transData.transform((div_col, 0))[0]))
    fig.savefig(path)
    w, h = fig.canvas.get_width_height()
    plt.close(fig)
    return Picture(path, w, h, x_px)
