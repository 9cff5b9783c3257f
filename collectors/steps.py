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
    first   = [max(S, P, Q), E_k1) S = start of the step's extent,
                                   P = end of the GPU work still queued from before it
                                       (GPU ops of no profiled step that start before the
                                       step's first GPU op)
                                   Q = the GPU-side start of the step on a stream whose
                                       first op of the step waited in the queue (below)

Q is the CPU-to-GPU lag the first step would otherwise absorb. When the GPU runs behind the
host, the first profiled step's host range starts while the GPU still works through the
previous step's queue, which the trace often does not hold (launched before the profiler
started): the step's first GPU op then starts long after its launch call ended. When it
waited more than ``max(50 us, 1% of the window)`` (a launch on an idle GPU starts within
microseconds), Q is the GPU-side step boundary: the start of the step's first GPU op, or
of its ``ProfilerStep#N`` GPU annotation where the trace has one that starts earlier (the
annotation can also start later than the ops attributed to its step, as on ROCm; the window
must hold the step's work, so it never cuts past them). The GPU was
busy with earlier work from the host step's start up to Q (FIFO: the queued work was
launched before the step), so the window is the GPU's own step period, as every later
window is. Launch calls are found by correlation id (a runtime call and the GPU op with the
same ``correlation`` on one rank).

A profiler step with no ops of its rank (an empty trailing ``ProfilerStep#N`` the profiler
closes as it stops) makes no window: :func:`empty_steps` lists them, and ``retime info``,
``analyze``, ``replay`` and ``report`` all count the steps that have ops.

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

from .arrays import isin, unique
from .enums import LaneKind, OpKind

__all__ = ["step_windows", "windows_from_arrays", "job_step_windows", "device_lane_mask",
           "profiler_steps", "step_range_mask", "times_checksum", "launch_waits", "gpu_step_marks", "empty_steps",
           "QUEUED_MIN_NS", "QUEUED_MIN_FRAC"]

#: a GPU op that started this long after its launch call ended waited in a queue (an idle
#: GPU starts a launched kernel within microseconds) ...
QUEUED_MIN_NS = 50_000
#: ... and this share of the first window (below it the lag changes the window by < 1%)
QUEUED_MIN_FRAC = 0.01

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
        d = d[isin(r["lane"].to_numpy()[sel], cpu)]
    return d.groupby(["rank", "step"], sort=True).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()


def step_range_mask(ranges: pd.DataFrame, strings: list[str]) -> np.ndarray:
    """Which ``ranges`` rows are ``ProfilerStep#N`` annotations: the only ones step windows
    read (:func:`profiler_steps`, :func:`gpu_step_marks`), so a caller that needs nothing
    else of the ranges (an identity replay) may keep just these."""
    if len(ranges) == 0 or not len(strings):
        return np.zeros(len(ranges), bool)
    names = pd.Series(np.asarray(strings, dtype=object))
    is_step = names.str.fullmatch(_STEP_RE[1:-1]).to_numpy(bool)
    return is_step[ranges["name_id"].to_numpy()]


def launch_waits(trace) -> np.ndarray:
    """Per op: how long a GPU op waited after its launch call ended (``start - launch end``,
    ns, at least 0), -1 where unknown (host ops, GPU ops whose launch is not in the trace,
    traces without correlation ids). The launch is the runtime call on a host thread with
    the op's rank and ``correlation``."""
    o = trace.ops
    out = np.full(len(o), -1, np.int64)
    if len(o) == 0 or "correlation" not in o.columns or "kind" not in o.columns:
        return out
    corr = o["correlation"].to_numpy().astype(np.int64)
    dev = device_lane_mask(trace)
    rt = ~dev & (o["kind"].to_numpy() == int(OpKind.RUNTIME)) & (corr >= 0)
    want = dev & (corr >= 0)
    if not rt.any() or not want.any():
        return out
    rank = o["rank"].to_numpy().astype(np.int64)
    s = o["start_ns"].to_numpy().astype(np.int64)
    e = s + o["dur_ns"].to_numpy().astype(np.int64)
    # one int64 key per (rank, correlation) where both fit (every trace seen): the launch's
    # end is the smallest end of the runtime calls with the key, found by a sort
    if 0 <= rank.min() and rank.max() < (1 << 23) and corr.max() < (1 << 40):
        key = (rank << 40) | np.maximum(corr, 0)
        rk, re_ = key[rt], e[rt]
        order = np.argsort(rk, kind="stable")  # ops come nearly in key order: a fast sort
        rk, re_ = rk[order], re_[order]
        head = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1]])
        uk, ue = rk[head], np.minimum.reduceat(re_, head)
        w = np.flatnonzero(want)
        wk = key[w]
        pos = np.minimum(np.searchsorted(uk, wk), len(uk) - 1)
        ok = uk[pos] == wk
        out[w[ok]] = np.maximum(s[w[ok]] - ue[pos[ok]], 0)
        return out
    launch = pd.DataFrame({"rank": rank[rt], "corr": corr[rt], "end": e[rt]}).groupby(
        ["rank", "corr"], sort=False)["end"].min()
    # positions, not a reindex: a float64 end would round epoch-ns times by up to 128 ns
    pos = launch.index.get_indexer(pd.MultiIndex.from_arrays([rank[want], corr[want]]))
    ok = pos >= 0
    w = np.flatnonzero(want)
    out[w[ok]] = np.maximum(s[w[ok]] - launch.to_numpy().astype(np.int64)[pos[ok]], 0)
    return out


def gpu_step_marks(trace) -> pd.DataFrame:
    """The ``ProfilerStep#N`` annotations on GPU streams (the GPU's side of a step):
    ``rank``, ``lane``, ``step``, ``start_ns`` (earliest per rank, lane and step)."""
    r = trace.ranges
    empty = pd.DataFrame({"rank": _Z64, "lane": _Z64, "step": _Z64, "start_ns": _Z64})
    if len(r) == 0 or not len(trace.strings) or not len(trace.lanes):
        return empty
    names = pd.Series(np.asarray(trace.strings, dtype=object))
    num = pd.to_numeric(names.str.extract(_STEP_RE, expand=False),
                        errors="coerce").to_numpy(np.float64)
    nid = r["name_id"].to_numpy()
    gpu = trace.lanes["lane"].to_numpy()[trace.lanes["lane_kind"].to_numpy()
                                         != int(LaneKind.CPU_THREAD)]
    sel = ~np.isnan(num[nid]) & isin(r["lane"].to_numpy(), gpu)
    if not sel.any():
        return empty
    d = pd.DataFrame({"rank": r["rank"].to_numpy()[sel].astype(np.int64),
                      "lane": r["lane"].to_numpy()[sel].astype(np.int64),
                      "step": num[nid[sel]].astype(np.int64),
                      "start_ns": r["start_ns"].to_numpy()[sel].astype(np.int64)})
    return d.groupby(["rank", "lane", "step"], sort=True)["start_ns"].min().reset_index()


def empty_steps(trace) -> pd.DataFrame:
    """Profiler steps with no ops of their rank (they make no window): ``rank``, ``step``,
    ``start_ns``, ``end_ns`` of their ``ProfilerStep#N`` range."""
    ps = profiler_steps(trace)
    o = trace.ops
    if len(ps) == 0:
        return ps
    have = pd.MultiIndex.from_arrays([o["rank"].to_numpy().astype(np.int64),
                                      o["step"].to_numpy().astype(np.int64)]).unique()
    key = pd.MultiIndex.from_arrays([ps["rank"].to_numpy(), ps["step"].to_numpy()])
    return ps[~key.isin(have)].reset_index(drop=True)


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
        return _windows(rank, step, s, e, dev, ps, queue=_queue(trace))[0]
    # other times (a replay): the first step starts as far after its own start as measured
    # (the GPU backlog it waited for is work of earlier steps, not re-timed here)
    mb = _host_bounds(ps, rank, step, ~dev, ms, me, ms, me) if ps is not None else None
    mw, m_first = _windows(rank, step, ms, me, dev, mb, queue=_queue(trace))
    if np.array_equal(s, ms) and np.array_equal(e, me):
        # the measured times (an identity replay): the pass below would rebuild these
        # windows (the same bounds, each first window lead = its own lead); not run twice
        return mw
    lead = mw["start_ns"].to_numpy() - m_first
    first = np.r_[True, mw["rank"].to_numpy()[1:] != mw["rank"].to_numpy()[:-1]]
    lead_of = dict(zip(mw["rank"].to_numpy()[first].tolist(), lead[first].tolist()))
    b = _host_bounds(ps, rank, step, ~dev, ms, me, s, e) if ps is not None else None
    return _windows(rank, step, s, e, dev, b, lead_of)[0]


#: ops per batch of ranks in :func:`step_windows_by_rank`
CHUNK_OPS = 1 << 20


def step_windows_by_rank(trace, start_ns: np.ndarray | None = None,
                         end_ns: np.ndarray | None = None, *,
                         chunk_ops: int = CHUNK_OPS) -> pd.DataFrame:
    """:func:`step_windows`, computed a batch of ranks at a time when the ops are in rank
    order (as every store reads back): windows are per rank, so the result is the same, and
    the temporaries are one batch's, not the whole trace's. Without times, the measured
    windows (a replayed trace's recorded ones are read whole, as :func:`step_windows`
    does)."""
    import dataclasses

    o = trace.ops
    n = len(o)
    rank = o["rank"].to_numpy() if n else np.zeros(0, np.int32)
    measured = start_ns is None and end_ns is None
    recorded = measured and isinstance(trace.meta, dict) and "step_windows" in trace.meta
    if n <= chunk_ops or recorded or (rank[1:] < rank[:-1]).any():
        return step_windows(trace, start_ns, end_ns)
    if not measured:
        start_ns = np.asarray(start_ns, np.int64)
        end_ns = np.asarray(end_ns, np.int64)
    cut = np.flatnonzero(rank[1:] != rank[:-1]) + 1  # first op of each rank after the first
    bounds = np.r_[0, cut, n]
    rr = trace.ranges
    r_rank = rr["rank"].to_numpy() if len(rr) else np.zeros(0, np.int32)
    parts, a = [], 0
    while a < n:
        # whole ranks, about chunk_ops ops (one rank at least)
        b = int(bounds[min(np.searchsorted(bounds, a + chunk_ops, side="right"),
                           len(bounds) - 1)])
        if b <= a:
            b = int(bounds[np.searchsorted(bounds, a, side="right")])
        lo, hi = int(rank[a]), int(rank[b - 1])
        sel = (r_rank >= lo) & (r_rank <= hi)
        sub = dataclasses.replace(trace, ops=o.iloc[a:b].reset_index(drop=True),
                                  ranges=rr[sel].reset_index(drop=True) if len(rr) else rr)
        parts.append(step_windows(sub) if measured
                     else step_windows(sub, start_ns[a:b], end_ns[a:b]))
        a = b
    return pd.concat(parts, ignore_index=True) if parts else _empty()


def _queue(trace) -> tuple[np.ndarray, np.ndarray, pd.DataFrame] | None:
    """(lane per op, launch wait per op, GPU step marks) for the first window's cut."""
    o = trace.ops
    if "lane" not in o.columns:
        return None
    return (o["lane"].to_numpy().astype(np.int64), launch_waits(trace), gpu_step_marks(trace))


def _queued_floor(ri, step, s, dev, queue, first_rank, rank_ids, first_step, first_start,
                  first_end) -> np.ndarray:
    """Per first window: Q of the module docstring (where the step's GPU work begins, when
    its first GPU op waited in the queue), or the smallest int64. ``first_rank`` (rank
    index, sorted), ``rank_ids`` (its rank number), ``first_step``, ``first_start``
    (max(S, P)) and ``first_end`` (E) describe each rank's first window."""
    small = np.iinfo(np.int64).min
    out = np.full(len(first_rank), small, np.int64)
    if queue is None or not len(first_rank):
        return out
    lane, wait, marks = queue
    k1 = np.full(int(ri.max()) + 1 if len(ri) else 0, -(1 << 40), np.int64)
    k1[first_rank] = first_step
    m = dev & (step >= 0) & (step == k1[ri])
    if not m.any():
        return out
    # the step's first GPU op (ties: the one that waited least, then the first in op order):
    # only the ops at their rank's earliest start are candidates, so the sort is of a few
    idx = np.flatnonzero(m)
    lo = np.full(len(k1), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(lo, ri[idx], s[idx])
    idx = idx[s[idx] == lo[ri[idx]]]
    idx = idx[np.lexsort((wait[idx], ri[idx]))]  # stable: op order breaks the last ties
    idx = idx[np.r_[True, ri[idx][1:] != ri[idx][:-1]]]
    d = {"ri": ri[idx], "s": s[idx], "wait": wait[idx]}
    pos = np.searchsorted(first_rank, d["ri"])
    win = first_end[pos] - first_start[pos]
    tau = np.maximum(QUEUED_MIN_NS, (QUEUED_MIN_FRAC * win).astype(np.int64))
    q = d["wait"] > tau
    if not q.any():
        return out
    pos = pos[q]
    cut = d["s"][q].astype(np.int64)
    if len(marks):  # the GPU-side ProfilerStep marker, where the trace has one
        g = marks.groupby(["rank", "step"])["start_ns"].min()
        got = g.reindex(pd.MultiIndex.from_arrays([rank_ids[pos], first_step[pos]])
                        ).to_numpy(np.float64)
        # never past the step's own first GPU op (the window must hold the step's work;
        # a marker can start later than the ops attributed to its step, as on ROCm)
        cut = np.where(np.isnan(got), cut, np.minimum(cut, np.nan_to_num(got).astype(np.int64)))
    out[pos] = cut
    return out


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


def _windows(rank, step, start_ns, end_ns, device=None, host_bounds=None, lead_of=None,
             queue=None) -> tuple[pd.DataFrame, np.ndarray]:
    """The windows, and per window the start of its step's extent (ops and range). With
    ``lead_of`` (rank -> ns) a rank's first window starts that long after its extent's
    start instead of after the GPU backlog; with ``queue`` (:func:`_queue`) it starts no
    earlier than the GPU-side start of a queued first step. Steps without ops make no
    window."""
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
    if hb is not None:  # a step's range widens its extent (a step without ops: dropped)
        k_r = np.concatenate([rank[st], hb["rank"].to_numpy().astype(np.int64)])
        k_s = np.concatenate([step[st], hb["step"].to_numpy().astype(np.int64)])
        k_a = np.concatenate([s[st], hb["start_ns"].to_numpy().astype(np.int64)])
        k_b = np.concatenate([e[st], hb["end_ns"].to_numpy().astype(np.int64)])
    else:
        k_r, k_s, k_a, k_b = rank[st], step[st], s[st], e[st]
    # ranks of the ops and of the step ranges; the ops' part of k_r is rank[st], so only the
    # ranges' ranks are looked up (not millions of op ranks a second time)
    n_st = int(st.sum())
    ur, ri = unique(np.concatenate([rank, k_r[n_st:]]), return_inverse=True)
    ri = ri.reshape(-1)
    kri = np.concatenate([ri[:n][st], ri[n:]])
    ri = ri[:n]
    nr = len(ur)
    has_steps = np.zeros(nr, bool)
    has_steps[kri[:int(st.sum())]] = True  # ranks with ops of a step
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    # ranks without steps: one window over all their ops
    lo = np.full(nr, big, np.int64)
    hi = np.full(nr, small, np.int64)
    np.minimum.at(lo, ri, s)
    np.maximum.at(hi, ri, e)
    plain = np.flatnonzero(~has_steps & (lo <= hi))
    parts = [pd.DataFrame({"rank": ur[plain], "step": np.full(len(plain), -1, np.int64),
                           "start_ns": lo[plain], "end_ns": hi[plain], "ext": lo[plain]})]
    if len(kri):
        # per (rank, step): first start and last end of its ops (and of its step range)
        # a dense key where the steps span a small range (a count, no sort, in unique)
        s_lo = int(k_s.min())
        span = int(k_s.max()) - s_lo + 1
        if span <= (1 << 20):
            uk, ki = unique(kri * span + (k_s - s_lo), return_inverse=True)
            uk = (uk // span) * (1 << 32) + uk % span + s_lo
        else:
            uk, ki = unique(kri * (1 << 32) + k_s, return_inverse=True)
        ki = ki.reshape(-1)
        ks = np.full(len(uk), big, np.int64)
        ke = np.full(len(uk), small, np.int64)
        np.minimum.at(ks, ki, k_a)
        np.maximum.at(ke, ki, k_b)
        n_op = int(st.sum())  # the first n_op keys are ops; a step of none makes no window
        live = np.zeros(len(uk), bool)
        live[ki[:n_op]] = True
        uk, ks, ke = uk[live], ks[live], ke[live]
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
            q = _queued_floor(ri, step, s, dev, queue, wr[fi], ur[wr[fi]], wstep[fi],
                              starts[fi], ends[fi])
            starts[fi] = np.minimum(np.maximum(starts[fi], q), ends[fi])
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
