"""Report sections of the drill-down analyses: host overhead with the CUDA-graph what-if,
the attribution tree and the roofline (kept apart from :mod:`analysis.report`'s layout;
:func:`drilldown_sections` is its one hook).

Each section is built on its own: an analysis the trace cannot support (no launch calls,
no recorded shapes, an unknown GPU) becomes a section that says why instead of failing the
report.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from retime.collectors.errors import RetimeError

from . import drilldown_plots as dp
from ._util import as_trace
from .breakdown import breakdown
from .hierarchy import hierarchy
from .host import host_ops, host_overhead, launch_latency
from .report_model import Fig, Section
from .roofline import roofline
from .tables import Column, people_table

__all__ = ["drilldown_sections", "cuda_graph_whatif"]

#: what-ifs on traces larger than this are left out of the report (each replays the trace)
_MAX_WHATIF_OPS = 2_000_000


def cuda_graph_whatif(x: Any) -> pd.DataFrame:
    """Step time and host-bound time (summed over ranks and steps) measured, with the
    forward/backward captured and with the whole step captured (``hardware.cuda_graphs``);
    modes the trace cannot support carry their refusal in ``note``."""
    from retime.replay import whatif
    t = as_trace(x)
    bd = breakdown(t)
    rows = [{"scenario": "measured", "step_ns": int(bd["step_ns"].sum()),
             "host_bound_ns": int(bd["host_bound_ns"].sum()), "note": ""}]
    for mode in ("forward_backward", "step"):
        try:
            w = whatif(t, {"hardware.cuda_graphs": mode})
        except RetimeError as exc:
            rows.append({"scenario": f"cuda_graphs={mode}", "step_ns": None,
                         "host_bound_ns": None, "note": str(exc)})
            continue
        b = breakdown(w)
        eff = w.meta["scenario"][-1].get("cuda_graphs_effect", {})
        rows.append({"scenario": f"cuda_graphs={mode}", "step_ns": int(b["step_ns"].sum()),
                     "host_bound_ns": int(b["host_bound_ns"].sum()),
                     "note": f"{eff.get('graphs', 0)} graph launches replace "
                             f"{eff.get('captured_launches', 0)} kernel launches"
                             + ("; no step markers: the whole trace is one region, cut at "
                                "host syncs" if "no step marks" in str(eff.get("regions", ""))
                                else "")})
    df = pd.DataFrame(rows)
    base = df.loc[0, "host_bound_ns"]
    df["host_bound_removed_frac"] = [(base - v) / base if base and v is not None else None
                                     for v in df["host_bound_ns"]]
    return df


def drilldown_sections(x: Any) -> list[Section]:
    """Host overhead (+ CUDA-graph what-if), attribution tree and roofline sections; a
    section the trace cannot support (no launches, no annotations, no shapes) is left out."""
    t = as_trace(x)
    return [s for s in (_host_section(x, t), _tree_section(t), _roofline_section(t))
            if s is not None]


def _host_section(x, t) -> Section | None:
    try:
        h = host_overhead(t)
        lat = launch_latency(t)
    except RetimeError:
        return None
    if h["launches"].sum() == 0:
        return None
    s = Section("host", "Host overhead and CUDA graphs", [
        "Launches are runtime calls linked to GPU ops; latency = GPU op start - launch call "
        "start; launch-bound ops started after the device had gone idle waiting for them. "
        "The what-if captures regions as CUDA graphs (hardware.cuda_graphs): their "
        "launch-only host work becomes one graph launch, host syncs and CPU math stay."])
    s.blocks.append(people_table(h, [
        Column("rank", "Rank", "count"),
        Column("step", "Step", lambda v: "whole trace" if int(v) < 0 else f"{int(v):,}"),
        Column("launches", "Launches", "count"),
        Column("gpu_ops", "GPU ops they start", "count"),
        Column("cpu_ns_per_launch", "CPU time per launch", "time"),
        Column("latency_p50_ns", "Launch-to-start latency, median", "time"),
        Column("launch_bound_frac", "GPU ops waiting on the host", "pct"),
        Column("host_bound_frac", "Step host-bound", "pct")],
        caption="Launch overhead per rank and step", top=16, what="rank-steps",
        csv_name="launch_overhead"))
    ho = host_ops(t, top=12)
    if len(ho):
        cols = [Column("name", "Operator", "name"), Column("count", "Calls", "count"),
                Column("total_ns", "Host time, inclusive", "time"),
                Column("mean_ns", "Mean per call", "time"),
                Column("launches", "Launches", "count"),
                Column("ns_per_launch", "Host time per launch", "time"),
                Column("share", "Share of host time", "pct")]
        s.blocks.append(people_table(ho, cols, caption="Costliest host operators (inclusive, "
                                                        "all ranks)"))
    if len(t.ops) <= _MAX_WHATIF_OPS:
        cg = cuda_graph_whatif(x)
        nm = bool(len(h)) and bool((h["step"] < 0).all())  # no step markers
        s.blocks.append(people_table(cg, [
            Column("scenario", "Scenario", "text"),
            Column("step_ns", "Whole trace, summed" if nm else "Step time, summed", "time"),
            Column("host_bound_ns", "Host-bound time, summed", "time"),
            Column("host_bound_removed_frac", "Host-bound time removed", "pct"),
            Column("note", "Note", "text")],
            caption="CUDA-graph what-if (" + ("whole trace, summed over ranks; no step "
                                              "markers" if nm else "summed over ranks and "
                                              "steps") + ")"))
    s.blocks.append(Fig("launch_latency", "Launch-to-start latency of the GPU ops.",
                        dp.plot_launch_latency(lat)))
    return s


def _tree_section(t) -> Section | None:
    try:
        h = hierarchy(t)
    except RetimeError:
        return None
    if not len(h) or h["device_incl_ns"].iloc[0] <= 0:
        return None
    s = Section("tree", "Attribution tree", [
        "step -> phase -> module / annotation -> operator -> kernel, from the trace's own "
        "annotations; device time adds up exactly to the GPU op totals, host time to the "
        "outermost host events."])
    top = h[(h["depth"] <= 4) & (h["device_incl_ns"] >= 0.02 * max(h["device_incl_ns"].iloc[0], 1))]
    s.blocks.append(people_table(top, [
        Column("depth", "Depth", "count"), Column("level", "Level", "text"),
        Column("path", "Path", "name"), Column("count", "Count", _instances),
        Column("device_incl_ns", "Device time, inclusive", "time"),
        Column("host_incl_ns", "Host time, inclusive", "time"),
        Column("launches", "Launches", "count"), Column("launch_ns", "Launch time", "time")],
        caption="Largest nodes (depth <= 4, >= 2% of device time)", top=30, what="nodes",
        csv_name="attribution_tree", csv_frame=h))
    s.blocks.append(Fig("icicle", "Icicle of the attribution tree by device time.",
                        dp.plot_hierarchy(h)))
    return s


def _instances(n) -> str:
    """A node's merged instances; a step or phase node groups instances but is none itself
    (its count is 0): left blank rather than read as "nothing ran"."""
    return f"{int(n):,}" if n else ""


def _roofline_section(t) -> Section | None:
    try:
        r = roofline(t)
    except RetimeError:
        return None
    if not len(r):
        return None
    pk = r.attrs["peaks"]
    s = Section("roofline", "Roofline per operator", [
        "FLOPs and bytes from recorded shapes (or the synthesized run's kernels); gap = device "
        "time above the roof, the most a faster kernel could win. "
        f"Peaks: {pk['name']} ({pk['source']}), HBM {pk['hbm_tbps']:.2f} TB/s."])
    # a synthesized run's kernels carry no recorded shapes: no column of blanks then
    shapes = r["shapes"].fillna("").astype(str).str.strip().ne("").any() if "shapes" in r else False
    s.blocks.append(people_table(r, [
        Column("op", "Operator", "name"),
        *([Column("shapes", "Shapes", "text")] if shapes else []),
        Column("dtype", "Type", "text"), Column("count", "Count", "count"),
        Column("device_ns", "Device time", "time"),
        Column("achieved_tflops", "Achieved TFLOP/s", "num"),
        Column("achieved_gbps", "Achieved bandwidth", "gbps"),
        Column("roof_ns", "Time at the roof", "time"), Column("gap_ns", "Gap to the roof", "time"),
        Column("efficiency", "Efficiency", "pct"), Column("bound", "Bound by", "text"),
        Column("step_share", "Share of the step", "pct")],
        caption="Operators losing the most time to the roof", top=15, what="operators",
        csv_name="roofline"))
    main_dt = r.groupby("dtype")["device_ns"].sum().idxmax()
    peaks = {"name": f"{pk['name']} {main_dt}", "peak_tflops": r.loc[r["dtype"] == main_dt,
                                                                    "peak_tflops"].iloc[0],
             "hbm_tbps": pk["hbm_tbps"]}
    s.blocks.append(Fig("roofline", "Achieved rate against arithmetic intensity, one point per "
                        "operator; lines: the roofs.", dp.plot_roofline(r, peaks)))
    return s
