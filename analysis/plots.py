"""Plots: functions that take analysis frames and return matplotlib Figures (Agg backend).

No plot computes analysis itself (CONVENTIONS.md §8): pass the frames of
:mod:`analysis.breakdown`, :mod:`analysis.comm`, ... Figures are created with
``matplotlib.figure.Figure`` directly, so nothing touches pyplot's global state or a GUI.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from retime.collectors.enums import OpKind

from .breakdown import PARTS

__all__ = ["plot_breakdown", "plot_timeline", "plot_collectives", "plot_bubbles",
           "plot_memory", "plot_compare", "plot_kernel_classes", "plot_waterfall",
           "plot_rank_deltas"]

_PART_COLORS = {"compute_ns": "#4C72B0", "overlapped_comm_ns": "#8172B2",
                "exposed_comm_ns": "#C44E52", "memcpy_ns": "#CCB974",
                "host_bound_ns": "#DD8452", "idle_ns": "#CFCFCF"}
_KIND_COLORS = {int(OpKind.KERNEL): "#4C72B0", int(OpKind.COMPUTE): "#4C72B0",
                int(OpKind.COLLECTIVE): "#C44E52", int(OpKind.P2P): "#C44E52",
                int(OpKind.MEMCPY): "#CCB974", int(OpKind.MEMSET): "#CCB974",
                int(OpKind.CPU_OP): "#55A868", int(OpKind.RUNTIME): "#DD8452",
                int(OpKind.SYNC): "#937860"}


def _empty(fig: Figure, ax, msg: str) -> Figure:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def _boxes(left: np.ndarray, width: np.ndarray, y: np.ndarray, half: float) -> np.ndarray:
    x0, x1 = left, left + width
    return np.stack([np.column_stack([x0, y - half]), np.column_stack([x1, y - half]),
                     np.column_stack([x1, y + half]), np.column_stack([x0, y + half])], axis=1)


def plot_breakdown(summary: pd.DataFrame, *, labels: list[str] | None = None,
                   title: str = "Step time breakdown per rank", cpu_only: bool = False,
                   ylabel: str = "mean step time (ms)") -> Figure:
    """Stacked bars per rank (or per group of identical ranks, named by ``labels``) of the
    mean step's parts (ms), from :func:`analysis.breakdown.summarize_breakdown`;
    ``cpu_only``: a trace without GPU (host-bound is host work outside every op); ``ylabel``
    names the bars (a trace without step markers is one window, not a mean step)."""
    from .plots_timeline import PART_COLORS, PART_LABELS, fixed_margins
    if cpu_only:
        PART_LABELS = {**PART_LABELS, "host_bound_ns": "host-bound (host work outside ops)"}

    names = labels if labels is not None else [str(r) for r in summary["rank"]]
    long = max((len(n) for n in names), default=1) > 3 or len(names) > 16
    fig = Figure(figsize=(10, 3.3 + (0.45 if long else 0)))
    ax = fig.add_subplot()
    # rotated labels need room: about 0.04 in per character at 7 pt, times sin(30 deg)
    bottom = 0.6 + (0.035 * max((len(n) for n in names), default=1) if long else 0)
    fixed_margins(fig, left_in=0.7, right_in=2.3, top_in=0.35, bottom_in=bottom)
    if len(summary) == 0:
        return _empty(fig, ax, "no ops")
    x = np.arange(len(summary))
    bottom = np.zeros(len(summary))
    for p in PARTS:
        v = summary[p].to_numpy(dtype=float) / 1e6
        # a part no rank has (no communication on one GPU) stays out of the legend
        ax.bar(x, v, bottom=bottom, color=PART_COLORS[p], width=0.75,
               label=PART_LABELS[p] if (v > 0).any() else "_nolegend_")
        bottom += v
    ax.set_xticks(x, names, fontsize=7, rotation=30 if long else 0, ha="right" if long else
                  "center")
    ax.set_xlabel("rank" if labels is None else "rank (identical ranks drawn once)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    handles, labs = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labs[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    return fig


def plot_timeline(ops: pd.DataFrame, lanes: pd.DataFrame, *, window_ns: tuple[int, int] | None
                  = None, critical_op_ids: np.ndarray | None = None, max_lanes: int = 48,
                  title: str = "Timeline (ranks x lanes)") -> Figure:
    """Gantt chart of ops on (rank, lane) rows in a time window; critical-path ops outlined.

    ``ops`` needs ``op_id``, ``rank``, ``lane``, ``kind``, ``start_ns``, ``dur_ns``
    (``Trace.ops``); ``lanes`` is ``Trace.lanes``. The window defaults to the full span.
    """
    n_rows = min(int(ops["lane"].nunique()), max_lanes) if len(ops) else 1
    fig = Figure(figsize=(10, max(3.0, 1.2 + 0.16 * n_rows)), layout="constrained")
    ax = fig.add_subplot()
    if len(ops) == 0:
        return _empty(fig, ax, "no ops")
    s = ops["start_ns"].to_numpy()
    e = s + ops["dur_ns"].to_numpy()
    lo, hi = window_ns if window_ns is not None else (int(s.min()), int(e.max()))
    m = (e >= lo) & (s <= hi)
    sub = ops.loc[m]
    used = np.unique(sub["lane"].to_numpy())
    lk = lanes.set_index("lane")
    used = sorted(used, key=lambda ln: (int(lk.loc[ln, "rank"]), int(lk.loc[ln, "lane_kind"]), ln))
    used = used[:max_lanes]
    row = {ln: i for i, ln in enumerate(used)}
    sub = sub[sub["lane"].isin(used)]
    y = np.array([row[ln] for ln in sub["lane"].to_numpy()], float)
    left = (np.maximum(sub["start_ns"].to_numpy(), lo) - lo) / 1e6
    width = (np.minimum(sub["start_ns"].to_numpy() + sub["dur_ns"].to_numpy(), hi)
             - np.maximum(sub["start_ns"].to_numpy(), lo)) / 1e6
    colors = [_KIND_COLORS.get(int(k), "#999999") for k in sub["kind"].to_numpy()]
    # one PolyCollection for all boxes: per-patch bars are far too slow for 10k ops
    w = np.maximum(width, (hi - lo) / 1e6 * 1e-4)
    ax.add_collection(PolyCollection(_boxes(left, w, y, 0.35), facecolors=colors,
                                     linewidths=0, rasterized=True))
    if critical_op_ids is not None and len(critical_op_ids):
        c = sub["op_id"].isin(np.asarray(critical_op_ids)).to_numpy()
        if c.any():
            ax.add_collection(PolyCollection(_boxes(left[c], w[c], y[c], 0.45),
                                             facecolors="none", edgecolors="black",
                                             linewidths=1.0, label="critical path"))
            ax.legend(fontsize=7, loc="upper right")
    ax.set_xlim(0, (hi - lo) / 1e6)
    ax.set_ylim(-0.6, max(len(used), 1) - 0.4)
    labels = [f"r{int(lk.loc[ln, 'rank'])} {str(lk.loc[ln, 'name'])[:18] or ln}" for ln in used]
    ax.set_yticks(np.arange(len(used)), labels, fontsize=6 if len(used) > 24 else 7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time (ms) from {lo / 1e6:.3f} ms")
    ax.set_title(title)
    return fig


def plot_collectives(coll: pd.DataFrame, *, title: str = "Collectives: size vs bus bandwidth"
                     ) -> Figure:
    """Scatter of message size vs busbw per collective instance (:func:`analysis.comm.collectives`)."""
    from .plots_timeline import fixed_margins

    fig = Figure(figsize=(8, 3.2))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=0.7, right_in=0.2, top_in=0.35, bottom_in=0.55)
    c = coll[(coll["bytes"] > 0) & coll["busbw_gbps"].notna()] if len(coll) else coll
    if len(c) == 0:
        return _empty(fig, ax, "no collectives with known size")
    for op, g in c.groupby("comm_op", sort=True):
        ax.scatter(g["bytes"].to_numpy(), g["busbw_gbps"].to_numpy(), s=10, alpha=0.7,
                   label=str(op).lower().replace("_", "-"))
    ax.set_xscale("log")
    ax.set_xlabel("message size (bytes)", fontsize=8)
    ax.set_ylabel("bus bandwidth (GB/s)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=7, title="primitive", title_fontsize=7, frameon=False)
    return fig


def plot_bubbles(stage_bub: pd.DataFrame, *, title: str = "Pipeline bubble per stage") -> Figure:
    """Bars of measured (and ideal GPipe/1F1B) bubble fraction per stage."""
    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    if len(stage_bub) == 0:
        return _empty(fig, ax, "no pipeline stages")
    x = np.arange(len(stage_bub))
    ax.bar(x - 0.2, stage_bub["bubble_frac"].to_numpy(float) * 100, width=0.4, label="measured")
    ideal = stage_bub["ideal_bubble_frac"].to_numpy(float) * 100
    if np.isfinite(ideal).any():
        ax.bar(x + 0.2, np.nan_to_num(ideal), width=0.4, label="ideal (p-1)/(m+p-1)")
    ax.set_xticks(x, [str(s) if s >= 0 else "n/a" for s in stage_bub["stage"]])
    ax.set_xlabel("stage")
    ax.set_ylabel("bubble (% of step)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return fig


def plot_memory(timeline: pd.DataFrame, peaks: pd.DataFrame | None = None, *,
                title: str = "Device memory allocated") -> Figure:
    """Allocated memory over time (GiB): one line per rank up to 10 ranks; beyond, the rank
    with the highest peak of each pipeline stage (or the four highest ranks), named in the
    legend. With no timeline, bars of the peaks."""
    from .plots_timeline import fixed_margins

    fig = Figure(figsize=(10, 3.0))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=0.7, right_in=1.6, top_in=0.35, bottom_in=0.55)
    if len(timeline):
        t0 = timeline["ts_ns"].min()
        peak = timeline.groupby("rank")["allocated_bytes"].max()
        ranks = list(peak.index)
        label = {int(r): f"rank {r}" for r in ranks}
        if len(ranks) > 10:
            if peaks is not None and "stage" in peaks and (peaks["stage"] >= 0).any():
                st = peaks.set_index("rank")["stage"].reindex(peak.index)
                top = peak.groupby(st.to_numpy()).idxmax()
                ranks = [int(top[s]) for s in sorted(top.index)][:10]
                label = {int(top[s]): f"stage {s} (rank {int(top[s])})" for s in top.index}
            else:
                ranks = list(peak.sort_values(ascending=False).index[:4])
        for r, g in timeline[timeline["rank"].isin(ranks)].groupby("rank", sort=True):
            ax.step((g["ts_ns"].to_numpy() - t0) / 1e6, g["allocated_bytes"].to_numpy() / 2**30,
                    where="post", label=label[int(r)], linewidth=0.8)
        ax.set_xlabel("time from the first sample (ms)", fontsize=8)
        ax.set_ylabel("allocated (GiB)", fontsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    elif peaks is not None and len(peaks):
        if "stage" in peaks and (peaks["stage"] >= 0).any():  # per pipeline stage
            g = peaks.groupby("stage", sort=True)["peak_allocated_bytes"].max()
            ax.bar(np.arange(len(g)), g.to_numpy(float) / 2**30)
            ax.set_xticks(np.arange(len(g)), [str(s) for s in g.index])
            ax.set_xlabel("pipeline stage")
        else:
            ax.bar(np.arange(len(peaks)), peaks["peak_allocated_bytes"].to_numpy(float) / 2**30)
            ax.set_xticks(np.arange(len(peaks)), [str(r) for r in peaks["rank"]])
            ax.set_xlabel("rank")
        ax.set_ylabel("peak allocated (GiB)", fontsize=8)
    else:
        return _empty(fig, ax, "no memory samples in this trace")
    ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    return fig


def plot_kernel_classes(cls: pd.DataFrame, *, title: str = "Device time by kernel class"
                        ) -> Figure:
    """Horizontal bars of total time (ms) per kernel class (:func:`analysis.kernels.class_stats`)."""
    fig = Figure(figsize=(6, 2.8), layout="constrained")
    ax = fig.add_subplot()
    if len(cls) == 0 or cls["total_ns"].sum() == 0:
        return _empty(fig, ax, "no device ops")
    ax.barh(cls["kernel_class"].astype(str), cls["total_ns"].to_numpy(float) / 1e6,
            color="#4C72B0")
    ax.invert_yaxis()
    ax.set_xlabel("total time (ms)")
    ax.set_title(title)
    return fig


def plot_compare(cmp: pd.DataFrame, *, metrics: list[str] | None = None,
                 title: str = "Baseline vs candidate") -> Figure:
    """Grouped bars of selected time metrics (ms) from :func:`analysis.compare.compare`."""
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    if len(cmp) == 0:
        return _empty(fig, ax, "nothing to compare")
    a, b = cmp.columns[1], cmp.columns[2]
    if metrics is None:
        metrics = [m for m in ["step_ns", *PARTS, "critical_path_ns"] if m in set(cmp["metric"])]
    sub = cmp.set_index("metric").reindex(metrics)
    x = np.arange(len(metrics))
    ax.bar(x - 0.2, sub[a].to_numpy(float) / 1e6, width=0.4, label=str(a))
    ax.bar(x + 0.2, sub[b].to_numpy(float) / 1e6, width=0.4, label=str(b))
    ax.set_xticks(x, [m.replace("_ns", "") for m in metrics], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return fig


def plot_waterfall(steps: pd.DataFrame, *, labels: tuple[str, str] = ("baseline", "this run"),
                   title: str = "What changed in the step") -> Figure:
    """Step-time waterfall: the first bar is the baseline step, then one floating bar per
    part (``steps`` has ``part`` in words, ``delta_ns``, ``color``), then this run's step.
    Bars go up for parts that grew and down for parts that shrank (ms)."""
    from .plots_timeline import fixed_margins

    fig = Figure(figsize=(10, 3.3))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=0.75, right_in=0.25, top_in=0.45, bottom_in=0.65)
    if len(steps) == 0:
        return _empty(fig, ax, "nothing to compare")
    base = float(steps.attrs["baseline_ns"]) / 1e6
    cand = float(steps.attrs["candidate_ns"]) / 1e6
    d = steps["delta_ns"].to_numpy(dtype=float) / 1e6
    level = base + np.concatenate([[0.0], np.cumsum(d)[:-1]])
    x = np.arange(len(d) + 2)
    ax.bar(0, base, color="#7F7F7F", width=0.6)
    ax.bar(x[1:-1], d, bottom=level, width=0.6,
           color=["#C44E52" if v > 0 else "#55A868" for v in d])
    ax.bar(x[-1], cand, color="#4C72B0", width=0.6)
    span = max(abs(base), abs(cand), 1e-9)
    # every label in the same decimals (the steps' 4 significant digits), an unchanged part
    # reads "0": "+2.571", "-0.033", "0" beside "66.24" (not "+2.57", "-0.0332", "+0")
    dec = 1 if span >= 100 else 2 if span >= 10 else 3
    for xi, lv, v in zip(x[1:-1], level, d):
        lab = f"{v:+.{dec}f}" if round(v, dec) != 0 else "0"
        ax.text(xi, max(lv, lv + v) + span * 0.015, lab, ha="center", va="bottom",
                fontsize=6.5)
    ax.text(0, base + span * 0.015, f"{base:.{dec}f}", ha="center", va="bottom", fontsize=6.5)
    ax.text(x[-1], cand + span * 0.015, f"{cand:.{dec}f}", ha="center", va="bottom",
            fontsize=6.5)
    names = [labels[0], *steps["part"].tolist(), labels[1]]
    ax.set_xticks(x, names, fontsize=7)
    ax.set_ylabel("step time (ms)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(0, span * 1.12)
    ax.set_title(title, fontsize=9, loc="left")
    from matplotlib.patches import Patch
    handles = [Patch(color="#7F7F7F", label=f"{labels[0]} step"),
               *([Patch(color="#C44E52", label="part grew")] if (d > 0).any() else []),
               *([Patch(color="#55A868", label="part shrank")] if (d < 0).any() else []),
               Patch(color="#4C72B0", label=f"{labels[1]} step")]
    fig.legend(handles=handles, fontsize=7, frameon=False, loc="upper right",
               ncol=len(handles))
    return fig


def plot_rank_deltas(deltas: pd.DataFrame, *, title: str = "Step time change per rank"
                     ) -> Figure:
    """Per rank, the change of its mean step time (ms; ``deltas`` has ``rank`` and
    ``delta_ns``): bars up to 64 ranks, a line beyond."""
    from .plots_timeline import fixed_margins

    fig = Figure(figsize=(10, 2.6))
    ax = fig.add_subplot()
    fixed_margins(fig, left_in=0.75, right_in=0.25, top_in=0.4, bottom_in=0.5)
    if len(deltas) == 0:
        return _empty(fig, ax, "no rank in both runs")
    r = deltas["rank"].to_numpy()
    d = deltas["delta_ns"].to_numpy(dtype=float) / 1e6
    if len(r) <= 64:
        ax.bar(np.arange(len(r)), d, color=["#C44E52" if v > 0 else "#55A868" for v in d],
               width=0.7)
        step = max(1, len(r) // 32)
        ax.set_xticks(np.arange(len(r))[::step], [str(v) for v in r[::step]], fontsize=7)
    else:
        ax.plot(r, d, color="#4C72B0", lw=0.8)
        ax.fill_between(r, d, 0, where=d > 0, color="#C44E52", alpha=0.4, lw=0)
        ax.fill_between(r, d, 0, where=d <= 0, color="#55A868", alpha=0.4, lw=0)
        ax.tick_params(axis="x", labelsize=7)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("rank", fontsize=8)
    ax.set_ylabel("change (ms)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    from matplotlib.patches import Patch
    # only the directions some rank took (every rank faster: no "slower" entry)
    handles = [Patch(color=c, label=lab) for c, lab, has in
               (("#C44E52", "slower", (d > 0).any()), ("#55A868", "faster", (d <= 0).any()))
               if has]
    fig.legend(handles=handles, fontsize=7, frameon=False, loc="upper right", ncol=2)
    return fig
