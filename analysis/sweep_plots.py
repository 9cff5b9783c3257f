"""Sweep frames (:func:`replay.sweep.sweep`, ``retime sweep`` Parquet): Pareto front and plots.

``pareto_front`` returns a frame; the plot functions take sweep frames and return a
matplotlib Figure (no pyplot state). Rows with an ``error`` or a missing metric are left
out of plots; OOM rows are drawn as crosses and never belong to the front.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["pareto_front", "plot_sweep", "plot_pareto", "sensitivity", "plot_sensitivity"]

_SCALE = {"step_time_ns": (1e6, "step time (ms)"),
          "exposed_comm_ns": (1e6, "exposed communication (ms)"),
          "peak_memory_bytes": (2**30, "peak memory (GiB)"),
          "tokens_per_s": (1.0, "tokens/s"), "mfu": (0.01, "MFU (%)"),
          "bubble_fraction": (0.01, "no compute (% of step)")}


def _ok(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    m = pd.Series(True, index=df.index)
    if "error" in df.columns:
        m &= df["error"].isna()
    for c in cols:
        m &= df[c].notna()
    return df[m]


def _values(df: pd.DataFrame, col: str) -> tuple[np.ndarray, str]:
    scale, label = _SCALE.get(col, (1.0, col))
    return df[col].to_numpy(dtype=float) / scale, label


def pareto_front(df: pd.DataFrame, x: str = "peak_memory_bytes",
                 y: str = "step_time_ns") -> pd.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (both minimized), sorted by ``x``.

    Rows with an error, a missing value or ``oom`` true are not candidates.
    """
    d = _ok(df, [x, y])
    if "oom" in d.columns:
        d = d[~d["oom"].fillna(False).astype(bool)]
    if len(d) == 0:
        return d.copy()
    d = d.sort_values([x, y], kind="mergesort")
    yv = d[y].to_numpy(dtype=float)
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], yv[:-1]]))
    return d[yv < best_before].copy()


def plot_sweep(df: pd.DataFrame, x: str, y: str = "step_time_ns", *, hue: str | None = None,
               title: str | None = None) -> Figure:
    """``y`` (default step time) against the scenario key ``x``; one line per ``hue`` value.

    Values of ``x`` that are not numbers are placed at equal spacing in their first-seen order.
    """
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    d = _ok(df, [x, y])
    if len(d) == 0:
        ax.text(0.5, 0.5, "no scenario ran", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    numeric = pd.api.types.is_numeric_dtype(d[x]) and not pd.api.types.is_bool_dtype(d[x])
    cats = list(dict.fromkeys(d[x].tolist()))
    groups = [(None, d)] if hue is None else list(d.groupby(hue, sort=True, dropna=False))
    for key, g in groups:
        g = g.sort_values(x) if numeric else g.assign(
            _pos=[cats.index(v) for v in g[x]]).sort_values("_pos")
        xv = g[x].to_numpy(dtype=float) if numeric else g["_pos"].to_numpy()
        yv, ylabel = _values(g, y)
        label = None if hue is None else f"{hue}={key}"
        line, = ax.plot(xv, yv, marker="o", ms=4, label=label)
        if "oom" in g.columns:
            oom = g["oom"].fillna(False).to_numpy(dtype=bool)
            if oom.any():
                ax.plot(xv[oom], yv[oom], "x", color=line.get_color(), ms=9, mew=2)
    if not numeric:
        ax.set_xticks(range(len(cats)), [str(c) for c in cats])
    ax.set_xlabel(x)
    ax.set_ylabel(_SCALE.get(y, (1.0, y))[1])
    ax.set_title(title or f"{_SCALE.get(y, (1.0, y))[1]} vs {x}")
    if hue is not None:
        ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def plot_pareto(df: pd.DataFrame, x: str = "peak_memory_bytes", y: str = "step_time_ns", *,
                label: str | None = None, title: str | None = None) -> Figure:
    """Every scenario as a point (OOM as crosses) and the Pareto front of ``y`` vs ``x``.

    ``label`` names a column whose values annotate the front's points.
    """
    fig = Figure(figsize=(8, 3.6))
    fig.subplots_adjust(left=0.09, right=0.98, top=0.9, bottom=0.15)
    ax = fig.add_subplot()
    d = _ok(df, [x, y])
    if len(d) == 0:
        ax.text(0.5, 0.5, "no scenario ran", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    oom = d["oom"].fillna(False).to_numpy(dtype=bool) if "oom" in d.columns else np.zeros(
        len(d), bool)
    xv, xlabel = _values(d, x)
    yv, ylabel = _values(d, y)
    ax.scatter(xv[~oom], yv[~oom], s=14, color="#4C72B0", alpha=0.6, label="scenario")
    if oom.any():
        ax.scatter(xv[oom], yv[oom], s=30, marker="x", color="#C44E52", label="OOM")
    front = pareto_front(d, x, y)
    if len(front):
        fx, _ = _values(front, x)
        fy, _ = _values(front, y)
        ax.step(fx, fy, where="post", color="#DD8452", lw=1.5)
        ax.scatter(fx, fy, s=36, color="#DD8452", zorder=3, label="Pareto front")
        if label is not None and label in front.columns:
            for a, b, t in zip(fx, fy, front[label].tolist(), strict=True):
                ax.annotate(str(t), (a, b), fontsize=7, xytext=(4, 4),
                            textcoords="offset points")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title(f"{ylabel} vs {xlabel}" if title is None else title, fontsize=9, loc="left")
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def _by_value(d: pd.DataFrame, key: str, y: str) -> pd.DataFrame:
    """Median, min and max of ``y`` per value of ``key`` (values in sorted order when
    numeric, first-seen order otherwise)."""
    g = d.groupby(key, sort=False, dropna=False)[y].agg(["median", "min", "max"])
    numeric = pd.api.types.is_numeric_dtype(d[key]) and not pd.api.types.is_bool_dtype(d[key])
    return g.sort_index() if numeric else g


def sensitivity(df: pd.DataFrame, keys: list[str], y: str = "step_time_ns") -> pd.DataFrame:
    """How much each key moves ``y``: per key, the value with the lowest and the highest
    median ``y`` over the scenarios holding it (``best``, ``worst``, ``best_ns``,
    ``worst_ns``) and ``range_frac = (worst - best) / best``; sorted by range, largest
    first. Keys with a single value are left out."""
    d = _ok(df, [y])
    rows = []
    for k in keys:
        if k not in d or d[k].nunique(dropna=False) < 2:
            continue
        g = _by_value(d, k, y)["median"].astype(float)
        b, w = g.idxmin(), g.idxmax()
        rows.append((k, str(b), str(w), float(g[b]), float(g[w]),
                     float((g[w] - g[b]) / g[b]) if g[b] else np.nan))
    out = pd.DataFrame(rows, columns=["key", "best", "worst", "best_ns", "worst_ns",
                                      "range_frac"])
    return out.sort_values("range_frac", ascending=False, kind="mergesort").reset_index(drop=True)


def plot_sensitivity(df: pd.DataFrame, keys: list[str], y: str = "step_time_ns", *,
                     title: str = "") -> Figure:
    """One small panel per key: the median of ``y`` over the scenarios holding each value,
    with a band from their minimum to their maximum."""
    keys = [k for k in keys if k in df.columns][:6] or ["(none)"]
    n = len(keys)
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig = Figure(figsize=(10, 0.5 + 2.3 * rows))
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.35 / (0.5 + 2.3 * rows),
                        bottom=0.55 / (0.5 + 2.3 * rows) + 0.05 * (rows > 1), wspace=0.3,
                        hspace=0.75)
    d = _ok(df, [y])
    scale, ylabel = _SCALE.get(y, (1.0, y))
    for i, k in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        if k not in d or len(d) == 0:
            ax.set_axis_off()
            continue
        g = _by_value(d, k, y)
        numeric = pd.api.types.is_numeric_dtype(d[k]) and not pd.api.types.is_bool_dtype(d[k])
        xv = g.index.to_numpy(dtype=float) if numeric else np.arange(len(g))
        ax.fill_between(xv, g["min"].to_numpy(float) / scale, g["max"].to_numpy(float) / scale,
                        color="#4C72B0", alpha=0.2, lw=0, label="fastest to slowest")
        ax.plot(xv, g["median"].to_numpy(float) / scale, marker="o", ms=3.5, color="#4C72B0",
                label="median")
        if not numeric:
            ax.set_xticks(xv, [str(v) for v in g.index], fontsize=7)
        ax.set_xlabel(k, fontsize=8)
        ax.set_ylabel(ylabel if i % cols == 0 else "", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i == 0:
            fig.legend(*ax.get_legend_handles_labels(), loc="upper right", ncol=2, fontsize=7,
                       frameon=False)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    return fig
