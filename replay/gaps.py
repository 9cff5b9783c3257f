"""What the gaps of a measured trace were: work, waiting, or unexplained (DESIGN.md §4).

A measured trace shows when each op ran; between the ops of a host thread there are gaps.
Replaying the trace unchanged reproduces them by construction, so identity replay proves
nothing about them; what matters is how each gap moves under a what-if. Each one is one of:

* **host work the profiler did not cover** (a parent op's own time, framework code): the
  HOST_ORDER lag before the next op; a what-if keeps it, ``hardware.host_speedup`` scales it;
* **waiting** for something another thread or device did: a dependency, so the gap moves
  with what it waited for. The trace records some (launches, stream syncs, gloo issue and
  completion); :func:`handoff_edges` infers the thread hand-offs it does not (an idle thread
  resumes right after another thread of its rank finishes and goes idle: the autograd
  engine's thread starting after the forward, the main thread resuming when backward ends).
  :func:`classify_wait_gaps` then turns the HOST_ORDER lag of every gap that ends on a tight
  cross-thread dependency into 0: the dependency alone places the op;
* **unexplained**: the rest, kept as a release delay of the op (``ReplayGraph.delay_ns``):
  the trace does not say what it was, so it stays a constant. Its share of the step is
  reported (``stats["unexplained_delay_ns"]``, :func:`gap_shares`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from retime.collectors.arrays import unique
from retime.collectors.enums import EdgeKind

__all__ = ["WAKE_UP_NS", "HANDOFF_MIN_GAP_NS", "HANDOFF_WINDOW_NS", "handoff_edges",
           "with_handoff_edges", "classify_wait_gaps", "host_comm_masks",
           "gap_shares"]

#: how soon after what it waited for a thread resumes (a wake-up, scheduling): a gap that
#: ends within this of a cross-thread dependency's end was a wait
WAKE_UP_NS = 100_000
#: an idle stretch of a host thread at least this long can be a wait for another thread
#: (shorter gaps are framework work between ops: a few to a few hundred microseconds)
HANDOFF_MIN_GAP_NS = 1_000_000
#: how soon after another thread's last op a handed-over thread starts its first op (a
#: Python-level hand-off such as ``loss.backward()`` starting the autograd engine's thread
#: takes ~0.1-0.3 ms; measured on the shared DLRM trace)
HANDOFF_WINDOW_NS = 500_000


def handoff_edges(rank, lane, start, end, host, lane_prev, origin, has_pred) -> tuple:
    """Inferred thread hand-offs on host lanes: ``(src, dst, lag)`` op-id arrays.

    An op ``v`` of a host thread that was idle before it (its lane predecessor ended at least
    :data:`HANDOFF_MIN_GAP_NS` earlier, or it is its lane's first op, later than its rank's
    first op, with no recorded dependency) resumed because another thread of its rank handed
    work over: ``x``, the op of another host lane of the rank that ended last within
    :data:`HANDOFF_WINDOW_NS` before ``v`` started and after which its own thread went idle
    (its next op starts at least :data:`HANDOFF_WINDOW_NS` later, or it was the last). Edge
    ``x -> v`` with the measured lag (0..HANDOFF_WINDOW_NS).
    """
    z = np.zeros(0, np.int64)
    n = len(start)
    if n == 0 or not host.any():
        return z, z, z
    gap = np.where(lane_prev >= 0, start - end[np.maximum(lane_prev, 0)], -1)
    first = (lane_prev < 0) & host & ~has_pred & (start - origin > WAKE_UP_NS)
    cand = np.flatnonzero(host & ((gap >= HANDOFF_MIN_GAP_NS) | first))
    if len(cand) == 0:
        return z, z, z
    # each host op's next op on its lane (is its thread idle after it?)
    nxt = np.full(n, -1, np.int64)
    hp = lane_prev >= 0
    nxt[lane_prev[hp]] = np.flatnonzero(hp)
    idle_after = (nxt < 0) | (start[np.maximum(nxt, 0)] - end >= HANDOFF_WINDOW_NS)
    srcs = np.flatnonzero(host & idle_after)
    if len(srcs) == 0:
        return z, z, z
    # by (rank, end): per candidate, the sources of its rank ending in the wake-up window
    key = np.lexsort((end[srcs], rank[srcs]))
    srcs = srcs[key]
    s_rank, s_end = rank[srcs].astype(np.int64), end[srcs]
    out_s, out_d, out_l = [], [], []
    for v in cand.tolist():
        lo = np.searchsorted(s_rank, rank[v], side="left")
        hi = np.searchsorted(s_rank, rank[v], side="right")
        a = lo + np.searchsorted(s_end[lo:hi], start[v] - HANDOFF_WINDOW_NS, side="left")
        b = lo + np.searchsorted(s_end[lo:hi], start[v], side="right")
        for k in range(b - 1, a - 1, -1):  # the latest end first
            x = srcs[k]
            if lane[x] != lane[v] and start[x] < start[v]:
                out_s.append(x)
                out_d.append(v)
                out_l.append(int(start[v] - end[x]))
                break
    return (np.asarray(out_s, np.int64), np.asarray(out_d, np.int64),
            np.asarray(out_l, np.int64))


def with_handoff_edges(rank, lane, start, end, on_device, lane_prev, es, ed, ek, el, stats,
                       not_dst=None, scope=None):
    """The edge arrays with the inferred hand-offs (:func:`handoff_edges`, as SYNC edges)
    appended; ``stats["handoff_edges"]`` counts them. Host lanes are those not
    ``on_device`` (without that information nothing is inferred); ops in ``not_dst``
    (collectives: issued, not handed over) are never the op a hand-off resumes. With
    ``scope`` (a window of a run: :class:`replay.window.Scope`) the ranks' first starts are
    the run's and only the hand-offs into the window's own ops are counted."""
    n = len(start)
    if on_device is None or n == 0:
        stats["handoff_edges"] = 0
        return es, ed, ek, el
    host = ~np.asarray(on_device, bool)
    if scope is None:
        ur, rinv = unique(rank, return_inverse=True)
        rmin = np.full(len(ur), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(rmin, rinv, start)
        origin = rmin[rinv]
        del ur, rinv, rmin
    else:
        origin = scope.origin
    has_pred = np.zeros(n, bool)
    has_pred[ed] = True
    hs, hd, hl = handoff_edges(rank, lane, start, end, host, lane_prev, origin, has_pred)
    if not_dst is not None and len(hd):
        ok = ~np.asarray(not_dst, bool)[hd]
        hs, hd, hl = hs[ok], hd[ok], hl[ok]
    stats["handoff_edges"] = int(len(hs) if scope is None else scope.count[hd].sum())
    if not len(hs):
        return es, ed, ek, el
    return (np.concatenate([es, hs]), np.concatenate([ed, hd]),
            np.concatenate([ek, np.full(len(hs), int(EdgeKind.SYNC), np.int8)]),
            np.concatenate([el, hl]))


def host_comm_masks(lane, coll, on_device) -> tuple[np.ndarray, np.ndarray]:
    """Per op: on a communication worker thread (a host lane that runs nothing but
    collectives: gloo's workers), and a collective run by a host thread. Both all False
    without the lanes' device information (GPU streams' gaps are not a thread's wake-ups)."""
    n = len(lane)
    if on_device is None or n == 0:
        z = np.zeros(n, bool)
        return z, z
    host = ~np.asarray(on_device, bool)
    lane_u, lane_inv = unique(lane, return_inverse=True)
    non_coll = np.bincount(lane_inv, weights=(np.asarray(coll) < 0), minlength=len(lane_u))
    return (non_coll == 0)[lane_inv] & host, (np.asarray(coll) >= 0) & host


def classify_wait_gaps(es, ed, ek, lag, s2s, keep, start, end, lane, stats,
                       worker=None, host_coll=None, count=None) -> None:
    """Gaps on a thread that were waiting, not working (in place on ``lag``).

    A HOST_ORDER lag holds the measured gap before an op on its thread: host work the
    profiler did not cover, which a what-if keeps (or scales with the host's speed). When the
    op also has a SYNC or LAUNCH edge from another lane that is tight on the measured trace
    (the op started at most :data:`WAKE_UP_NS` after that source's end plus its lag: it
    resumed as soon as what it waited for completed or was handed to it, e.g. DDP's wait for
    a gloo all-reduce, or a gloo worker thread idle until the next all-reduce is issued), the
    gap was waiting: its lag becomes 0 (a wake-up delay is left as the op's release delay)
    and the dependency alone places the op, so a what-if that makes the awaited work faster
    or slower moves the op with it. Counted in ``stats["wait_gaps"]`` / ``["wait_gap_ns"]``.

    ``worker`` (bool per op, optional) marks ops on communication worker threads (a gloo
    worker: a lane that runs nothing but collectives). Such a thread does no host work of
    its own, so a gap before one of its ops that started after its issue ended was waiting
    for that issue however long the wake-up took (on a busy core it waits for the issuing
    thread's time slice: milliseconds); the wake-up stays as the op's release delay.
    ``host_coll`` (bool per op, optional) marks collectives run by host threads (gloo): a
    SYNC edge from one is a wait on its completion (DDP's ``work.wait()``), so the gap before
    the op it releases is waiting however late the thread woke (ranks sharing a core wake a
    scheduler slice late), the wake-up again kept as the release delay. ``count`` (bool per
    op, optional): only gaps before these ops are counted (a window's own ops).
    """
    if not len(es):
        stats["wait_gaps"] = stats["wait_gap_ns"] = 0
        return
    src_t = np.where(s2s, start[es], end[es]) + lag
    late = start[ed] - src_t
    woke_late = np.zeros(len(es), bool)
    if worker is not None:
        woke_late |= np.asarray(worker, bool)[ed]
    if host_coll is not None:
        woke_late |= (ek == EdgeKind.SYNC) & np.asarray(host_coll, bool)[es]
    tight = ((ek == EdgeKind.SYNC) | (ek == EdgeKind.LAUNCH)) & keep \
        & (lane[es] != lane[ed]) & ((late <= WAKE_UP_NS) | ((late >= 0) & woke_late))
    waited = np.zeros(len(start), bool)
    waited[ed[tight]] = True
    ho = (ek == EdgeKind.HOST_ORDER) & waited[ed] & (lag > 0) & ~s2s
    c = ho if count is None else ho & np.asarray(count, bool)[ed]
    stats["wait_gaps"] = int(c.sum())
    stats["wait_gap_ns"] = int(lag[c].sum())
    lag[ho] = 0


def gap_shares(graph) -> dict[str, Any]:
    """Per rank: its span and how much of it the graph's gaps hold, by class.

    ``host_work_ns`` (HOST_ORDER lags kept: host time the profiler did not cover),
    ``unexplained_ns`` (release delays: nothing in the trace says what they were) and
    ``unexplained_share`` = unexplained over span. Whole-trace totals under ``"total"``.
    """
    # per rank, in one pass over the ops and one over the edges, with int32 indices and
    # exact int64 sums (no per-op float or op-order copies: this runs on 10^7 ops)
    rank = np.asarray(graph.rank)
    ur, inv = unique(rank, return_inverse=True)
    k = len(ur)
    inv = inv.astype(np.int32)
    lo = np.full(k, np.iinfo(np.int64).max, np.int64)
    hi = np.full(k, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, inv, graph.meas_start_ns)
    np.maximum.at(hi, inv, graph.meas_end_ns)
    inv_pos = inv[graph.perm]  # rank index per layout position
    del inv
    dl = np.zeros(k, np.int64)
    np.add.at(dl, inv_pos, np.asarray(graph.measured_delay_layout_ns, np.int64))
    # HOST_ORDER lags kept (host work), summed by their destination's rank
    ho = (graph.pred_kind == EdgeKind.HOST_ORDER) & (graph.pred_lag_ns > 0) & ~graph.pred_s2s
    dst_pos = np.repeat(np.arange(graph.n_ops, dtype=np.int32), np.diff(graph.pred_ptr))[ho]
    wk = np.zeros(k, np.int64)
    np.add.at(wk, inv_pos[dst_pos], np.asarray(graph.pred_lag_ns, np.int64)[ho])
    del inv_pos, dst_pos, ho
    out: dict[str, Any] = {"per_rank": []}
    tot = {"span_ns": 0, "host_work_ns": 0, "unexplained_ns": 0}
    for i, r in enumerate(ur.tolist()):
        span = int(hi[i] - lo[i])
        row = {"rank": int(r), "span_ns": span, "host_work_ns": int(wk[i]),
               "unexplained_ns": int(dl[i])}
        row["unexplained_share"] = row["unexplained_ns"] / span if span else 0.0
        out["per_rank"].append(row)
        for k in tot:
            tot[k] += row[k]
    tot["unexplained_share"] = tot["unexplained_ns"] / tot["span_ns"] if tot["span_ns"] else 0.0
    tot["wait_gap_ns"] = int(graph.stats.get("wait_gap_ns", 0))
    tot["handoff_edges"] = int(graph.stats.get("handoff_edges", 0))
    out["total"] = tot
    return out
