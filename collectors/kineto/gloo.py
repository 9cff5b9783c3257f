"""Kineto: the edges of CPU collectives (gloo): issue, execution on a gloo worker thread,
and the op of the issuing thread that consumed the result (DDP's wait).

Called by :mod:`collectors.kineto.links` once the events are columns.
"""

from __future__ import annotations

import numpy as np

from ..enums import EdgeKind, OpKind

__all__ = ["GLOO_WAIT_WINDOW_NS", "DDP_COPY_BACK", "gloo_edges"]

#: how soon after a CPU collective ends an idle thread's next op must start to count as
#: having waited for it
GLOO_WAIT_WINDOW_NS = 100_000


def gloo_edges(names_arr, kind, lane, start, end, name_id, n_h, hs, he, hc, h_name, h_lane,
                is_op, op_h):
    """Edges of CPU collectives (gloo), which run on gloo worker threads.

    Issue: the k-th ``c10d::*`` call of a rank (on a non-gloo thread) enqueues the k-th
    ``gloo:*`` execution (FIFO in issue order) -> LAUNCH edge from the call (or, when the call
    encloses other ops, its last inner op) to the execution.

    Completion (SYNC edge from the execution to the op that consumed its result; the lag,
    ``min(0, start - end)`` as for every SYNC edge, is counted from the execution's *end*):

    * DDP: the reducer waits for every bucket's all-reduce before it copies the results back
      (``copy_bucket_to_grad`` ranges, in bucket order, right after the wait). Each
      execution that started before the first copy-back of the issuing thread is consumed by
      that copy-back's first op. The gloo range ends a little after the work's future is
      marked complete (the waiting thread resumes up to a few ms before it), hence the
      negative lag of the binding bucket; buckets that were done earlier get lag 0, so a
      what-if that makes them slower makes the thread wait for them.
    * Otherwise (an explicit ``work.wait()``): the issuing thread was idle for at least
      :data:`GLOO_WAIT_WINDOW_NS` as the execution ended and resumed at most
      :data:`GLOO_WAIT_WINDOW_NS` after it, or, while idle for most of the execution,
      before its range ended.

    Returns (src, dst, kind) arrays of op ids.
    """
    z = np.zeros(0, np.int64)
    gl = np.flatnonzero(kind[:n_h] == OpKind.COLLECTIVE)
    if len(gl) == 0:
        return z, z, np.zeros(0, np.int8)
    gl_lanes = set(lane[gl].tolist())
    is_c10d = np.asarray([n.startswith("c10d::") and "barrier" not in n for n in names_arr], bool)
    issue_h = np.flatnonzero(is_c10d[h_name] & ~np.isin(h_lane, list(gl_lanes)))
    if len(issue_h) == 0:
        return z, z, np.zeros(0, np.int8)
    issue_h = issue_h[np.argsort(hs[issue_h], kind="stable")]
    op_of_h = np.full(len(hs), -1, np.int64)
    op_of_h[op_h] = np.arange(n_h)
    gl = gl[np.argsort(start[gl], kind="stable")]
    copy_starts = _copy_back_starts(names_arr, hs, h_name, h_lane)
    src, dst, kd = [], [], []
    k = 0
    for g in gl:
        while k < len(issue_h) and hs[issue_h[k]] > start[g]:
            break
        if k >= len(issue_h) or hs[issue_h[k]] > start[g]:
            continue
        h = issue_h[k]
        k += 1
        o = op_of_h[h]
        if o < 0:  # the call encloses other ops: its last inner op on that lane
            ln = h_lane[h]
            inner = np.flatnonzero((lane[:n_h] == ln) & (start[:n_h] >= hs[h]) & (end[:n_h] <= he[h]))
            if len(inner) == 0:
                continue
            o = int(inner[-1])
        src.append(o)
        dst.append(int(g))
        kd.append(int(EdgeKind.LAUNCH))
        j = _completion_op(int(g), int(o), lane, start, end, n_h, copy_starts)
        if j >= 0:
            src.append(int(g))
            dst.append(j)
            kd.append(int(EdgeKind.SYNC))
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(kd, np.int8)


#: the DDP reducer's copy of an all-reduced bucket back into the gradients (after the wait)
DDP_COPY_BACK = "torch.distributed.ddp.reducer::copy_bucket_to_grad"


def _copy_back_starts(names_arr, hs, h_name, h_lane) -> dict[int, np.ndarray]:
    """Start times of the DDP copy-back ranges (or ops) per lane, sorted."""
    is_copy = np.asarray([n == DDP_COPY_BACK for n in names_arr], bool)
    sel = np.flatnonzero(is_copy[h_name]) if len(names_arr) else np.zeros(0, np.int64)
    out: dict[int, np.ndarray] = {}
    for ln in np.unique(h_lane[sel]).tolist():
        out[int(ln)] = np.sort(hs[sel[h_lane[sel] == ln]])
    return out


def _completion_op(g: int, o: int, lane, start, end, n_h: int, copy_starts) -> int:
    """The op of the issuing thread (op ``o``'s lane) that consumed execution ``g``, or -1
    (see :func:`gloo_edges`)."""
    ln = lane[o]
    lo = int(np.searchsorted(lane[:n_h], ln, side="left"))
    hi = int(np.searchsorted(lane[:n_h], ln, side="right"))
    cs = copy_starts.get(int(ln))
    if cs is not None and len(cs):
        k = int(np.searchsorted(cs, start[g], side="right"))
        if k < len(cs):
            j = lo + int(np.searchsorted(start[lo:hi], cs[k], side="left"))
            if j < hi:
                # the wait is the longest idle gap between the issue and the copy-back,
                # ending after the execution started (with two gloo worker threads an
                # execution can start well after its issue: a gap before that start was
                # spent on other buckets, and an edge to it would run against time)
                a = max(int(o) + 1, lo + 1,
                        lo + int(np.searchsorted(start[lo:hi], start[g], side="right")))
                if a <= j:
                    gaps = start[a:j + 1] - end[a - 1:j]
                    b = a + int(np.argmax(gaps))
                    if gaps[b - a] >= GLOO_WAIT_WINDOW_NS:
                        return b
                return j
    j = lo + int(np.searchsorted(start[lo:hi], end[g], side="left"))
    if lo < j < hi and end[g] - end[j - 1] >= GLOO_WAIT_WINDOW_NS \
            and start[j] - end[g] <= GLOO_WAIT_WINDOW_NS:
        return j  # idle across the end, resumed right after it
    # resumed before the range ended, after idling through most of the execution
    j = lo + int(np.searchsorted(start[lo:hi], start[g], side="right"))
    while j < hi and start[j] <= end[g]:
        gap = start[j] - end[j - 1] if j > lo else 0
        if gap >= GLOO_WAIT_WINDOW_NS and 2 * (start[j] - max(end[j - 1], start[g])) \
                >= end[g] - start[g]:
            return j
        j += 1
    return -1
