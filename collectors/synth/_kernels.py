"""numba kernels of the synthesizer (list scheduling of the representative ranks)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..progress import watch_compiles

__all__ = ["_list_schedule", "_release"]


@njit(cache=True)
def _list_schedule(dur, lane, n_lanes, src, dst, lag, group):  # pragma: no cover - compiled
    """Earliest start times under data edges and FIFO lanes, in topological order.

    Parameters
    ----------
    dur : int64[n]   op durations (ns)
    lane : int32[n]  lane of each op; ops of a lane run in index order (FIFO)
    n_lanes : int    number of lanes (max(lane) + 1)
    src, dst, lag : int64[e]  edges ``src -> dst``: ``start[dst] >= end[src] + lag``
    group : int64[n] collective instance of each op (-1 none): members of one instance
        start together, at the latest member's ready time

    Returns
    -------
    start : int64[n]  start times (ns); ``done`` : int64 number of ops scheduled
    (``done < n`` means the edges contain a cycle).
    """
    n = dur.shape[0]
    e = src.shape[0]
    # successor CSR over explicit edges + one implicit edge per lane (previous op -> op)
    lane_prev = np.full(n, -1, np.int64)
    last = np.full(n_lanes, -1, np.int64)
    for i in range(n):
        lp = last[lane[i]]
        lane_prev[i] = lp
        last[lane[i]] = i
    deg = np.zeros(n + 1, np.int64)
    indeg = np.zeros(n, np.int64)
    for j in range(e):
        deg[src[j] + 1] += 1
        indeg[dst[j]] += 1
    for i in range(n):
        if lane_prev[i] >= 0:
            deg[lane_prev[i] + 1] += 1
            indeg[i] += 1
    for i in range(n):
        deg[i + 1] += deg[i]
    succ = np.empty(deg[n], np.int64)
    slag = np.empty(deg[n], np.int64)
    fill = deg[:-1].copy()
    for j in range(e):
        s = src[j]
        succ[fill[s]] = dst[j]
        slag[fill[s]] = lag[j]
        fill[s] += 1
    for i in range(n):
        p = lane_prev[i]
        if p >= 0:
            succ[fill[p]] = i
            slag[fill[p]] = 0
            fill[p] += 1
    # members of each collective instance (CSR), and how many are ready so far
    n_groups = 0
    for i in range(n):
        if group[i] + 1 > n_groups:
            n_groups = group[i] + 1
    gptr = np.zeros(n_groups + 1, np.int64)
    for i in range(n):
        if group[i] >= 0:
            gptr[group[i] + 1] += 1
    for g in range(n_groups):
        gptr[g + 1] += gptr[g]
    members = np.empty(gptr[n_groups], np.int64)
    gfill = gptr[:-1].copy()
    for i in range(n):
        g = group[i]
        if g >= 0:
            members[gfill[g]] = i
            gfill[g] += 1
    arrived = np.zeros(n_groups, np.int64)
    start = np.zeros(n, np.int64)
    queue = np.empty(n, np.int64)
    head = 0
    tail = 0
    for i in range(n):
        if indeg[i] == 0:
            g = group[i]
            if g < 0:
                queue[tail] = i
                tail += 1
            else:
                arrived[g] += 1
                if arrived[g] == gptr[g + 1] - gptr[g]:
                    tail = _release(g, gptr, members, start, queue, tail)
    while head < tail:
        u = queue[head]
        head += 1
        end = start[u] + dur[u]
        for q in range(deg[u], deg[u + 1]):
            v = succ[q]
            t = end + slag[q]
            if t > start[v]:
                start[v] = t
            indeg[v] -= 1
            if indeg[v] == 0:
                g = group[v]
                if g < 0:
                    queue[tail] = v
                    tail += 1
                else:
                    arrived[g] += 1
                    if arrived[g] == gptr[g + 1] - gptr[g]:
                        tail = _release(g, gptr, members, start, queue, tail)
    return start, head


@njit(cache=True)
def _release(g, gptr, members, start, queue, tail):  # pragma: no cover - compiled
    """All members of collective ``g`` are ready: start them together, enqueue them."""
    t = 0
    for q in range(gptr[g], gptr[g + 1]):
        if start[members[q]] > t:
            t = start[members[q]]
    for q in range(gptr[g], gptr[g + 1]):
        start[members[q]] = t
        queue[tail] = members[q]
        tail += 1
    return tail

watch_compiles()  # say so on stderr when these kernels compile on first use
