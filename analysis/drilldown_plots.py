"""Plots of the drill-down analyses: host overhead, the attribution tree, the roofline.

Each function takes the frame of its analysis (:mod:`analysis.host`,
:mod:`analysis.hierarchy`, :mod:`analysis.roofline`) and returns a matplotlib Figure
(created directly, no pyplot state), as :mod:`analysis.plots` does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

__all__ = ["plot_launch_latency", "plot_host_ops", "plot_hierarchy", "plot_roofline"]

_LEVEL_COLORS = {"root": "#9A9A9A", "step": "#8C8C8C", "phase": "#64B5CD", "layer": "#8172B2",
                 "module": "#55A868", "annotation": "#CCB974", "operator": "#DD8452",
                 "kernel": "#4C72B0"}


def _empty(fig: Figure, ax, msg: str) -> Figure:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def plot_launch_latency(lat: pd.DataFrame, *, title: str = "Launch-to-start latency"
                        ) -> Figure:
    """Histogram (log x) of launch-to-start latency from :func:`analysis.host.launch_latency`,
    launch-bound GPU ops (the device waited for their launch) apart from queued ones."""
    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.add_subplot()
    if len(lat) == 0:
        return _empty(fig, ax, "no launch calls linked to GPU ops")
    from matplotlib.ticker import FuncFormatter

    ns = np.maximum(lat["latency_ns"].to_numpy(dtype=float), 1.0)
    # the unit of the table beside it: ms once the median latency is a millisecond or more
    unit, scale = ("ms", 1e6) if np.median(ns) >= 1e6 else ("µs", 1e3)
    x = ns / scale
    bins = np.logspace(np.log10(x.min()), np.log10(max(x.max(), x.min() * 1.01)), 40)
    lb = lat["launch_bound"].to_numpy(bool)
    ax.hist([x[lb], x[~lb]], bins=bins, stacked=True, color=["#DD8452", "#4C72B0"],
            label=[f"launch-bound ({lb.sum():,})" if lb.any() else "_nolegend_",
                   f"queued ({(~lb).sum():,})" if (~lb).any() else "_nolegend_"])
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    if x.max() < 10 * x.min():  # under a decade only minor ticks are labelled: plainly too,
        # 2, 3 and 5 of each decade only (0.9 beside 1 ran into it)
        ax.xaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** np.floor(np.log10(v)), 6)
            in (2.0, 3.0, 5.0) else ""))
    ax.set_xlabel(f"GPU op start - launch call start ({unit}, log scale)")
    ax.set_ylabel("GPU ops")
    ax.set_title(title)
    ax.legend(fontsize=7, frameon=False)
    return fig


def plot_host_ops(ops: pd.DataFrame, *, title: str = "Costliest host operators") -> Figure:
    """Horizontal bars of inclusive host time (ms) from :func:`analysis.host.host_ops`."""
    fig = Figure(figsize=(7, 0.3 * max(len(ops), 3) + 1), layout="constrained")
    ax = fig.add_subplot()
    if len(ops) == 0:
        return _empty(fig, ax, "no operator events")
    d = ops.iloc[::-1]
    y = np.arange(len(d))
    ax.barh(y, d["total_ns"].to_numpy(float) / 1e6, color="#55A868")
    ax.set_yticks(y, [str(n)[:50] for n in d["name"]], fontsize=7)
    ax.set_xlabel("inclusive host time (ms, all ranks)")
    ax.set_title(title)
    return fig


def plot_hierarchy(tree: pd.DataFrame, *, metric: str = "device_incl_ns", max_depth: int = 6,
                   title: str | None = None) -> Figure:
    """Icicle chart of :func:`analysis.hierarchy.hierarchy`: one row per depth, each node as
    wide as its share of ``metric`` (``device_incl_ns`` or ``host_incl_ns``), nested under
    its parent; colors by level, names on nodes wide enough to read."""
    fig = Figure(figsize=(10, 0.55 * (max_depth + 1) + 1), layout="constrained")
    ax = fig.add_subplot()
    if len(tree) == 0 or float(tree[metric].iloc[0]) <= 0:
        return _empty(fig, ax, f"nothing to show ({metric} is 0)")
    tot = float(tree[metric].iloc[0])
    x0 = {}
    nxt: dict[int, float] = {}
    boxes, colors, labels = [], [], []
    for nid, pid, dep, lev, name, v in zip(tree["node_id"], tree["parent_id"], tree["depth"],
                                           tree["level"], tree["name"], tree[metric],
                                           strict=True):
        if dep > max_depth:
            continue
        w = float(v) / tot
        left = 0.0 if pid < 0 else nxt.get(int(pid), x0.get(int(pid), 0.0))
        if pid >= 0:
            nxt[int(pid)] = left + w
        x0[int(nid)] = left
        if w <= 0:
            continue
        y = -float(dep)
        boxes.append([(left, y - 0.45), (left + w, y - 0.45), (left + w, y + 0.45),
                      (left, y + 0.45)])
        colors.append(_LEVEL_COLORS.get(str(lev), "#CFCFCF"))
        if w > 0.06:  # about 120 characters of 7.5 pt across the axes; a cut name says so
            room = max(4, int(w * 120))
            nm = str(name)
            labels.append((left + w / 2, y, nm if len(nm) <= room else nm[:room - 1] + "…"))
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="white",
                                     linewidths=0.4))
    for x, y, s in labels:
        ax.text(x, y, s, ha="center", va="center", fontsize=7.5, clip_on=True)
    ax.set_xlim(0, 1)
    depth = min(int(tree["depth"].max()), max_depth)
    ax.set_ylim(-depth - 0.6, 0.6)
    ax.set_yticks([-d for d in range(depth + 1)], [str(d) for d in range(depth + 1)])
    ax.set_ylabel("depth")
    ax.set_xlabel(f"share of {metric.replace('_incl_ns', '')} time")
    ax.set_title(title or f"Attribution tree ({metric.replace('_incl_ns', '')} time)")
    from matplotlib.patches import Patch
    seen = [lv for lv in _LEVEL_COLORS if lv in set(map(str, tree["level"]))]
    ax.legend(handles=[Patch(color=_LEVEL_COLORS[lv], label=lv) for lv in seen], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def plot_roofline(ops: pd.DataFrame, peaks: dict, *, title: str = "Roofline per operator"
                  ) -> Figure:
    """Log-log roofline: each operator group of :func:`analysis.roofline.roofline` at its
    arithmetic intensity and achieved TFLOP/s (size by device time), under the roof
    ``min(peak_tflops, intensity * hbm_tbps)`` of ``peaks``."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    d = ops[(ops["flops"] > 0) & (ops["bytes"] > 0) & (ops["device_ns"] > 0)]
    if len(d) == 0:
        return _empty(fig, ax, "no operators with recorded shapes")
    ai = d["intensity"].to_numpy(float)
    perf = d["achieved_tflops"].to_numpy(float)
    pk, bw = float(peaks["peak_tflops"]), float(peaks["hbm_tbps"])
    lo, hi = min(ai.min(), pk / bw) / 4, max(ai.max(), pk / bw) * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, np.minimum(pk, xs * bw), color="black", lw=1.2, label=f"roof ({peaks['name']})")
    size = 20 + 300 * d["device_ns"].to_numpy(float) / d["device_ns"].max()
    sc = ax.scatter(ai, perf, s=size, c=d["gap_ns"].to_numpy(float) / 1e6, cmap="viridis",
                    alpha=0.8, edgecolors="none")
    fig.colorbar(sc, ax=ax, label="time above the roof (ms)")
    # the 5 operators losing most time, one label per spot: points within 0.2 decades of a
    # labelled one join its label (names once each) instead of printing over it
    spots: list[list] = []  # [log x, log y, names]
    for _, r in d.nlargest(5, "gap_ns").iterrows():
        lx, ly = np.log10(r["intensity"]), np.log10(max(r["achieved_tflops"], 1e-12))
        name = str(r["op"])[:24]
        near = next((sp for sp in spots if abs(sp[0] - lx) < 0.2 and abs(sp[1] - ly) < 0.2),
                    None)
        if near is None:
            spots.append([lx, ly, [name]])
        elif name not in near[2]:
            near[2].append(name)
    llo, lhi = np.log10(lo), np.log10(hi)
    for lx, ly, names in spots:
        label = ", ".join(names[:2]) + (f" +{len(names) - 2} more" if len(names) > 2 else "")
        # a label that would run past the right edge goes to the left of its spot (about
        # 3.3 pt a character at 6 pt over some 340 pt of axes), and no label takes part in
        # the layout: a long one would squeeze the axes into a strip
        right = (lx - llo) / (lhi - llo) + 3.3 * len(label) / 340.0 > 0.97
        ax.annotate(label, (10 ** lx, 10 ** ly), textcoords="offset points",
                    xytext=(-5 if right else 5, 4), ha="right" if right else "left",
                    fontsize=6, annotation_clip=True, in_layout=False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    return fig
