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
from .report import Section, _table, fmt_ns, fmt_pct
from .roofline import roofline

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
                             f"{eff.get('captured_launches', 0)} kernel launches"})
    df = pd.DataFrame(rows)
    base = df.loc[0, "host_bound_ns"]
    df["host_bound_removed_frac"] = [(base - v) / base if base and v is not None else None
                                     for v in df["host_bound_ns"]]
    return df


def drilldown_sections(x: Any, fm: dict[str, Any] | None = None) -> list[Section]:
    """Host overhead (+ CUDA-graph what-if), attribution tree and roofline sections."""
    t = as_trace(x)
    fm = dict(fm or {})
    fm.update({k: fmt_ns for k in ("launch_call_ns", "cpu_ns_per_launch", "host_busy_ns",
                                   "host_ns_per_launch", "latency_p50_ns", "latency_p90_ns",
                                   "latency_p99_ns", "queue_p50_ns", "host_bound_ns",
                                   "device_incl_ns", "host_incl_ns", "launch_ns", "total_ns",
                                   "mean_ns", "ns_per_launch", "device_ns", "roof_ns",
                                   "gap_ns", "step_ns")})
    fm.update({k: fmt_pct for k in ("launch_bound_frac", "host_bound_frac", "share",
                                    "efficiency", "step_share", "host_bound_removed_frac")})
    return [_host_section(x, t, fm), _tree_section(t, fm), _roofline_section(t, fm)]


def _host_section(x, t, fm) -> Section:
    s = Section("Host overhead and CUDA graphs",
                "Launches are runtime calls linked to GPU ops; latency = GPU op start - "
                "launch call start; launch-bound ops started after the device had gone "
                "idle waiting for them. The what-if captures regions as CUDA graphs "
                "(hardware.cuda_graphs): their launch-only host work becomes one graph "
                "launch, host syncs and CPU math stay.")
    try:
        h = host_overhead(t)
        lat = launch_latency(t)
    except RetimeError as exc:
        s.text += f" Not available: {exc}"
        return s
    if h["launches"].sum() == 0:
        s.text += " The trace records no launch calls linked to GPU ops."
        return s
    s.tables.append(("Launch overhead per rank and step", *_table(h, fm, limit=32)))
    s.tables.append(("Costliest host operators (inclusive, all ranks)",
                     *_table(host_ops(t, top=12), fm)))
    if len(t.ops) <= _MAX_WHATIF_OPS:
        s.tables.append(("CUDA-graph what-if (summed over ranks and steps)",
                         *_table(cuda_graph_whatif(x), fm)))
    s.figures.append(("Launch-to-start latency", dp.plot_launch_latency(lat)))
    return s


def _tree_section(t, fm) -> Section:
    s = Section("Attribution tree",
                "step -> phase -> module / annotation -> operator -> kernel, from the trace's "
                "own annotations; device time adds up exactly to the GPU op totals, host "
                "time to the outermost host events.")
    try:
        h = hierarchy(t)
    except RetimeError as exc:
        s.text += f" Not available: {exc}"
        return s
    top = h[(h["depth"] <= 4) & (h["device_incl_ns"] >= 0.02 * max(h["device_incl_ns"].iloc[0], 1))]
    s.tables.append(("Largest nodes (depth <= 4, >= 2% of device time)", *_table(
        top[["depth", "level", "path", "count", "device_incl_ns", "host_incl_ns", "launches",
             "launch_ns"]], fm, limit=30)))
    s.figures.append(("Icicle by device time", dp.plot_hierarchy(h)))
    return s


def _roofline_section(t, fm) -> Section:
    s = Section("Roofline per operator",
                "FLOPs and bytes from recorded shapes (or the synthesized run's kernels); gap "
                "= device time above the roof, the most a faster kernel could win.")
    try:
        r = roofline(t)
    except RetimeError as exc:
        s.text += f" Not available: {exc}"
        return s
    pk = r.attrs["peaks"]
    s.text += (f" Peaks: {pk['name']} ({pk['source']}), HBM {pk['hbm_tbps']:.2f} TB/s.")
    cols = ["op", "shapes", "dtype", "count", "device_ns", "achieved_tflops", "achieved_gbps",
            "roof_ns", "gap_ns", "efficiency", "bound", "step_share"]
    s.tables.append(("Operators losing the most time to the roof", *_table(r[cols], fm,
                                                                             limit=15)))
    main_dt = r.groupby("dtype")["device_ns"].sum().idxmax()
    peaks = {"name": f"{pk['name']} {main_dt}", "peak_tflops": r.loc[r["dtype"] == main_dt,
                                                                    "peak_tflops"].iloc[0],
             "hbm_tbps": pk["hbm_tbps"]}
    s.figures.append(("Roofline", dp.plot_roofline(r, peaks)))
    return s
