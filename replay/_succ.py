"""The contention path's per-graph constraint lists: successors by source and ready-time terms.

Split from :mod:`replay._fluid_jobs` (the hot helpers of the event loop): this is cold set-up,
built once per graph by :func:`replay.engine._succ_of` and memoized there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retime.collectors.progress import watch_compiles

__all__: list[str] = []

# op state bits of the contention kernel (replay._fluid) that depend on the graph alone: is a
# wait source, has wait sources, has start-to-start successors, collective member
_HASW, _WAITS, _S2S, _COLL = 8, 16, 32, 64


@njit(cache=True)
def _succ_lists(lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src, pred_lag, pred_s2s):
    """Constraint lists of the contention path (per-graph constants, built once per graph).

    Returns ``sptr``, ``succ``, ``cnt0``, ``smid``, ``pptr``, ``pent``:

    * successors by source, CSR ``sptr`` (int32[N+1]) / ``succ`` (int32, destination ops):
      each source's start-to-start successors first (``sptr[i]:smid[i]``, resolved when
      ``i`` starts), then the others (``smid[i]:sptr[i + 1]``, resolved when ``i`` is
      finalized), each part in the order lane successor, then edges by destination; ``cnt0``
      (int32[N]) counts each op's entries. A lane link that an edge from the same source
      and of the same kind repeats (most lane links of a synthesized trace) is left out:
      both resolve in the same pass over the source's list, and the edge's entry comes later
      in it, so the op is released at the same point as with both;
    * the ready-time terms by destination, CSR ``pptr`` (int32[N+1]) / ``pent`` (int64
      pairs ``2 * src + s2s``, ``lag``): the lane link first, then the edges, leaving out
      an edge with the lane link's source and kind and a lag no larger than its (its term
      can never exceed the lane term, and a later term must exceed the running maximum to
      count).
    """
    n = lane_prev.shape[0]
    lane_dup = np.zeros(n, np.bool_)  # lane link repeated by an edge of the same kind
    ndrop = 0  # edges left out of the ready terms
    for i in range(n):
        p = lane_prev[i]
        if p < 0:
            continue
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if pred_src[k] == p and pred_s2s[k] == lane_s2s[i]:
                lane_dup[i] = True
                if pred_lag[k] <= lane_lag[i]:
                    ndrop += 1
    sptr = np.zeros(n + 1, np.int32)
    nss = np.zeros(n + 1, np.int32)  # start-to-start successors per source
    for i in range(n):
        p = lane_prev[i]
        if p >= 0 and not lane_dup[i]:
            sptr[p + 1] += 1
            if lane_s2s[i]:
                nss[p] += 1
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            sptr[pred_src[k] + 1] += 1
            if pred_s2s[k]:
                nss[pred_src[k]] += 1
    for i in range(n):
        sptr[i + 1] += sptr[i]
    fs = np.empty(n, np.int32)  # fill cursors: start-to-start part, then the rest
    fe = np.empty(n, np.int32)
    smid = np.empty(n, np.int32)
    for i in range(n):
        fs[i] = sptr[i]
        smid[i] = sptr[i] + nss[i]
        fe[i] = smid[i]
    succ = np.empty(sptr[n], np.int32)
    for i in range(n):
        p = lane_prev[i]
        if p >= 0 and not lane_dup[i]:
            if lane_s2s[i]:
                succ[fs[p]] = i
                fs[p] += 1
            else:
                succ[fe[p]] = i
                fe[p] += 1
    for i in range(n):
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            s = pred_src[k]
            if pred_s2s[k]:
                succ[fs[s]] = i
                fs[s] += 1
            else:
                succ[fe[s]] = i
                fe[s] += 1
    cnt0 = np.empty(n, np.int32)
    for i in range(n):
        cnt0[i] = (1 if lane_prev[i] >= 0 and not lane_dup[i] else 0) + (pred_ptr[i + 1]
                                                                           - pred_ptr[i])
    # ready-time terms
    pptr = np.empty(n + 1, np.int32)
    pent = np.empty(2 * (n + pred_src.shape[0] - ndrop), np.int64)
    e = 0
    for i in range(n):
        pptr[i] = e
        p = lane_prev[i]
        if p >= 0:
            pent[2 * e] = 2 * np.int64(p) + (1 if lane_s2s[i] else 0)
            pent[2 * e + 1] = lane_lag[i]
            e += 1
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if (p >= 0 and pred_src[k] == p and pred_s2s[k] == lane_s2s[i]
                    and pred_lag[k] <= lane_lag[i]):
                continue
            pent[2 * e] = 2 * np.int64(pred_src[k]) + (1 if pred_s2s[k] else 0)
            pent[2 * e + 1] = pred_lag[k]
            e += 1
    pptr[n] = e
    return sptr, succ, cnt0, smid, pptr, pent[:2 * e]


@njit(cache=True)
def _fluid_consts(coll_of, coll_ptr, origin, device, link, resource, wait_ptr, wait_src,
                  sptr, smid, cnt0):
    """The contention kernel's per-graph set-up (built once per graph, like
    :func:`_succ_lists`, whose ``sptr``, ``smid``, ``cnt0`` it reads): each scenario then
    copies two arrays instead of a pass over ten (~5 ns per op of the ~80).

    Returns ``state0`` (uint8[N]: the graph's state bits ``_HASW``, ``_WAITS``, ``_S2S``,
    ``_COLL``), ``roots`` (int32: the ops without start constraints, in layout order),
    ``wkey`` (int64: the wait links as ``src * N + dst``, sorted) and ``dims`` (int64[4]:
    the earliest origin, the number of devices and of links (at least 1), and a bound on
    the number of jobs: collectives and the other ops with a resource).
    """
    n = coll_of.shape[0]
    state0 = np.empty(n, np.uint8)
    roots = np.empty(n, np.int32)
    nroots = 0
    base = origin[0] if n else np.int64(0)
    ndev = 1
    nlink = 1
    njobs = coll_ptr.shape[0] - 1
    for i in range(n):
        if cnt0[i] == 0:
            roots[nroots] = i
            nroots += 1
        if origin[i] < base:
            base = origin[i]
        if device[i] + 1 > ndev:
            ndev = device[i] + 1
        if link[i] + 1 > nlink:
            nlink = link[i] + 1
        b = np.uint8(0)
        if wait_ptr[i + 1] > wait_ptr[i]:
            b |= _WAITS
        if smid[i] > sptr[i]:
            b |= _S2S
        if coll_of[i] >= 0:
            b |= _COLL
        elif resource[i] > 0:
            njobs += 1
        state0[i] = b
    nw = wait_src.shape[0]  # wait links: (src, dst) pairs sorted by src then dst
    wkey = np.empty(nw, np.int64)
    k = 0
    for i in range(n):
        for kk in range(wait_ptr[i], wait_ptr[i + 1]):
            wkey[k] = np.int64(wait_src[kk]) * n + i
            k += 1
    wkey = np.sort(wkey)
    for k in range(nw):
        state0[wkey[k] // n] |= _HASW
    dims = np.empty(4, np.int64)
    dims[0] = base
    dims[1] = ndev
    dims[2] = nlink
    dims[3] = njobs
    return state0, roots[:nroots].copy(), wkey, dims

watch_compiles()  # say so on stderr when these kernels compile on first use
