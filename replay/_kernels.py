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
            r, cp = _ready(u, start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src,
                           pred_lag, pred_s2s)
            s = r + delay[u]
            e = s + dur[u]
            for k in range(wait_ptr[u], wait_ptr[u + 1]):
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


# ============================================================================ contention path
# Two binary heaps of (time float64, seq int64): one of op start events (each op once), one
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


@njit(cache=True)
def _fluid_replay(coll_of, coll_ptr, coll_members, dur, delay, origin, lane_prev, lane_lag,
                  lane_s2s, pred_ptr, pred_src, pred_lag, pred_s2s, wait_ptr, wait_src, wait_lag, device, resource,
                  link, interference, share_compute, share_links):
    """Event-driven fluid replay with resource sharing (the contention path).

    Same constraints as :func:`_fast_replay`. Ops with a resource (``resource`` 1 = compute
    on ``device``, 2 = communication over ``link``) run as *jobs* whose progress rate is set
    by the ops running at the same time: compute jobs share their device equally when
    ``share_compute``; communication jobs (a whole collective is one job over the links of
    its members) get max-min fair shares of unit-capacity links when ``share_links``; while a
    device runs both compute and communication, both progress at ``1 / (1 + interference)``.
    A collective's job starts when its last member has started and member ``m`` completes
    once the job's progress reaches ``dur[m]``. Ops without a resource take exactly
    ``dur``; their successors are resolved when they start (so negative lags from them,
    like launch edges, are exact). A start that would fall before the current event time
    (a negative lag from a job) is clamped to it and counted.

    Times are float64 internally relative to ``origin.min()``.

    Returns ``start``, ``end``, ``crit`` (int64[N], rounded) and the number of clamped
    starts (``-1`` if some op could never start: a cycle).
    """
    n = dur.shape[0]
    nc = coll_ptr.shape[0] - 1
    nj = n + nc
    base = origin.min() if n else np.int64(0)
    # ---- successor lists (lane next, start edges, wait edges)
    lane_next = np.full(n, -1, np.int64)
    for i in range(n):
        if lane_prev[i] >= 0:
            lane_next[lane_prev[i]] = i
    e = pred_src.shape[0]
    succ_ptr = np.zeros(n + 1, np.int64)
    for k in range(e):
        succ_ptr[pred_src[k] + 1] += 1
    for i in range(n):
        succ_ptr[i + 1] += succ_ptr[i]
    succ = np.empty(e, np.int64)
    succ_s2s = np.empty(e, np.bool_)
    fill = succ_ptr[:-1].copy()
    for i in range(n):
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            s = pred_src[k]
            succ[fill[s]] = i
            succ_s2s[fill[s]] = pred_s2s[k]
            fill[s] += 1
    w = wait_src.shape[0]
    wsucc_ptr = np.zeros(n + 1, np.int64)
    for k in range(w):
        wsucc_ptr[wait_src[k] + 1] += 1
    for i in range(n):
        wsucc_ptr[i + 1] += wsucc_ptr[i]
    wsucc = np.empty(w, np.int64)
    fill = wsucc_ptr[:-1].copy()
    for i in range(n):
        for k in range(wait_ptr[i], wait_ptr[i + 1]):
            s = wait_src[k]
            wsucc[fill[s]] = i
            fill[s] += 1
    # ---- per-op state
    pending = np.zeros(n, np.int64)
    wpending = np.zeros(n, np.int64)
    for i in range(n):
        pending[i] = (1 if lane_prev[i] >= 0 else 0) + pred_ptr[i + 1] - pred_ptr[i]
        wpending[i] = wait_ptr[i + 1] - wait_ptr[i]
    start = np.zeros(n, np.float64)
    end = np.zeros(n, np.float64)
    own = np.full(n, np.nan)  # own completion time (before waits)
    crit = np.full(n, -1, np.int64)
    endi = np.zeros(n, np.int64)  # integer view used by _ready (times relative to base)
    # ---- jobs
    job_done = np.zeros(nj, np.float64)
    job_rate = np.zeros(nj, np.float64)
    job_last = np.zeros(nj, np.float64)
    job_thr = np.zeros(nj, np.float64)
    job_k = np.zeros(nj, np.int64)  # next member (flows)
    job_t = np.zeros(nj, np.float64)
    job_q = np.zeros(nj, np.int64)
    arrived = np.zeros(max(nc, 1), np.int64)
    coll_a = np.zeros(max(nc, 1), np.float64)
    coll_last = np.full(max(nc, 1), -1, np.int64)
    # collective members by threshold (max(dur, 0)), ties by op id
    csorted = coll_members.copy()
    for c in range(nc):
        a0, a1 = coll_ptr[c], coll_ptr[c + 1]
        seg = csorted[a0:a1]
        keys = np.empty(a1 - a0, np.float64)
        for k in range(a1 - a0):
            keys[k] = float(max(dur[seg[k]], 0))
        idx = np.argsort(keys, kind="mergesort")
        csorted[a0:a1] = seg[idx]
    active = np.empty(nj, np.int64)
    apos = np.full(nj, -1, np.int64)
    n_active = 0
    ndev = 1
    nlink = 1
    for i in range(n):
        if device[i] + 1 > ndev:
            ndev = device[i] + 1
        if link[i] + 1 > nlink:
            nlink = link[i] + 1
    n_compute = np.zeros(ndev, np.int64)
    n_comm = np.zeros(ndev, np.int64)
    sharing = share_compute or share_links or interference > 0.0
    inv = 1.0 / (1.0 + interference)
    link_cap = np.zeros(nlink, np.float64)
    link_cnt = np.zeros(nlink, np.int64)
    frozen = np.zeros(nj, np.bool_)
    share = np.ones(nj, np.float64)
    # ---- heaps
    st_t = np.zeros(n, np.float64)
    st_q = np.zeros(n, np.int64)
    sheap = np.empty(n + 1, np.int64)
    ssize = 0
    jheap = np.empty(nj + 1, np.int64)
    jpos = np.full(nj, -1, np.int64)
    jsize = 0
    seq = np.int64(0)
    clamped = 0
    started = 0
    # roots
    for i in range(n):
        if pending[i] == 0:
            st_t[i] = float(origin[i] - base + delay[i])
            st_q[i] = seq
            seq += 1
            ssize = _hpush(sheap, ssize, st_t, st_q, i)
    # finalize stack: ops whose end is known and whose successors must be resolved
    fstack = np.empty(n + 1, np.int64)
    now = 0.0
    while ssize > 0 or jsize > 0:
        take_job = jsize > 0 and (ssize == 0 or job_t[jheap[0]] <= st_t[sheap[0]])
        nf = 0
        if take_job:
            j = jheap[0]
            now = job_t[j]
            job_done[j] = job_thr[j]  # exact: the event fires when the threshold is reached
            job_last[j] = now
            if j < n:
                own[j] = now
                members_done = True
                m = j
                if wpending[m] == 0:
                    fstack[nf] = m
                    nf += 1
            else:
                c = j - n
                a0, a1 = coll_ptr[c], coll_ptr[c + 1]
                while job_k[j] < a1 - a0:
                    m = csorted[a0 + job_k[j]]
                    thr = max(dur[m], 0) * 1.0
                    if thr > job_done[j]:
                        break
                    own[m] = now
                    job_k[j] += 1
                    if wpending[m] == 0:
                        fstack[nf] = m
                        nf += 1
                members_done = job_k[j] == a1 - a0
                if not members_done:
                    m = csorted[a0 + job_k[j]]
                    job_thr[j] = max(dur[m], 0) * 1.0
                    job_t[j] = now + (job_thr[j] - job_done[j]) / job_rate[j]
                    job_q[j] = seq
                    seq += 1
                    _ixsift(jheap, jpos, jsize, job_t, job_q, jpos[j])
            if members_done:
                jsize = _ixremove(jheap, jpos, jsize, job_t, job_q, j)
                # deactivate
                p = apos[j]
                n_active -= 1
                active[p] = active[n_active]
                apos[active[p]] = p
                apos[j] = -1
                if j < n and resource[j] == 1:
                    n_compute[device[j]] -= 1
                else:
                    _touch_comm(j, n, coll_ptr, coll_members, device, n_comm, -1)
                if sharing:
                    seq = _rerate(now, active, n_active, n, coll_ptr, coll_members, device,
                                  resource, link, n_compute, n_comm, share_compute,
                                  share_links, interference, inv, link_cap, link_cnt, frozen,
                                  share, job_done, job_rate, job_last, job_thr, job_t, job_q,
                                  jheap, jpos, jsize, seq)
        else:
            i, ssize = _hpop(sheap, ssize, st_t, st_q)
            now = st_t[i]
            start[i] = now
            started += 1
            q = lane_next[i]
            if q >= 0 and lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    seq, ssize, clamped = _release(q, now, start, end, origin, base, delay,
                                                   lane_prev, lane_lag, lane_s2s, pred_ptr,
                                                   pred_src, pred_lag, pred_s2s, crit, st_t,
                                                   st_q, sheap, ssize, seq, clamped)
            for k in range(succ_ptr[i], succ_ptr[i + 1]):  # edges counted from this start
                if succ_s2s[k]:
                    q = succ[k]
                    pending[q] -= 1
                    if pending[q] == 0:
                        seq, ssize, clamped = _release(q, now, start, end, origin, base, delay,
                                                       lane_prev, lane_lag, lane_s2s, pred_ptr,
                                                       pred_src, pred_lag, pred_s2s, crit, st_t, st_q,
                                                       sheap, ssize, seq, clamped)
            c = coll_of[i]
            newjob = -1
            if c >= 0:
                arrived[c] += 1
                if start[i] > coll_a[c] or coll_last[c] < 0:
                    coll_a[c] = start[i]
                if arrived[c] == coll_ptr[c + 1] - coll_ptr[c]:
                    # the last member sets A; `last` = first member (op order) at max start
                    a = -np.inf
                    for k in range(coll_ptr[c], coll_ptr[c + 1]):
                        m = coll_members[k]
                        if start[m] > a:
                            a = start[m]
                            coll_last[c] = m
                    coll_a[c] = a
                    j = n + c
                    a0, a1 = coll_ptr[c], coll_ptr[c + 1]
                    while job_k[j] < a1 - a0:  # members with no transfer tail end at once
                        m = csorted[a0 + job_k[j]]
                        if dur[m] > 0:
                            break
                        own[m] = a + dur[m]
                        job_k[j] += 1
                        if wpending[m] == 0:
                            fstack[nf] = m
                            nf += 1
                    if job_k[j] < a1 - a0:
                        newjob = j
                        job_thr[j] = max(dur[csorted[a0 + job_k[j]]], 0) * 1.0
            elif resource[i] > 0 and dur[i] > 0:
                newjob = i
                job_thr[i] = dur[i] * 1.0
            else:
                own[i] = now + dur[i]
                if wpending[i] == 0:
                    fstack[nf] = i
                    nf += 1
            if newjob >= 0:
                j = newjob
                job_done[j] = 0.0
                job_last[j] = now
                job_rate[j] = 1.0
                active[n_active] = j
                apos[j] = n_active
                n_active += 1
                if j < n and resource[j] == 1:
                    n_compute[device[j]] += 1
                else:
                    _touch_comm(j, n, coll_ptr, coll_members, device, n_comm, 1)
                job_t[j] = now + job_thr[j]
                job_q[j] = seq
                seq += 1
                jpos[j] = jsize
                jheap[jsize] = j
                jsize += 1
                _ixsift(jheap, jpos, jsize, job_t, job_q, jsize - 1)
                if sharing:
                    job_rate[j] = -1.0  # force (re)scheduling at the computed rate
                    seq = _rerate(now, active, n_active, n, coll_ptr, coll_members, device,
                                  resource, link, n_compute, n_comm, share_compute,
                                  share_links, interference, inv, link_cap, link_cnt, frozen,
                                  share, job_done, job_rate, job_last, job_thr, job_t, job_q,
                                  jheap, jpos, jsize, seq)
        # ---- finalize ops whose end is known; resolve their successors
        while nf > 0:
            nf -= 1
            i = fstack[nf]
            # end: own completion (collective members: max(start, A + tail)), then waits
            cc = coll_of[i]
            if cc >= 0:
                ev = start[i]
                v = own[i]
                if v > ev:
                    ev = v
                    if i != coll_last[cc]:
                        crit[i] = coll_last[cc]
            else:
                ev = own[i]
            for k in range(wait_ptr[i], wait_ptr[i + 1]):
                v = end[wait_src[k]] + wait_lag[k]
                if v > ev:
                    ev = v
                    crit[i] = wait_src[k]
            end[i] = ev
            endi[i] = np.int64(np.rint(ev))
            q = lane_next[i]
            if q >= 0 and not lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    seq, ssize, clamped = _release(q, now, start, end, origin, base, delay,
                                                   lane_prev, lane_lag, lane_s2s, pred_ptr,
                                                   pred_src, pred_lag, pred_s2s, crit, st_t, st_q, sheap, ssize, seq,
                                                   clamped)
            for k in range(succ_ptr[i], succ_ptr[i + 1]):
                if succ_s2s[k]:
                    continue
                q = succ[k]
                pending[q] -= 1
                if pending[q] == 0:
                    seq, ssize, clamped = _release(q, now, start, end, origin, base, delay,
                                                   lane_prev, lane_lag, lane_s2s, pred_ptr,
                                                   pred_src, pred_lag, pred_s2s, crit, st_t, st_q, sheap, ssize, seq,
                                                   clamped)
            for k in range(wsucc_ptr[i], wsucc_ptr[i + 1]):
                q = wsucc[k]
                wpending[q] -= 1
                if wpending[q] == 0 and not np.isnan(own[q]):
                    fstack[nf] = q
                    nf += 1
    if started < n:
        return (np.zeros(n, np.int64), np.zeros(n, np.int64), crit, -1)
    s_out = np.empty(n, np.int64)
    e_out = np.empty(n, np.int64)
    for i in range(n):
        s_out[i] = np.int64(np.rint(start[i])) + base
        e_out[i] = np.int64(np.rint(end[i])) + base
    return s_out, e_out, crit, clamped


@njit(cache=True)
def _release(q, now, start, end, origin, base, delay, lane_prev, lane_lag, lane_s2s, pred_ptr,
             pred_src, pred_lag, pred_s2s, crit, st_t, st_q, sheap, ssize, seq, clamped):
    """All start constraints of ``q`` are resolved: compute its start, push the event."""
    ready = -np.inf
    cp = np.int64(-1)
    p = lane_prev[q]
    if p >= 0:
        ready = (start[p] if lane_s2s[q] else end[p]) + lane_lag[q]
        cp = p
    for k in range(pred_ptr[q], pred_ptr[q + 1]):
        if pred_s2s[k]:
            v = start[pred_src[k]] + pred_lag[k]
        else:
            v = end[pred_src[k]] + pred_lag[k]
        if v > ready:
            ready = v
            cp = pred_src[k]
    if cp < 0:
        ready = float(origin[q] - base)
    s = ready + delay[q]
    if s < now:
        s = now
        clamped += 1
    crit[q] = cp
    st_t[q] = s
    st_q[q] = seq
    seq += 1
    ssize = _hpush(sheap, ssize, st_t, st_q, q)
    return seq, ssize, clamped


@njit(cache=True)
def _touch_comm(j, n, coll_ptr, coll_members, device, n_comm, delta):
    if j < n:
        if device[j] >= 0:
            n_comm[device[j]] += delta
    else:
        c = j - n
        for k in range(coll_ptr[c], coll_ptr[c + 1]):
            d = device[coll_members[k]]
            if d >= 0:
                n_comm[d] += delta


@njit(cache=True)
def _rerate(now, active, n_active, n, coll_ptr, coll_members, device, resource, link,
            n_compute, n_comm, share_compute, share_links, interference, inv, link_cap,
            link_cnt, frozen, share, job_done, job_rate, job_last, job_thr, job_t, job_q,
            jheap, jpos, jsize, seq):
    """Recompute every running job's rate; reschedule the jobs whose rate changed."""
    # max-min fair link shares by progressive filling over the running communication jobs
    if share_links:
        n_flows = 0
        for a in range(n_active):
            j = active[a]
            if j >= n or resource[j] == 2:
                n_flows += 1
                frozen[j] = False
                share[j] = 1.0
                _links_add(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, 1)
        left = n_flows
        while left > 0:
            best = np.inf
            for a in range(n_active):
                j = active[a]
                if (j >= n or resource[j] == 2) and not frozen[j]:
                    v = _flow_share(j, n, coll_ptr, coll_members, link, link_cnt, link_cap)
                    if v < best:
                        best = v
            # freeze every unfrozen flow whose bottleneck share equals best
            progressed = False
            for a in range(n_active):
                j = active[a]
                if (j >= n or resource[j] == 2) and not frozen[j]:
                    v = _flow_share(j, n, coll_ptr, coll_members, link, link_cnt, link_cap)
                    if v <= best:
                        frozen[j] = True
                        share[j] = min(best, 1.0)
                        left -= 1
                        progressed = True
                        _links_freeze(j, n, coll_ptr, coll_members, link, link_cnt, link_cap,
                                      share[j])
            if not progressed:
                break
        for a in range(n_active):  # reset link bookkeeping
            j = active[a]
            if j >= n or resource[j] == 2:
                _links_reset(j, n, coll_ptr, coll_members, link, link_cnt, link_cap)
    for a in range(n_active):
        j = active[a]
        if j < n and resource[j] == 1:
            d = device[j]
            r = 1.0
            if share_compute and n_compute[d] > 1:
                r = 1.0 / n_compute[d]
            if interference > 0.0 and n_comm[d] > 0:
                r = r * inv
        else:
            r = share[j] if share_links else 1.0
            if interference > 0.0 and _touches_compute(j, n, coll_ptr, coll_members, device,
                                                       n_compute):
                r = r * inv
        if r != job_rate[j]:
            if job_rate[j] > 0.0:
                job_done[j] += (now - job_last[j]) * job_rate[j]
            job_last[j] = now
            job_rate[j] = r
            rem = job_thr[j] - job_done[j]
            if rem < 0.0:
                rem = 0.0
            job_t[j] = now + rem / r
            job_q[j] = seq
            seq += 1
            _ixsift(jheap, jpos, jsize, job_t, job_q, jpos[j])
    return seq


@njit(cache=True)
def _touches_compute(j, n, coll_ptr, coll_members, device, n_compute):
    if j < n:
        return device[j] >= 0 and n_compute[device[j]] > 0
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        d = device[coll_members[k]]
        if d >= 0 and n_compute[d] > 0:
            return True
    return False


@njit(cache=True)
def _links_add(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, delta):
    if j < n:
        if link[j] >= 0:
            link_cnt[link[j]] += delta
            link_cap[link[j]] = 1.0
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] += delta
            link_cap[lk] = 1.0


@njit(cache=True)
def _flow_share(j, n, coll_ptr, coll_members, link, link_cnt, link_cap):
    """Bottleneck fair share of flow ``j``: min over its links of capacity left / flows."""
    best = np.inf
    if j < n:
        lk = link[j]
        if lk >= 0 and link_cnt[lk] > 0:
            best = link_cap[lk] / link_cnt[lk]
        return best
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0 and link_cnt[lk] > 0:
            v = link_cap[lk] / link_cnt[lk]
            if v < best:
                best = v
    return best


@njit(cache=True)
def _links_freeze(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, rate):
    if j < n:
        lk = link[j]
        if lk >= 0:
            link_cnt[lk] -= 1
            link_cap[lk] -= rate
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] -= 1
            link_cap[lk] -= rate


@njit(cache=True)
def _links_reset(j, n, coll_ptr, coll_members, link, link_cnt, link_cap):
    if j < n:
        if link[j] >= 0:
            link_cnt[link[j]] = 0
            link_cap[link[j]] = 0.0
        return
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        lk = link[coll_members[k]]
        if lk >= 0:
            link_cnt[lk] = 0
            link_cap[lk] = 0.0
