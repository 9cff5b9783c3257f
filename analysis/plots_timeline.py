"""Pictures of time that scale from 1 to 16,384 ranks: the step timeline (identical ranks
folded), the pipeline Gantt, and the rank x time / rank x part heatmaps.

Each function takes the frames of :mod:`analysis.timeline` (or a breakdown summary) and
returns a matplotlib Figure (no pyplot state). Every colour has a legend entry, every axis
its unit, and time runs from the step's start. Layouts use fixed margins sized from the
labels (no constrained layout: it costs more than drawing the figure).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .breakdown import PARTS
from .timeline import ACTIVITY_PARTS

__all__ = ["ACTIVITY_COLORS", "PART_COLORS", "PART_LABELS", "time_axis", "plot_step_timeline",
           "plot_pipeline_gantt", "plot_rank_time_heatmap", "plot_rank_part_heatmap",
           "fixed_margins"]

PART_COLORS = {"compute_ns": "#4C72B0", "overlapped_comm_ns": "#8172B2",
               "exposed_comm_ns": "#C44E52", "memcpy_ns": "#CCB974",
               "host_bound_ns": "#DD8452", "idle_ns": "#D9D9D9"}
PART_LABELS = {"compute_ns": "compute", "overlapped_comm_ns": "communication (overlapped)",
               "exposed_comm_ns": "communication (exposed)", "memcpy_ns": "memory copies",
               "host_bound_ns": "host-bound (GPU waits for CPU)", "idle_ns": "idle"}
ACTIVITY_COLORS = {"host": "#DD8452", "compute": "#4C72B0", "communication": "#C44E52",
                   "memcpy": "#CCB974"}
_ACT_LABELS = {"host": "host (CPU ops)", "compute": "GPU compute",
               "communication": "communication", "memcpy": "memory copies"}
_ROW_NAMES = {0: "CPU", 1: "GPU", 2: "comm"}
_PHASE_COLORS = {"forward": "#8FB4E3", "backward": "#2F5D9A", "recompute": "#B39CD0",
                 "other": "#BDBDBD"}


def time_axis(span_ns: float) -> tuple[str, float]:
    """(axis unit, ns per unit) for a window of ``span_ns``: ms up to 10 s, else s."""
    return ("s", 1e9) if span_ns >= 10e9 else ("ms", 1e6)


def fixed_margins(fig: Figure, *, left_in: float, right_in: float = 0.25, top_in: float = 0.4,
                  bottom_in: float = 0.55) -> None:
    """Margins in inches (labels sized by the caller) instead of a layout engine."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=min(left_in / w, 0.45), right=1 - right_in / w,
                        top=1 - top_in / h, bottom=min(bottom_in / h, 0.45))


def _boxes(left: np.ndarray, right: np.ndarray, y: np.ndarray, half: float) -> np.ndarray:
    return np.stack([np.column_stack([left, y - half]), np.column_stack([right, y - half]),
                     np.column_stack([right, y + half]), np.column_stack([left, y + half])],
                    axis=1)


def _label_in(labels: list[str], size: float = 7.0) -> float:
    return 0.15 + 0.56 * size / 72 * max((len(s) for s in labels), default=4)


def plot_step_timeline(seg: pd.DataFrame, groups: list[str], *, span_ns: int,
                       title: str = "", origin: str = "step start") -> Figure:
    """One step, one row per (rank group, activity); critical-path boxes outlined.

    ``seg`` is :func:`analysis.timeline.step_segments`; ``groups[i]`` names row group ``i``
    (e.g. ``rank 3`` or ``ranks 0-31``). Rows of an activity a group never shows are left
    out. ``origin`` names where the x axis starts (``trace start`` without step markers).
    """
    unit, scale = time_axis(span_ns)
    # boxes wholly outside the window (a host that ran ahead of its GPU) are not drawn, and a
    # row with nothing else stays out: no empty "CPU" row named in the legend
    if len(seg):
        seg = seg[(seg["end_ns"].to_numpy() > 0) & (seg["start_ns"].to_numpy() < span_ns)]
    present = (seg[["row_group", "activity"]].drop_duplicates()
               .sort_values(["row_group", "activity"]).to_numpy() if len(seg)
               else np.zeros((0, 2), int))
    rows = {(int(g), int(a)): i for i, (g, a) in enumerate(present)}
    labels = [f"{groups[g]} · {_ROW_NAMES[a]}" for g, a in present]
    n = max(len(rows), 1)
    fig = Figure(figsize=(10, 1.25 + 0.2 * n))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=_label_in(labels), bottom_in=0.5, top_in=0.62)
    if len(seg):
        y = np.array([rows[(int(g), int(a))] for g, a in
                      zip(seg["row_group"].to_numpy(), seg["activity"].to_numpy())], float)
        left = seg["start_ns"].to_numpy() / scale
        right = np.maximum(seg["end_ns"].to_numpy() / scale, left + span_ns / scale * 4e-4)
        crit = seg["critical"].to_numpy(dtype=bool)
        kinds = seg["kind"].to_numpy()
        colors = [ACTIVITY_COLORS[k] for k in kinds]
        body = ~crit
        ax.add_collection(PolyCollection(_boxes(left[body], right[body], y[body], 0.36),
                                         facecolors=[c for c, b in zip(colors, body) if b],
                                         linewidths=0))
        if crit.any():
            ax.add_collection(PolyCollection(_boxes(left[crit], right[crit], y[crit], 0.36),
                                             facecolors=[c for c, b in zip(colors, crit) if b],
                                             edgecolors="black", linewidths=0.9))
    ax.set_xlim(0, span_ns / scale)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(np.arange(len(labels)), labels, fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(f"time from the {origin} ({unit})", fontsize=8)
    kinds_present = list(dict.fromkeys(seg["kind"].tolist())) if len(seg) else []
    handles = [Patch(facecolor=ACTIVITY_COLORS[k], label=_ACT_LABELS[k])
               for k in ("compute", "communication", "memcpy", "host") if k in kinds_present]
    if len(seg) and seg["critical"].any():
        handles.append(Patch(facecolor="white", edgecolor="black", label="on the critical path"))
    _legend_and_title(fig, handles, title)
    for i in range(1, len(labels)):  # a faint rule between rank groups
        if present[i][0] != present[i - 1][0]:
            ax.axhline(i - 0.5, color="#E0E0E0", lw=0.6)
    return fig


def plot_pipeline_gantt(blocks: pd.DataFrame, stage_labels: dict[int, str], *, span_ns: int,
                        title: str = "") -> Figure:
    """Pipeline Gantt: one row per stage, blocks coloured by phase and numbered by
    micro-batch (where a block is wide enough to hold its number)."""
    unit, scale = time_axis(span_ns)
    stages = sorted(stage_labels)
    labels = [stage_labels[s] for s in stages]
    fig = Figure(figsize=(10, 1.3 + 0.34 * max(len(stages), 1)))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=_label_in(labels), bottom_in=0.5, top_in=0.62)
    row = {s: i for i, s in enumerate(stages)}
    b = blocks[blocks["stage"].isin(stages)]
    phases = []
    if len(b):
        y = np.array([row[s] for s in b["stage"]], float)
        left = b["start_ns"].to_numpy() / scale
        right = np.maximum(b["end_ns"].to_numpy() / scale, left + span_ns / scale * 4e-4)
        ph = b["phase"].to_numpy()
        ax.add_collection(PolyCollection(_boxes(left, right, y, 0.38),
                                         facecolors=[_PHASE_COLORS[p] for p in ph],
                                         edgecolors="white", linewidths=0.3))
        # a number fits when the block is >= 11 px wide at 100 dpi on an 8.3 in axis
        px = (right - left) / (span_ns / scale) * 830
        mbs = b["microbatch"].to_numpy()
        if len(b) <= 1500:
            for xl, xr, yy, mb, p, w in zip(left, right, y, mbs, ph, px):
                if mb >= 0 and w >= 11 + 5 * (mb >= 10):
                    ax.text((xl + xr) / 2, yy, str(mb), ha="center", va="center", fontsize=6,
                            color="white" if p == "backward" else "black")
        phases = [p for p in ("forward", "backward", "recompute", "other") if p in set(ph)]
    ax.set_xlim(0, span_ns / scale)
    ax.set_ylim(len(stages) - 0.5, -0.5)
    ax.set_yticks(np.arange(len(stages)), labels, fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(f"time from the step start ({unit}); numbers are micro-batches", fontsize=8)
    names = {"forward": "forward", "backward": "backward", "recompute": "recompute",
             "other": "other (optimizer, GC, ...)"}
    handles = [Patch(facecolor=_PHASE_COLORS[p], label=names[p]) for p in phases]
    _legend_and_title(fig, handles, title)
    return fig


def _pool_rows(a: np.ndarray, max_rows: int) -> tuple[np.ndarray, int]:
    """Sum consecutive rows of ``a`` (axis 0) so that at most ``max_rows`` remain."""
    n = a.shape[0]
    k = int(np.ceil(n / max_rows)) if n > max_rows else 1
    if k == 1:
        return a, 1
    pad = (-n) % k
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return a.reshape(-1, k, *a.shape[1:]).sum(axis=1), k


def plot_rank_time_heatmap(first_rank: np.ndarray, per_row: np.ndarray, edges_ns: np.ndarray,
                           parts: np.ndarray, *, title: str = "") -> Figure:
    """Rank x time: each cell coloured by what the rank (or the row's ranks together) mostly
    does in that time bin (:data:`analysis.timeline.ACTIVITY_PARTS`); the frames of
    :func:`analysis.timeline.rank_activity`. Rows holding several ranks are said on the
    axis."""
    span = float(edges_ns[-1]) if len(edges_ns) else 1.0
    unit, scale = time_axis(span)
    fig = Figure(figsize=(10, 3.4 if len(first_rank) > 16 else 2.4))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=0.75, bottom_in=0.5, top_in=0.62)
    tot = parts.sum(axis=-1)
    dom = np.argmax(parts, axis=-1).astype(float)
    dom[tot <= 0] = np.nan  # outside every rank's step window
    cmap = ListedColormap([PART_COLORS[p] for p in ("compute_ns", "exposed_comm_ns",
                                                     "memcpy_ns", "host_bound_ns", "idle_ns")]
                          ).with_extremes(bad="white")
    k = int(per_row.max()) if len(per_row) else 1
    r0 = int(first_rank[0]) if len(first_rank) else 0
    r1 = int(first_rank[-1] + per_row[-1] - 1) if len(first_rank) else 0
    ax.imshow(dom, aspect="auto", interpolation="nearest", cmap=cmap, vmin=-0.5,
              vmax=len(ACTIVITY_PARTS) - 0.5,
              extent=(0, span / scale, r1 + 0.5, r0 - 0.5))
    ax.set_xlabel(f"time from the step start ({unit})", fontsize=8)
    ax.set_ylabel("rank" + (f" ({k} ranks per row)" if k > 1 else ""), fontsize=8)
    ax.tick_params(labelsize=7)
    present = [i for i in range(len(ACTIVITY_PARTS)) if (dom == i).any()]
    labels = {"compute": "compute", "exposed_comm": "communication (exposed)",
              "memcpy": "memory copies", "host_bound": "host-bound", "idle": "idle"}
    keys = ("compute_ns", "exposed_comm_ns", "memcpy_ns", "host_bound_ns", "idle_ns")
    handles = [Patch(facecolor=PART_COLORS[keys[i]], label=labels[ACTIVITY_PARTS[i]])
               for i in present]
    _legend_and_title(fig, handles, title)
    return fig


def plot_rank_part_heatmap(summary: pd.DataFrame, *, title: str = "",
                           max_cols: int = 1024) -> Figure:
    """Rank x part: each cell is a part's share of the rank's mean step (%), from
    :func:`analysis.breakdown.summarize_breakdown`. Beyond ``max_cols`` ranks, consecutive
    ranks are averaged into one column (said on the axis)."""
    ranks = summary["rank"].to_numpy()
    st = summary["step_ns"].to_numpy(dtype=float)
    frac = np.stack([summary[p].to_numpy(dtype=float) for p in PARTS], axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(st > 0, frac / st, np.nan) * 100
    pooled, k = _pool_rows(np.nan_to_num(frac.T), max_cols)
    if k > 1:
        counts, _ = _pool_rows(np.ones((frac.shape[1], 1)), max_cols)
        pooled = pooled / counts
    labels = [PART_LABELS[p] for p in PARTS]
    fig = Figure(figsize=(10, 2.6))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=_label_in(labels), right_in=1.0, bottom_in=0.5, top_in=0.45)
    r0 = int(ranks[0]) if len(ranks) else 0
    im = ax.imshow(pooled.T, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0,
                   vmax=100, extent=(r0 - 0.5, r0 - 0.5 + pooled.shape[0] * k, len(PARTS) - 0.5,
                                     -0.5))
    ax.set_yticks(np.arange(len(PARTS)), labels, fontsize=7)
    ax.set_xlabel("rank" + (f" ({k} ranks averaged per column)" if k > 1 else ""), fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.015)
    cb.set_label("% of the rank's step", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    _legend_and_title(fig, [], title)
    return fig


def _legend_and_title(fig: Figure, handles: list, title: str) -> None:
    """The timeline figures' legend (one row, top right) and bold title (top left)."""
    if handles:
        fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=7,
                   frameon=False, bbox_to_anchor=(1 - 0.2 / 10, 1.0))
    if title:
        fig.text(0.01, 1 - 0.08 / fig.get_size_inches()[1], title, fontsize=9, va="top",
                 weight="bold")
