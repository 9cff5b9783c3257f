"""numba kernels of the contention path: an event-driven fluid simulation.

Split from :mod:`replay._kernels` (the fast path, the topological sort and the heaps) to keep
modules short. Same conventions: arrays in, arrays out, times in ns, ``-1`` for "none".
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._kernels import _hpop, _hpush, _ixremove, _ixsift, _ready
from ._links import _flow_share, _links_add, _links_freeze, _links_reset

__all__: list[str] = []


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
    ``dur`` (their end is known when they start), and start-to-start links (``*_s2s``:
    launch edges, measured lane overlaps) resolve when their source starts, so the usual
    negative lags are exact. A start that would still fall before the current event time
    (a negative lag after a job's end) is clamped to it and counted.

    Times are float64 internally relative to ``origin.min()``.

    Returns ``start``, ``end``, ``crit`` (int64[N], rounded) and the number of clamped
    starts (``-1`` if some op could never start: a cycle).
    """
    n = dur.shape[0]
    nc = coll_ptr.shape[0] - 1
    nj = n + nc
    base = origin.min() if n else np.int64(0)
    origin_rel = (origin - base).astype(np.float64)
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
    # running jobs: communication jobs ("flows") in a list, compute jobs in one doubly
    # linked list per device; a change re-evaluates only the rates it can affect
    flows = np.empty(nj, np.int64)
    fpos = np.full(nj, -1, np.int64)
    n_flows = 0
    dnext = np.full(nj, -1, np.int64)
    dprev = np.full(nj, -1, np.int64)
    cand = np.empty(nj + 1, np.int64)
    cmark = np.zeros(nj, np.bool_)
    ncand = 0
    ndev = 1
    nlink = 1
    for i in range(n):
        if device[i] + 1 > ndev:
            ndev = device[i] + 1
        if link[i] + 1 > nlink:
            nlink = link[i] + 1
    n_compute = np.zeros(ndev, np.int64)
    n_comm = np.zeros(ndev, np.int64)
    dhead = np.full(ndev, -1, np.int64)
    dev_was = np.zeros(ndev, np.int64)
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
    rel = np.empty(n + 1, np.int64)  # ops whose start constraints all resolved
    now = 0.0
    while ssize > 0 or jsize > 0:
        take_job = jsize > 0 and (ssize == 0 or job_t[jheap[0]] <= st_t[sheap[0]])
        nf = 0
        nrel = 0
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
                if sharing:  # without sharing every rate stays 1: no bookkeeping at all
                    is_flow = not (j < n and resource[j] == 1)
                    ncand = _job_leave(j, n, coll_ptr, coll_members, device, resource,
                                       n_compute, n_comm, dhead, dnext, dprev, flows, fpos,
                                       n_flows, cand, cmark, share_compute, share_links,
                                       interference)
                    if is_flow:
                        n_flows -= 1
                    seq = _rerate(now, cand, ncand, cmark, is_flow, flows, n_flows, n, coll_ptr,
                                  coll_members, device, resource, link, n_compute, n_comm,
                                  share_compute, share_links, interference, inv, link_cap,
                                  link_cnt, frozen, share, job_done, job_rate, job_last,
                                  job_thr, job_t, job_q, jheap, jpos, jsize, seq)
        else:
            i, ssize = _hpop(sheap, ssize, st_t, st_q)
            now = st_t[i]
            start[i] = now
            started += 1
            q = lane_next[i]
            if q >= 0 and lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    rel[nrel] = q
                    nrel += 1
            for k in range(succ_ptr[i], succ_ptr[i + 1]):  # edges counted from this start
                if succ_s2s[k]:
                    q = succ[k]
                    pending[q] -= 1
                    if pending[q] == 0:
                        rel[nrel] = q
                        nrel += 1
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
                job_t[j] = now + job_thr[j]
                job_q[j] = seq
                seq += 1
                jpos[j] = jsize
                jheap[jsize] = j
                jsize += 1
                _ixsift(jheap, jpos, jsize, job_t, job_q, jsize - 1)
                if sharing:
                    is_flow = not (j < n and resource[j] == 1)
                    ncand = _job_enter(j, n, coll_ptr, coll_members, device, resource,
                                       n_compute, n_comm, dhead, dnext, dprev, flows, fpos,
                                       n_flows, cand, cmark, dev_was, share_compute,
                                       share_links, interference)
                    if is_flow:
                        n_flows += 1
                    job_rate[j] = -1.0  # force (re)scheduling at the computed rate
                    seq = _rerate(now, cand, ncand, cmark, is_flow, flows, n_flows, n, coll_ptr,
                                  coll_members, device, resource, link, n_compute, n_comm,
                                  share_compute, share_links, interference, inv, link_cap,
                                  link_cnt, frozen, share, job_done, job_rate, job_last,
                                  job_thr, job_t, job_q, jheap, jpos, jsize, seq)
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
            q = lane_next[i]
            if q >= 0 and not lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    rel[nrel] = q
                    nrel += 1
            for k in range(succ_ptr[i], succ_ptr[i + 1]):
                if succ_s2s[k]:
                    continue
                q = succ[k]
                pending[q] -= 1
                if pending[q] == 0:
                    rel[nrel] = q
                    nrel += 1
            for k in range(wsucc_ptr[i], wsucc_ptr[i + 1]):
                q = wsucc[k]
                wpending[q] -= 1
                if wpending[q] == 0 and not np.isnan(own[q]):
                    fstack[nf] = q
                    nf += 1
        # ---- release the ops whose start constraints all resolved in this event (FIFO)
        for x in range(nrel):
            q = rel[x]
            ready, cp = _ready(q, start, end, origin_rel, lane_prev, lane_lag, lane_s2s,
                               pred_ptr, pred_src, pred_lag, pred_s2s)
            st = ready + delay[q]
            if st < now:
                st = now
                clamped += 1
            crit[q] = cp
            st_t[q] = st
            st_q[q] = seq
            seq += 1
            ssize = _hpush(sheap, ssize, st_t, st_q, q)
    if started < n:
        return (np.zeros(n, np.int64), np.zeros(n, np.int64), crit, -1)
    s_out = np.empty(n, np.int64)
    e_out = np.empty(n, np.int64)
    for i in range(n):
        s_out[i] = np.int64(np.rint(start[i])) + base
        e_out[i] = np.int64(np.rint(end[i])) + base
    return s_out, e_out, crit, clamped


@njit(cache=True)
def _add_cand(j, cand, ncand, cmark):
    if not cmark[j]:
        cmark[j] = True
        cand[ncand] = j
        ncand += 1
    return ncand


@njit(cache=True)
def _add_device_jobs(d, dhead, dnext, cand, ncand, cmark):
    j = dhead[d]
    while j >= 0:
        ncand = _add_cand(j, cand, ncand, cmark)
        j = dnext[j]
    return ncand


@njit(cache=True)
def _add_flows(flows, n_flows, cand, ncand, cmark):
    for a in range(n_flows):
        ncand = _add_cand(flows[a], cand, ncand, cmark)
    return ncand


@njit(cache=True)
def _member_device(j, n, k, coll_members, device):
    return device[j] if j < n else device[coll_members[k]]


@njit(cache=True)
def _job_enter(j, n, coll_ptr, coll_members, device, resource, n_compute, n_comm, dhead,
               dnext, dprev, flows, fpos, n_flows, cand, cmark, dev_was, share_compute,
               share_links, interference):
    """Register running job ``j``; collect the jobs whose rate may change in ``cand``."""
    ncand = _add_cand(j, cand, 0, cmark)
    if j < n and resource[j] == 1:
        d = device[j]
        dnext[j] = dhead[d]
        dprev[j] = -1
        if dhead[d] >= 0:
            dprev[dhead[d]] = j
        dhead[d] = j
        n_compute[d] += 1
        if share_compute:
            ncand = _add_device_jobs(d, dhead, dnext, cand, ncand, cmark)
        if interference > 0.0 and n_compute[d] == 1:
            ncand = _add_flows(flows, n_flows, cand, ncand, cmark)
    else:
        flows[n_flows] = j
        fpos[j] = n_flows
        n_flows += 1
        a0 = j if j < n else coll_ptr[j - n]
        a1 = j + 1 if j < n else coll_ptr[j - n + 1]
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                dev_was[d] = n_comm[d]
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                n_comm[d] += 1
        if share_links or interference > 0.0:
            ncand = _add_flows(flows, n_flows, cand, ncand, cmark)
        if interference > 0.0:
            for k in range(a0, a1):
                d = _member_device(j, n, k, coll_members, device)
                if d >= 0 and dev_was[d] == 0:
                    ncand = _add_device_jobs(d, dhead, dnext, cand, ncand, cmark)
    return ncand


@njit(cache=True)
def _job_leave(j, n, coll_ptr, coll_members, device, resource, n_compute, n_comm, dhead,
               dnext, dprev, flows, fpos, n_flows, cand, cmark, share_compute, share_links,
               interference):
    """Unregister finished job ``j``; collect the jobs whose rate may change in ``cand``."""
    ncand = 0
    if j < n and resource[j] == 1:
        d = device[j]
        if dprev[j] >= 0:
            dnext[dprev[j]] = dnext[j]
        else:
            dhead[d] = dnext[j]
        if dnext[j] >= 0:
            dprev[dnext[j]] = dprev[j]
        dnext[j] = -1
        dprev[j] = -1
        n_compute[d] -= 1
        if share_compute:
            ncand = _add_device_jobs(d, dhead, dnext, cand, ncand, cmark)
        if interference > 0.0 and n_compute[d] == 0:
            ncand = _add_flows(flows, n_flows, cand, ncand, cmark)
    else:
        p = fpos[j]
        flows[p] = flows[n_flows - 1]
        fpos[flows[p]] = p
        fpos[j] = -1
        n_flows -= 1
        a0 = j if j < n else coll_ptr[j - n]
        a1 = j + 1 if j < n else coll_ptr[j - n + 1]
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                n_comm[d] -= 1
        if share_links or interference > 0.0:
            ncand = _add_flows(flows, n_flows, cand, ncand, cmark)
        if interference > 0.0:
            for k in range(a0, a1):
                d = _member_device(j, n, k, coll_members, device)
                if d >= 0 and n_comm[d] == 0:
                    ncand = _add_device_jobs(d, dhead, dnext, cand, ncand, cmark)
    return ncand


@njit(cache=True)
def _rerate(now, cand, ncand, cmark, flows_changed, flows, n_flows, n, coll_ptr, coll_members,
            device, resource, link, n_compute, n_comm, share_compute, share_links,
            interference, inv, link_cap, link_cnt, frozen, share, job_done, job_rate,
            job_last, job_thr, job_t, job_q, jheap, jpos, jsize, seq):
    """Re-evaluate the rates of the candidate jobs, in job-id order (so that sequence
    numbers do not depend on bookkeeping order); reschedule those whose rate changed."""
    # max-min fair link shares by progressive filling over all running flows (id order);
    # they change only when a flow starts or ends
    if share_links and flows_changed and n_flows > 0:
        fl = np.sort(flows[:n_flows])
        for a in range(n_flows):
            j = fl[a]
            frozen[j] = False
            share[j] = 1.0
            _links_add(j, n, coll_ptr, coll_members, link, link_cnt, link_cap, 1)
        left = n_flows
        while left > 0:
            best = np.inf
            for a in range(n_flows):
                j = fl[a]
                if not frozen[j]:
                    v = _flow_share(j, n, coll_ptr, coll_members, link, link_cnt, link_cap)
                    if v < best:
                        best = v
            progressed = False
            for a in range(n_flows):
                j = fl[a]
                if not frozen[j]:
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
        for a in range(n_flows):
            _links_reset(fl[a], n, coll_ptr, coll_members, link, link_cnt, link_cap)
    # insertion sort in place: the candidate list is short, and this avoids an allocation
    for a in range(1, ncand):
        x = cand[a]
        b = a - 1
        while b >= 0 and cand[b] > x:
            cand[b + 1] = cand[b]
            b -= 1
        cand[b + 1] = x
    for a in range(ncand):
        j = cand[a]
        cmark[j] = False
        if jpos[j] < 0:
            continue
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
