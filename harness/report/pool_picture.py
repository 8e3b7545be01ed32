"""The block pool over scheduler steps, drawn, with the traffic beneath it.

Three panels over one x axis, the scheduler step (the event, for traces
without steps):

- the pool: one column per step (its state at the step's end), one row per
  block (up to the highest block ever used). Colour says who holds a block:
  one colour per request, dark for a block shared through prefix hits, light
  grey for a free block still in the prefix cache, white for a free empty
  block, black for the null block;
- the prefix-cache hit rate of each step's lookups (tokens hit / tokens looked
  up), and the running hit rate;
- the pool's usage at each step's end, with the steps that preempted a request
  (triangles at the top) and those that evicted cached blocks (ticks at the
  bottom), each counted in the legend: where the pool ran short.

A divergence is a red line through all three at the step it happened in, with
its label inside the picture. The picture is at most `WIDTH_PX` wide, so that
it fits a page. Pure drawing of a run's observations (harness/core/traffic.py).
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field

from harness.backends.base import POOL_FREE, POOL_FREE_CACHED, POOL_NULL, POOL_SHARED
from harness.core.traffic import Traffic

DIVERGENCE_RGB = (0.85, 0.05, 0.05)
WIDTH_PX = 1100
DPI = 100
_FIXED = [(1, 1, 1), (0.82, 0.82, 0.82), (0, 0, 0), (0.25, 0.25, 0.35)]
_GOLDEN = 0.618033988749895


@dataclass(slots=True)
class Picture:
    path: str
    width: int
    height: int
    # Pixel column of the red divergence line (None without a divergence).
    divergence_x: int | None
    # Pixel columns of the steps marked with a preemption / an eviction.
    preemption_x: list[int] = field(default_factory=list)
    eviction_x: list[int] = field(default_factory=list)


def request_colour(k: int) -> tuple[float, float, float]:
    """Request k's colour: hues a golden-ratio turn apart, in three
    lightness/saturation bands, so that neighbours differ and no two of the
    first hundreds repeat."""
    hue = (0.11 + k * _GOLDEN) % 1.0
    band = (k // 7) % 3
    light, sat = ((0.55, 0.75), (0.42, 0.65), (0.68, 0.60))[band]
    return colorsys.hls_to_rgb(hue, light, sat)


def draw_pool(traffic: Traffic, path: str, divergence: bool = False,
              title: str = "") -> Picture:
    """The picture of `traffic` (observed with pool samples) at `path` (PNG).
    With `divergence`, the run's last state is where it diverged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    samples = traffic.samples
    used = 1  # rows up to the highest block ever not free and empty
    for s in samples:
        taken = np.flatnonzero(np.asarray(s.codes) != POOL_FREE)
        if len(taken):
            used = max(used, int(taken[-1]) + 1)
    rows = max(2, used)
    palette = _FIXED + [request_colour(k) for k in range(max(len(traffic.request_index), 1))]
    remap = {POOL_FREE: 0, POOL_FREE_CACHED: 1, POOL_NULL: 2, POOL_SHARED: 3}
    grid = np.zeros((rows, len(samples)), dtype=np.int32)
    for j, s in enumerate(samples):
        grid[:, j] = [remap.get(c, 4 + c) for c in s.codes[:rows]]
    x = np.array([s.step if traffic.has_steps else s.index for s in samples], dtype=float)
    unit = "scheduler step" if traffic.has_steps else "event (the trace has no steps)"

    fig, (ax, ax_hit, ax_use) = plt.subplots(
        3, 1, sharex=True, figsize=(WIDTH_PX / DPI, 8.6), dpi=DPI,
        gridspec_kw={"height_ratios": [3.2, 1, 1]})
    left = x[0] - 0.5 if len(x) else -0.5
    right = x[-1] + 0.5 if len(x) else 0.5
    if divergence:  # room for the line at the last column
        right += 0.02 * (right - left)
    # Column j covers [x_j, x_{j+1}) in steps (samples may be thinned).
    edges = np.append(x, x[-1] + 1 if len(x) else 1) - 0.5
    ax.pcolormesh(edges, np.arange(rows + 1) - 0.5, grid, cmap=ListedColormap(palette),
                  vmin=0, vmax=len(palette) - 1, shading="flat", rasterized=True)
    ax.set_ylim(-0.5, rows - 0.5)
    ax.set_ylabel("block id")
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    legend = [Patch(facecolor=c, edgecolor="0.5", label=label) for c, label in (
        (_FIXED[0], "free"), (_FIXED[1], "free, cached"), (_FIXED[3], "shared (prefix hit)"),
        (_FIXED[2], "null block"))]
    if traffic.request_index:
        legend.append(Patch(facecolor=request_colour(0), edgecolor="0.5",
                            label="held by one request (a colour each)"))
    ax.legend(handles=legend, loc="lower left", bbox_to_anchor=(0, 1.06), ncol=5, fontsize=8,
              frameon=False, borderaxespad=0)

    steps = traffic.steps
    sx = np.array([s.step for s in steps], dtype=float)
    per_step = [s.hits / s.queries if s.queries else np.nan for s in steps]
    cum_q = np.cumsum([s.queries for s in steps]) if steps else np.array([])
    cum_h = np.cumsum([s.hits for s in steps]) if steps else np.array([])
    running = np.where(cum_q > 0, cum_h / np.maximum(cum_q, 1), np.nan)
    ax_hit.plot(sx, per_step, ".", ms=3, color="#1f77b4", label="this step's lookups")
    ax_hit.plot(sx, running, "-", lw=1.2, color="#ff7f0e", label="so far")
    ax_hit.set_ylim(-0.05, 1.05)
    ax_hit.set_ylabel("hit rate")
    ax_hit.legend(loc="upper left", fontsize=7, frameon=False, ncol=2)
    usage = [s.usage for s in steps]
    ax_use.fill_between(sx, usage, step="mid", color="#2ca02c", alpha=0.5)
    peak = max(usage, default=0.0)
    # A server's pool is often large and little used: scale to what it used.
    ax_use.set_ylim(0, 1.05 if peak > 0.5 else max(peak * 1.25, 0.001))
    ax_use.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
    ax_use.set_ylabel("pool usage")
    preempted, evicting = _mark_pressure(ax_use, steps, traffic.counts_evictions)
    ax_use.set_xlabel(unit)
    ax_use.set_xlim(left, right)

    div_x = None
    if divergence and samples:
        at = x[-1]
        for a in (ax, ax_hit, ax_use):
            a.axvline(at, color=DIVERGENCE_RGB, linewidth=2.0)
        s = samples[-1]
        where = f"step {s.step}" if traffic.has_steps else f"event {s.index}"
        right_half = (at - left) > 0.6 * (right - left)
        ax.text(0.98 if right_half else 0.02, 0.96,
                f"first divergence: {where}, line {s.line}",
                transform=ax.transAxes, ha="right" if right_half else "left", va="top",
                color=DIVERGENCE_RGB, fontsize=9,
                bbox=dict(boxstyle="round", fc="white", ec=DIVERGENCE_RGB, alpha=0.9))
        div_x = at
    fig.tight_layout()
    fig.canvas.draw()
    x_px = None
    if div_x is not None:
        x_px = int(round(ax.transData.transform((div_x, 0))[0]))
    def columns(xs) -> list[int]:
        return [int(round(ax_use.transData.transform((v, 0))[0])) for v in xs]

    fig.savefig(path)
    w, h = fig.canvas.get_width_height()
    plt.close(fig)
    return Picture(path, w, h, x_px, columns(preempted), columns(evicting))


PREEMPTION_RGB = (0.58, 0.0, 0.83)
EVICTION_RGB = (0.55, 0.34, 0.16)


def pressure_steps(steps) -> tuple[list[int], list[int]]:
    """The steps with a preemption, and those with a prefix-cache eviction:
    where the pool ran short, which the usage curve alone does not show."""
    return ([s.step for s in steps if s.preemptions], [s.step for s in steps if s.evicted])


def _mark_pressure(ax, steps, counts_evictions: bool) -> tuple[list[int], list[int]]:
    """Preemptions as ticks above the usage curve, evictions below it, each
    counted in the legend (which says so when evictions were not counted)."""
    preempted, evicting = pressure_steps(steps)
    n_pre = sum(s.preemptions for s in steps)
    n_ev = sum(s.evicted for s in steps)
    top = ax.get_ylim()[1]
    ax.plot(preempted, [top * 0.97] * len(preempted), "v", ms=5, color=PREEMPTION_RGB,
            linestyle="none", label=f"preemption ({n_pre})", clip_on=False)
    if counts_evictions:
        ax.plot(evicting, [top * 0.03] * len(evicting), "|", ms=8, mew=1.5,
                color=EVICTION_RGB, linestyle="none",
                label=f"prefix-cache eviction ({n_ev} blocks)")
        label = None
    else:
        label = "evictions not counted (this backend queues no KV events)"
    if label:
        ax.plot([], [], " ", label=label)
        evicting = []
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=3)
    return preempted, evicting
