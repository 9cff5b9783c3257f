"""Host (launch) overhead: how much of a step the GPU spends waiting for the CPU to issue work.

Definitions (per rank and step; steps as in :func:`analysis._util.step_windows`):

* a *launch* is a runtime call on a CPU thread with a ``LAUNCH`` edge to a GPU op
  (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``ncclKernel`` launches, HIP equivalents);
* *launch-to-start latency* of a GPU op = its start minus its launch call's start; its
  *queue time* = start minus the launch call's end (how long it sat in the stream);
* a GPU op is *launch-bound* when its launch call ended after every earlier GPU op of its
  device had finished: the device was idle, waiting for the host to issue it;
* ``host_bound_ns`` / ``host_bound_frac`` come from :func:`analysis.breakdown`: device idle
  while the host is busy (the GPU-waits-on-host share of the step);
* ``host_ns_per_launch`` = host busy time of the step's launching threads (the union of
  leaf host ops and operator ranges, ``ns::op``: CPU time in the framework, not Python
  between operators) over its launches.

:func:`host_ops` ranks the operators (outermost operator ranges and leaf operators on CPU
threads) by inclusive host time, with the launches they issued.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import EdgeKind, LaneKind, OpKind

from ._util import _memo, as_trace, op_ends_ns, step_windows
from .breakdown import breakdown

__all__ = ["launch_latency", "host_overhead", "host_ops"]

_PCTS = (50, 90, 99)


def _lane_kinds(t) -> np.ndarray:
    lanes = t.lanes
    lk = np.full(int(lanes["lane"].max()) + 1 if len(lanes) else 1, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    return lk


def launch_latency(x: Any) -> pd.DataFrame:
    """One row per launched GPU op: ``rank``, ``step``, ``op_id``, ``name``, ``launch_op``,
    ``launch_start_ns``, ``launch_end_ns``, ``start_ns``, ``latency_ns`` (start - launch
    start), ``queue_ns`` (start - launch end) and ``launch_bound`` (module docstring)."""
    t = as_trace(x)
    # the host section, host_overhead and host_ops all ask: once per memo scope; a shallow
    # copy (a million rows on large runs), so a caller's new columns stay its own
    return _memo(t, "launch_latency", lambda: _launch_latency(t)).copy(deep=False)


def _launch_latency(t) -> pd.DataFrame:
    o = t.ops
    e = t.edges
    kind = o["kind"].to_numpy()
    lk = _lane_kinds(t)
    lane = o["lane"].to_numpy()
    on_cpu = lk[lane] == LaneKind.CPU_THREAD if len(o) else np.zeros(0, bool)
    es, ed, ek = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    m = (ek == EdgeKind.LAUNCH) & on_cpu[es] & ~on_cpu[ed] & (kind[es] == OpKind.RUNTIME)
    src, dst = es[m], ed[m]
    if len(dst):  # one launch per GPU op (the first, should a trace hold two)
        dst, first = unique(dst, return_index=True)
        src = src[first]
    start = o["start_ns"].to_numpy()
    end = op_ends_ns(t)
    rank = o["rank"].to_numpy()
    prev_busy = np.full(len(o), np.iinfo(np.int64).min, np.int64)
    # device busy frontier: the latest end of any earlier GPU op on the same device; read
    # only at launched ops, so not sorted for a trace without launches (a synthesized run:
    # 2.2 M GPU ops and no host thread at 128 ranks)
    gpu = np.flatnonzero(~on_cpu) if len(o) and len(dst) else np.zeros(0, np.int64)
    if len(gpu):
        lanes = t.lanes
        dev_of_lane = np.full(len(lk), -1, np.int64)
        dev_of_lane[lanes["lane"].to_numpy()] = lanes["device"].to_numpy()
        key = rank[gpu].astype(np.int64) * 65536 + dev_of_lane[lane[gpu]]
        order = gpu[np.lexsort((start[gpu], key))]
        k_ord = rank[order].astype(np.int64) * 65536 + dev_of_lane[lane[order]]
        ends = end[order].astype(np.int64)
        new_dev = np.r_[True, k_ord[1:] != k_ord[:-1]]
        run = ends.copy()
        # running max of ends within each device, shifted by one (earlier ops only)
        offs = np.flatnonzero(new_dev)
        for a, b in zip(offs.tolist(), np.r_[offs[1:], len(run)].tolist(), strict=True):
            run[a:b] = np.maximum.accumulate(run[a:b])
        shifted = np.r_[np.iinfo(np.int64).min, run[:-1]]
        shifted[new_dev] = np.iinfo(np.int64).min
        prev_busy[order] = shifted
    names = np.asarray(t.strings, dtype=object)
    return pd.DataFrame({
        "rank": rank[dst].astype(np.int32),
        "step": o["step"].to_numpy()[dst].astype(np.int32),
        "op_id": dst.astype(np.int64),
        "kind": kind[dst].astype(np.int8),
        "name": names[o["name_id"].to_numpy()[dst]] if len(names) else np.zeros(0, object),
        "launch_op": src.astype(np.int64),
        "launch_start_ns": start[src].astype(np.int64),
        "launch_end_ns": end[src].astype(np.int64),
        "start_ns": start[dst].astype(np.int64),
        "latency_ns": (start[dst] - start[src]).astype(np.int64),
        "queue_ns": (start[dst] - end[src]).astype(np.int64),
        "launch_bound": end[src] >= prev_busy[dst],
    })


def host_overhead(x: Any) -> pd.DataFrame:
    """Launch overhead per rank and step.

    Returns
    -------
    DataFrame with ``rank``, ``step``, ``step_ns``, ``launches`` (launch calls linked to GPU
    ops, each counted once), ``gpu_ops`` (the GPU ops they started: more than ``launches``
    where a graph launch starts many), ``launch_call_ns`` (total time in launch calls), ``cpu_ns_per_launch`` (mean launch call), ``host_busy_ns`` and
    ``host_ns_per_launch`` (launching threads), ``latency_p50_ns`` / ``p90`` / ``p99``
    (launch-to-start), ``queue_p50_ns``, ``launch_bound_ops`` and ``launch_bound_frac``
    (share of launched GPU ops the device waited for), ``host_bound_ns`` and
    ``host_bound_frac`` (device idle while the host works; from the breakdown).
    """
    t = as_trace(x)
    lat = launch_latency(t)
    bd = breakdown(t)
    w = step_windows(t)
    out = bd[["rank", "step", "step_ns", "host_bound_ns"]].copy()
    out["host_bound_frac"] = out["host_bound_ns"] / out["step_ns"].where(out["step_ns"] > 0)
    if len(lat) == 0:
        for c in ("launches", "gpu_ops", "launch_call_ns", "launch_bound_ops", "host_busy_ns"):
            out[c] = 0
        for c in ("cpu_ns_per_launch", "host_ns_per_launch", "latency_p50_ns",
                  "latency_p90_ns", "latency_p99_ns", "queue_p50_ns", "launch_bound_frac"):
            out[c] = np.nan
        return out
    # a launch belongs to the step window its call starts in (GPU ops carry their launch's
    # step already; ops outside every window are not counted)
    lat = lat.assign(call_ns=lat["launch_end_ns"] - lat["launch_start_ns"])
    g = lat.groupby(["rank", "step"], sort=True)
    # one launch call may start many GPU ops (a cudaGraphLaunch: every node of the graph):
    # launches and their call time count each call once
    agg = g.agg(gpu_ops=("op_id", "size"), launches=("launch_op", "nunique"),
                launch_bound_ops=("launch_bound", "sum"))
    agg["launch_call_ns"] = (lat.drop_duplicates("launch_op")
                             .groupby(["rank", "step"], sort=True)["call_ns"].sum())
    for p in _PCTS:
        agg[f"latency_p{p}_ns"] = g["latency_ns"].quantile(p / 100)
    agg["queue_p50_ns"] = g["queue_ns"].quantile(0.5)
    agg = agg.reset_index()
    busy = _launching_thread_busy(t, lat, w)
    out = out.merge(agg, on=["rank", "step"], how="left").merge(busy, on=["rank", "step"],
                                                                 how="left")
    out["launches"] = out["launches"].fillna(0).astype(np.int64)
    out["gpu_ops"] = out["gpu_ops"].fillna(0).astype(np.int64)
    out["launch_bound_ops"] = out["launch_bound_ops"].fillna(0).astype(np.int64)
    out["launch_call_ns"] = out["launch_call_ns"].fillna(0).astype(np.int64)
    out["host_busy_ns"] = out["host_busy_ns"].fillna(0).astype(np.int64)
    n = out["launches"].where(out["launches"] > 0)
    out["cpu_ns_per_launch"] = out["launch_call_ns"] / n
    out["host_ns_per_launch"] = out["host_busy_ns"] / n
    out["launch_bound_frac"] = out["launch_bound_ops"] / out["gpu_ops"].where(out["gpu_ops"] > 0)
    cols = ["rank", "step", "step_ns", "launches", "gpu_ops", "launch_call_ns", "cpu_ns_per_launch",
            "host_busy_ns", "host_ns_per_launch", "latency_p50_ns", "latency_p90_ns",
            "latency_p99_ns", "queue_p50_ns", "launch_bound_ops", "launch_bound_frac",
            "host_bound_ns", "host_bound_frac"]
    return out[cols]


def _launching_thread_busy(t, lat: pd.DataFrame, w: pd.DataFrame) -> pd.DataFrame:
    """Host busy time (leaf host ops and operator ranges, unioned) of the threads that
    issued launches, per (rank, step) window."""
    o = t.ops
    lanes_l = unique(o["lane"].to_numpy()[lat["launch_op"].to_numpy()])
    lane = o["lane"].to_numpy()
    kind = o["kind"].to_numpy()
    sel = isin(lane, lanes_l) & isin(kind, [OpKind.CPU_OP, OpKind.RUNTIME])
    s = o["start_ns"].to_numpy()[sel]
    e = op_ends_ns(t)[sel]
    rk = o["rank"].to_numpy()[sel]
    r = t.ranges
    names = np.asarray(t.strings, dtype=object)
    rsel = isin(r["lane"].to_numpy(), lanes_l)
    if rsel.any():
        is_op = _operator_names(names)[r["name_id"].to_numpy()[rsel]]
        s = np.r_[s, r["start_ns"].to_numpy()[rsel][is_op]]
        e = np.r_[e, r["end_ns"].to_numpy()[rsel][is_op]]
        rk = np.r_[rk, r["rank"].to_numpy()[rsel][is_op]]
    rows = []
    for wr, ws_, we_, st in zip(w["rank"].to_numpy(), w["start_ns"].to_numpy(),
                                w["end_ns"].to_numpy(), w["step"].to_numpy(), strict=True):
        m = (rk == wr) & (e > ws_) & (s < we_)
        a = np.maximum(s[m], ws_)
        b = np.minimum(e[m], we_)
        rows.append((int(wr), int(st), _union_len(a, b)))
    return pd.DataFrame(rows, columns=["rank", "step", "host_busy_ns"])


def _operator_names(names: np.ndarray) -> np.ndarray:
    """Names of operators (``ns::op``: aten, c10d, fbgemm, ...), not annotations, steps or
    autograd engine frames."""
    out = np.zeros(len(names), bool)
    for i, s in enumerate(names.tolist()):
        s = str(s)
        out[i] = "::" in s and not s.startswith(("ProfilerStep", "autograd::engine", "## "))
    return out


def _union_len(a: np.ndarray, b: np.ndarray) -> int:
    if len(a) == 0:
        return 0
    o = np.argsort(a, kind="stable")
    a, b = a[o], np.maximum.accumulate(b[o])
    prev_end = np.r_[a[0], b[:-1]]
    return int((b - np.maximum(a, prev_end)).clip(0).sum())


def host_ops(x: Any, *, top: int = 20) -> pd.DataFrame:
    """Operators by inclusive host time: the outermost operator ranges (``ns::op``) and leaf
    operators on CPU threads, grouped by name.

    Returns ``name``, ``count``, ``total_ns``, ``mean_ns``, ``launches`` (launch calls
    inside), ``ns_per_launch`` and ``share`` (of all such operators' time), most costly
    first (``top`` rows).
    """
    t = as_trace(x)
    o = t.ops
    names = np.asarray(t.strings, dtype=object)
    r = t.ranges
    lk = _lane_kinds(t)
    op_name = _operator_names(names)
    kind = o["kind"].to_numpy()
    lane = o["lane"].to_numpy()
    leaf = (kind == OpKind.CPU_OP) & (lk[lane] == LaneKind.CPU_THREAD) & op_name[
        o["name_id"].to_numpy()] if len(o) else np.zeros(0, bool)
    rsel = op_name[r["name_id"].to_numpy()] if len(r) else np.zeros(0, bool)
    iv = pd.DataFrame({
        "rank": np.r_[o["rank"].to_numpy()[leaf], r["rank"].to_numpy()[rsel]],
        "lane": np.r_[lane[leaf], r["lane"].to_numpy()[rsel]].astype(np.int64),
        "name_id": np.r_[o["name_id"].to_numpy()[leaf], r["name_id"].to_numpy()[rsel]],
        "s": np.r_[o["start_ns"].to_numpy()[leaf], r["start_ns"].to_numpy()[rsel]],
        "e": np.r_[op_ends_ns(t)[leaf], r["end_ns"].to_numpy()[rsel]]})
    cols = ["name", "count", "total_ns", "mean_ns", "launches", "ns_per_launch", "share"]
    if len(iv) == 0:
        return pd.DataFrame({c: [] for c in cols})
    iv = iv.sort_values(["lane", "s", "e"], ascending=[True, True, False], kind="stable")
    ln, s, e = iv["lane"].to_numpy(), iv["s"].to_numpy(), iv["e"].to_numpy()
    # outermost: not inside an earlier interval of the same lane (running max of ends)
    outer = np.ones(len(iv), bool)
    for lv in unique(ln).tolist():
        idx = np.flatnonzero(ln == lv)
        run = np.maximum.accumulate(e[idx])
        prev = np.r_[np.iinfo(np.int64).min, run[:-1]]
        outer[idx] = s[idx] >= prev
    top_iv = iv[outer]
    # launches inside each outermost operator
    lat_src = launch_latency(t)["launch_op"].to_numpy()
    ls = o["start_ns"].to_numpy()[lat_src]
    ll = lane[lat_src]
    nl = np.zeros(len(top_iv), np.int64)
    ti_l, ti_s, ti_e = (top_iv[c].to_numpy() for c in ("lane", "s", "e"))
    for lv in unique(ti_l).tolist():
        q = np.flatnonzero(ti_l == lv)
        st = np.sort(ls[ll == lv])
        nl[q] = np.searchsorted(st, ti_e[q], side="left") - np.searchsorted(st, ti_s[q],
                                                                           side="left")
    df = pd.DataFrame({"name": names[top_iv["name_id"].to_numpy()],
                       "dur": ti_e - ti_s, "launches": nl})
    g = df.groupby("name", sort=False)
    res = g.agg(count=("dur", "size"), total_ns=("dur", "sum"), launches=("launches", "sum"))
    res["mean_ns"] = res["total_ns"] / res["count"]
    res["ns_per_launch"] = res["total_ns"] / res["launches"].where(res["launches"] > 0)
    tot = float(res["total_ns"].sum())
    res["share"] = res["total_ns"] / tot if tot > 0 else np.nan
    res = res.reset_index().sort_values("total_ns", ascending=False, kind="stable")
    return res[cols].head(top).reset_index(drop=True)
