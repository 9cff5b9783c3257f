"""Training steps: the one definition of a step's window and time, used by every command.

``retime analyze`` (step times, breakdown), ``retime replay`` (``ReplayResult.step_times``),
``retime report`` and ``retime stragglers`` all take a step's time from here.

Definition (per rank)
---------------------
Ops carry the number of the profiler step that issued them (``ops.step``): host ops by the
``ProfilerStep#N`` range they run in, GPU ops by the step of the runtime call that launched
them (a kernel that runs late still belongs to the step that launched it; a GPU op whose
launch is not in the trace takes its place in its stream's order). A step's *extent* is its
``ProfilerStep#N`` range on the host joined with the ops it issued. The rank's steps
``k_1 < k_2 < ... < k_n`` (sorted by number) get windows that tile its timeline::

    E_k     = max(end of the step's extent, E_previous)     (the step's work is all done)
    window  = [E_previous, E_k)                              for every step but the first
    first   = [max(S, P), E_k1)    S = start of the step's extent,
                                   P = end of the GPU work still queued from before it
                                       (GPU ops of no profiled step that start before the
                                       step's first GPU op)

so consecutive windows never overlap, their sum is ``E_kn - start`` (never more than the
rank's trace) and each step's time is the spacing of the points where both host and GPU have
finished it: the host's ProfilerStep spacing when the GPU keeps up, the GPU's own step
period when it runs behind the host. A rank without step attribution has one window
(step -1) spanning all its ops. Ops of no step (set-up before the first profiled step, the
profiler's own calls after the last) are outside every window.

On other times than the measured ones (a replay, :meth:`ReplayResult.step_windows`), a
profiler step range keeps its measured distance to the step's first and last host op and the
first window keeps its measured distance to its extent's start (the backlog it waited for is
earlier steps' work), so an identity replay has exactly the measured windows.

Per job (:func:`job_step_windows`, ``retime stragglers``): ``E_k`` is the latest rank's
``E_k``, the first window starts at the earliest rank's start; the same tiling.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .enums import LaneKind

__all__ = ["step_windows", "windows_from_arrays", "job_step_windows", "device_lane_mask",
           "profiler_steps", "times_checksum"]

_STEP_RE = r"^ProfilerStep#(\d+)$"

_Z64 = np.zeros(0, np.int64)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({"rank": np.zeros(0, np.int32), "step": np.zeros(0, np.int32),
                         "start_ns": _Z64, "end_ns": _Z64})


def device_lane_mask(trace) -> np.ndarray:
    """Ops on GPU streams or op-level streams (the device work whose backlog can delay the
    start of a rank's first step)."""
    lanes, o = trace.lanes, trace.ops
    if len(o) == 0 or len(lanes) == 0:
        return np.zeros(len(o), bool)
    lid = lanes["lane"].to_numpy().astype(np.int64)
    lk = lanes["lane_kind"].to_numpy().astype(np.int8)
    lut = np.full(int(lid.max()) + 1, int(LaneKind.CPU_THREAD), np.int8)
    lut[lid] = lk
    k = lut[o["lane"].to_numpy()]
    return (k == int(LaneKind.GPU_STREAM)) | (k == int(LaneKind.OP_STREAM))


def profiler_steps(trace) -> pd.DataFrame:
    """The ``ProfilerStep#N`` ranges on host threads: ``rank``, ``step`` (N), ``start_ns``,
    ``end_ns`` (one row per rank and step; a step repeated on several threads spans them)."""
    r = trace.ranges
    if len(r) == 0 or not len(trace.strings):
        return pd.DataFrame({"rank": _Z64, "step": _Z64, "start_ns": _Z64, "end_ns": _Z64})
    names = pd.Series(np.asarray(trace.strings, dtype=object))
    num = pd.to_numeric(names.str.extract(_STEP_RE, expand=False), errors="coerce")
    num = num.to_numpy(np.float64)
    nid = r["name_id"].to_numpy()
    sel = ~np.isnan(num[nid])
    if not sel.any():
        return pd.DataFrame({"rank": _Z64, "step": _Z64, "start_ns": _Z64, "end_ns": _Z64})
    d = pd.DataFrame({"rank": r["rank"].to_numpy()[sel].astype(np.int64),
                      "step": num[nid[sel]].astype(np.int64),
                      "start_ns": r["start_ns"].to_numpy()[sel],
                      "end_ns": r["end_ns"].to_numpy()[sel]})
    if len(trace.lanes):  # host threads only (a GPU-side ProfilerStep is the GPU's view)
        cpu = trace.lanes["lane"].to_numpy()[trace.lanes["lane_kind"].to_numpy()
                                             == int(LaneKind.CPU_THREAD)]
        d = d[np.isin(r["lane"].to_numpy()[sel], cpu)]
    return d.groupby(["rank", "step"], sort=True).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()


def times_checksum(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """A fingerprint of op times (recorded with a replay's windows: they are reused only for
    ops at exactly these times)."""
    with np.errstate(over="ignore"):
        a = np.asarray(start_ns, np.int64)
        b = np.asarray(end_ns, np.int64)
        w = np.arange(1, len(a) + 1, dtype=np.int64)
        return int(((a * w).sum() ^ (b * (w + 7)).sum()) & 0x7FFFFFFFFFFFFFFF)


def step_windows(trace, start_ns: np.ndarray | None = None,
                 end_ns: np.ndarray | None = None) -> pd.DataFrame:
    """Per (rank, step): the step's window ``[start_ns, end_ns)`` (module docstring).

    A replayed trace (``ReplayResult.to_trace()``) carries its windows in
    ``meta["step_windows"]``; they are returned as they are.
    ``start_ns``/``end_ns`` (per op id) replace the ops' measured times, e.g. a replay's:
    a step's host boundaries then keep their measured distance to the step's first and
    last host op (the host time the profiler saw before and after them), so an identity
    replay has exactly the measured windows. Returns ``rank``, ``step``, ``start_ns``,
    ``end_ns`` sorted by rank and step.
    """
    o = trace.ops
    if len(o) == 0:
        return _empty()
    ms = o["start_ns"].to_numpy()
    me = ms + o["dur_ns"].to_numpy()
    s = ms if start_ns is None else np.asarray(start_ns, np.int64)
    e = (s + o["dur_ns"].to_numpy() if start_ns is not None else me) if end_ns is None \
        else np.asarray(end_ns, np.int64)
    dev = device_lane_mask(trace) if "lane" in o.columns else np.zeros(len(o), bool)
    rank = o["rank"].to_numpy().astype(np.int64)
    step = o["step"].to_numpy().astype(np.int64)
    ps = profiler_steps(trace) if len(trace.ranges) else None
    if ps is not None and not len(ps):
        ps = None
    if start_ns is None and end_ns is None:
        rec = trace.meta.get("step_windows") if isinstance(trace.meta, dict) else None
        if isinstance(rec, dict) and rec.get("ops") == len(o) and \
                rec.get("times") == times_checksum(ms, me):  # a replay's own windows
            return pd.DataFrame({"rank": np.asarray(rec["rank"], np.int32),
                                 "step": np.asarray(rec["step"], np.int32),
                                 "start_ns": np.asarray(rec["start_ns"], np.int64),
                                 "end_ns": np.asarray(rec["end_ns"], np.int64)})
        return windows_from_arrays(rank, step, s, e, dev, ps)
    # other times (a replay): the first step starts as far after its own start as measured
    # (the GPU backlog it waited for is work of earlier steps, not re-timed here)
    mb = _host_bounds(ps, rank, step, ~dev, ms, me, ms, me) if ps is not None else None
    mw, m_first = _windows(rank, step, ms, me, dev, mb)
    lead = mw["start_ns"].to_numpy() - m_first
    first = np.r_[True, mw["rank"].to_numpy()[1:] != mw["rank"].to_numpy()[:-1]]
    lead_of = dict(zip(mw["rank"].to_numpy()[first].tolist(), lead[first].tolist()))
    b = _host_bounds(ps, rank, step, ~dev, ms, me, s, e) if ps is not None else None
    return _windows(rank, step, s, e, dev, b, lead_of)[0]


def _host_bounds(ps, rank, step, host, ms, me, s, e) -> pd.DataFrame:
    """Each profiler step's host boundaries on the times ``s``/``e``: the range's measured
    lead before its first host op and trail after its last, kept around the same ops."""
    h = host & (step >= 0)
    d = pd.DataFrame({"rank": rank[h], "step": step[h], "ms": ms[h], "me": me[h], "s": s[h],
                      "e": e[h]}).groupby(["rank", "step"], sort=True).agg(
        ms=("ms", "min"), me=("me", "max"), s=("s", "min"), e=("e", "max"))
    j = ps.set_index(["rank", "step"]).join(d, how="left")
    have = j["ms"].notna().to_numpy()
    a = j["start_ns"].to_numpy().astype(np.int64)
    b = j["end_ns"].to_numpy().astype(np.int64)
    lead = np.where(have, np.maximum(j["ms"].fillna(0).to_numpy() - a, 0), 0).astype(np.int64)
    trail = np.where(have, np.maximum(b - j["me"].fillna(0).to_numpy(), 0), 0).astype(np.int64)
    start = np.where(have, j["s"].fillna(0).to_numpy().astype(np.int64) - lead, a)
    end = np.where(have, j["e"].fillna(0).to_numpy().astype(np.int64) + trail, b)
    idx = j.index.to_frame(index=False)
    return pd.DataFrame({"rank": idx["rank"].to_numpy().astype(np.int64),
                         "step": idx["step"].to_numpy().astype(np.int64),
                         "start_ns": start.astype(np.int64), "end_ns": end.astype(np.int64)})


def windows_from_arrays(rank: np.ndarray, step: np.ndarray, start_ns: np.ndarray,
                        end_ns: np.ndarray, device: np.ndarray | None = None,
                        host_bounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`step_windows` on plain arrays (one entry per op; ``device`` marks GPU ops;
    ``host_bounds``: ``rank``, ``step``, ``start_ns``, ``end_ns`` of profiler step ranges,
    which widen their steps' extents)."""
    return _windows(rank, step, start_ns, end_ns, device, host_bounds)[0]


def _windows(rank, step, start_ns, end_ns, device=None, host_bounds=None, lead_of=None
             ) -> tuple[pd.DataFrame, np.ndarray]:
    """The windows, and per window the start of its step's extent (ops and range). With
    ``lead_of`` (rank -> ns) a rank's first window starts that long after its extent's
    start instead of after the GPU backlog."""
    n = len(rank)
    if n == 0:
        return _empty(), _Z64
    rank = np.asarray(rank, np.int64)
    step = np.asarray(step, np.int64)
    s = np.asarray(start_ns, np.int64)
    e = np.asarray(end_ns, np.int64)
    dev = np.zeros(n, bool) if device is None else np.asarray(device, bool)
    st = step >= 0
    hb = host_bounds if host_bounds is not None and len(host_bounds) else None
    if hb is not None:  # a step range without ops of its rank still makes a window
        k_r = np.concatenate([rank[st], hb["rank"].to_numpy().astype(np.int64)])
        k_s = np.concatenate([step[st], hb["step"].to_numpy().astype(np.int64)])
        k_a = np.concatenate([s[st], hb["start_ns"].to_numpy().astype(np.int64)])
        k_b = np.concatenate([e[st], hb["end_ns"].to_numpy().astype(np.int64)])
    else:
        k_r, k_s, k_a, k_b = rank[st], step[st], s[st], e[st]
    ur, ri = np.unique(np.concatenate([rank, k_r]), return_inverse=True)
    ri = ri.reshape(-1)
    kri = ri[n:]
    ri = ri[:n]
    nr = len(ur)
    has_steps = np.zeros(nr, bool)
    has_steps[kri] = True
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    # ranks without steps: one window over all their ops
    lo = np.full(nr, big, np.int64)
    hi = np.full(nr, small, np.int64)
    np.minimum.at(lo, ri, s)
    np.maximum.at(hi, ri, e)
    plain = np.flatnonzero(~has_steps)
    parts = [pd.DataFrame({"rank": ur[plain], "step": np.full(len(plain), -1, np.int64),
                           "start_ns": lo[plain], "end_ns": hi[plain], "ext": lo[plain]})]
    if len(kri):
        # per (rank, step): first start and last end of its ops (and of its step range)
        key = kri * (1 << 32) + k_s
        uk, ki = np.unique(key, return_inverse=True)
        ki = ki.reshape(-1)
        ks = np.full(len(uk), big, np.int64)
        ke = np.full(len(uk), small, np.int64)
        np.minimum.at(ks, ki, k_a)
        np.maximum.at(ke, ki, k_b)
        wr = (uk >> 32).astype(np.int64)
        wstep = (uk & 0xFFFFFFFF).astype(np.int64)
        # E_k: running maximum of the ends within each rank (uk is sorted by rank, step)
        ends = pd.Series(ke).groupby(wr).cummax().to_numpy()
        first = np.r_[True, wr[1:] != wr[:-1]]
        starts = np.empty(len(uk), np.int64)
        starts[~first] = ends[np.flatnonzero(~first) - 1]
        # the first window: after the GPU backlog of work launched before it
        f_dev = np.full(nr, big, np.int64)
        m = dev & st
        np.minimum.at(f_dev, ri[m], s[m])
        pm = dev & ~st
        pm &= s < f_dev[ri]
        prior = np.full(nr, small, np.int64)
        np.maximum.at(prior, ri[pm], e[pm])
        fi = np.flatnonzero(first)
        if lead_of is not None:
            lead = np.asarray([lead_of.get(int(r), 0) for r in ur[wr[fi]]], np.int64)
            starts[fi] = np.minimum(ks[fi] + lead, ends[fi])
        else:
            starts[fi] = np.minimum(np.maximum(ks[fi], prior[wr[fi]]), ends[fi])
        parts.append(pd.DataFrame({"rank": ur[wr], "step": wstep, "start_ns": starts,
                                   "end_ns": ends, "ext": ks}))
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    out = out.sort_values(["rank", "step"], kind="mergesort").reset_index(drop=True)
    ext = out["ext"].to_numpy()
    return pd.DataFrame({"rank": out["rank"].to_numpy().astype(np.int32),
                         "step": out["step"].to_numpy().astype(np.int32),
                         "start_ns": out["start_ns"].to_numpy().astype(np.int64),
                         "end_ns": out["end_ns"].to_numpy().astype(np.int64)}), \
        ext.astype(np.int64)


def job_step_windows(windows: pd.DataFrame) -> pd.DataFrame:
    """Per step of the job, from per-rank :func:`step_windows`: ``step``, ``start_ns``,
    ``end_ns`` (the latest rank's end; windows tile, the first starts at the earliest
    rank's start)."""
    w = windows
    if len(w) == 0:
        return pd.DataFrame({"step": np.zeros(0, np.int32), "start_ns": _Z64, "end_ns": _Z64})
    g = w.groupby("step", sort=True).agg(s=("start_ns", "min"), e=("end_ns", "max"))
    ends = np.maximum.accumulate(g["e"].to_numpy())
    starts = np.r_[min(int(g["s"].iloc[0]), int(ends[0])), ends[:-1]].astype(np.int64)
    return pd.DataFrame({"step": g.index.to_numpy().astype(np.int32), "start_ns": starts,
                         "end_ns": ends.astype(np.int64)})
