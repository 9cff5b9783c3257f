"""numba kernels of the replay engine (arrays in, arrays out; no objects, no pandas).

Conventions: every time is an ``int64`` nanosecond count unless a name says otherwise, op
ids are ``int64`` row numbers of the Trace's ``ops`` table, ``-1`` means "none". The public,
typed wrappers live in :mod:`replay.graph` and :mod:`replay.engine`; only they call these.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NEG = np.int64(-(2**62))  # "minus infinity" that survives adding a lag


@njit(cache=True)
def _topo_order_by_time(node_of, succ_ptr, succ_dst, indeg, key):
    """Kahn's algorithm over super-nodes (an op, or all members of one collective; ``node_of``
    maps each op to its representative) taking, among the ready ones, the one with the smallest
    ``(key, id)`` (``key``: measured start; a collective's: its last member's start).

    The result is a valid topological order close to measured time order. The graph builder
    lays the ops out in this order, so both replay paths walk memory almost sequentially.
    Returns ``order`` (int64[K], representatives) and ``count`` (K; fewer than the number
    of super-nodes means a cycle).
    """
    n = node_of.shape[0]
    order = np.empty(n, np.int64)
    heap = np.empty(n + 1, np.int64)
    ids = np.arange(n)
    size = 0
    cnt = 0
    for i in range(n):
        if node_of[i] == i and indeg[i] == 0:
            size = _hpush(heap, size, key, ids, i)
    while size > 0:
        u, size = _hpop(heap, size, key, ids)
        order[cnt] = u
        cnt += 1
        for k in range(succ_ptr[u], succ_ptr[u + 1]):
            v = succ_dst[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                size = _hpush(heap, size, key, ids, v)
    return order[:cnt], cnt


@njit(cache=True, inline="always")
def _ready(i, start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src, pred_lag,
           pred_s2s):
    """Earliest start of op ``i`` allowed by its lane and its edges, and the binding op.

    A lane link or an edge flagged ``*_s2s`` counts from its source's start, the others
    from its end.
    """
    ready = _NEG
    crit = np.int64(-1)
    p = lane_prev[i]
    if p >= 0:
        ready = (start[p] if lane_s2s[i] else end[p]) + lane_lag[i]
        crit = p
    for k in range(pred_ptr[i], pred_ptr[i + 1]):
        if pred_s2s[k]:
            v = start[pred_src[k]] + pred_lag[k]
        else:
            v = end[pred_src[k]] + pred_lag[k]
        if v > ready:
            ready = v
            crit = pred_src[k]
    if crit < 0:
        ready = origin[i]
    return ready, crit


@njit(cache=True)
def _fast_replay(order, coll_of, coll_ptr, coll_members, dur, delay, origin, lane_prev,
                 lane_lag, lane_s2s, pred_ptr, pred_src, pred_lag, pred_s2s, wait_ptr, wait_src,
                 wait_lag):
    """Longest-path list scheduling in topological order, O(N + E).

    An op starts at ``max(lane predecessor end + lane_lag, pred end + lag) + delay`` (its
    ``origin`` when it has no predecessor at all) and ends at ``start + dur``, or later when a
    wait edge says so (``end >= wait_src end + wait_lag``: blocking host calls). A collective
    member starts at its own ready time; the collective begins when the last member has
    started (time ``A``) and member ``m`` ends at ``max(start_m, A + dur_m)`` (``dur_m`` is its
    transfer tail after the last arrival).

    Returns ``start``, ``end``, ``crit`` (int64[N]): ``crit[i]`` is the op whose end bound
    ``i``'s end (through its start or a wait), ``-1`` for roots.
    """
    n = dur.shape[0]
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    crit = np.full(n, -1, np.int64)
    for t in range(order.shape[0]):
        u = order[t]
        c = coll_of[u]
        if c < 0:
            # the common case, written out (no helper call) to keep the loop tight
            ready = _NEG
            cp = -1
            p = lane_prev[u]
            if p >= 0:
                ready = (start[p] if lane_s2s[u] else end[p]) + lane_lag[u]
                cp = p
            for k in range(pred_ptr[u], pred_ptr[u + 1]):
                sp = pred_src[k]
                v = (start[sp] if pred_s2s[k] else end[sp]) + pred_lag[k]
                if v > ready:
                    ready = v
                    cp = sp
            if cp < 0:
                ready = origin[u]
            s = ready + delay[u]
            e = s + dur[u]
            w0 = wait_ptr[u]
            w1 = wait_ptr[u + 1]
            if w0 < w1:
                for k in range(w0, w1):
                    v = end[wait_src[k]] + wait_lag[k]
                    if v > e:
                        e = v
                        cp = wait_src[k]
            start[u] = s
            end[u] = e
            crit[u] = cp
        else:
            a = _NEG
            last = np.int64(-1)
            for k in range(coll_ptr[c], coll_ptr[c + 1]):
                m = coll_members[k]
                r, cp = _ready(m, start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr,
                               pred_src, pred_lag, pred_s2s)
                s = r + delay[m]
                start[m] = s
                crit[m] = cp
                if s > a:
                    a = s
                    last = m
            for k in range(coll_ptr[c], coll_ptr[c + 1]):
                m = coll_members[k]
                e = start[m]
                v = a + dur[m]
                if v > e:
                    e = v
                    if m != last:
                        crit[m] = last
                for j in range(wait_ptr[m], wait_ptr[m + 1]):
                    v = end[wait_src[j]] + wait_lag[j]
                    if v > e:
                        e = v
                        crit[m] = wait_src[j]
                end[m] = e
    return start, end, crit


@njit(cache=True)
def _measured_ready(start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src,
                    pred_lag, pred_s2s):
    """Ready time of every op computed from the measured times of its predecessors."""
    n = start.shape[0]
    out = np.empty(n, np.int64)
    for i in range(n):
        r, _ = _ready(i, start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src,
                      pred_lag, pred_s2s)
        out[i] = r
    return out


# ============================================================================ heaps
# Used by the topological sort here and the contention path (replay/_fluid.py): two binary heaps of (time float64, seq int64): one of op start events (each op once), one
# indexed heap of job progress events (one live entry per running job, updated in place when
# its rate changes). Ties: job events before start events, then by sequence number.


@njit(cache=True)
def _less(t, q, a, b):
    return t[a] < t[b] or (t[a] == t[b] and q[a] < q[b])


@njit(cache=True)
def _hpush(heap, size, t, q, x):
    """Plain heap of ids ``x`` keyed by ``(t[x], q[x])``; returns the new size."""
    i = size
    heap[i] = x
    while i > 0:
        p = (i - 1) >> 1
        if _less(t, q, heap[i], heap[p]):
            heap[i], heap[p] = heap[p], heap[i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True)
def _hpop(heap, size, t, q):
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        lc = 2 * i + 1
        if lc >= size:
            break
        c = lc
        if lc + 1 < size and _less(t, q, heap[lc + 1], heap[lc]):
            c = lc + 1
        if _less(t, q, heap[c], heap[i]):
            heap[i], heap[c] = heap[c], heap[i]
            i = c
        else:
            break
    return top, size


@njit(cache=True)
def _ixsift(heap, pos, size, t, q, i):
    """Restore the indexed heap around slot ``i`` (after its key changed)."""
    while i > 0:
        p = (i - 1) >> 1
        if _less(t, q, heap[i], heap[p]):
            heap[i], heap[p] = heap[p], heap[i]
            pos[heap[i]] = i
            pos[heap[p]] = p
            i = p
        else:
            break
    while True:
        lc = 2 * i + 1
        if lc >= size:
            break
        c = lc
        if lc + 1 < size and _less(t, q, heap[lc + 1], heap[lc]):
            c = lc + 1
        if _less(t, q, heap[c], heap[i]):
            heap[i], heap[c] = heap[c], heap[i]
            pos[heap[i]] = i
            pos[heap[c]] = c
            i = c
        else:
            break


@njit(cache=True)
def _ixremove(heap, pos, size, t, q, j):
    i = pos[j]
    size -= 1
    pos[j] = -1
    if i != size:
        heap[i] = heap[size]
        pos[heap[i]] = i
        _ixsift(heap, pos, size, t, q, i)
    return size
