"""numba kernels of the contention path: an event-driven fluid simulation.

Split from :mod:`replay._kernels` (the fast path and the topological sort); the job slots
and sharing helpers are in :mod:`replay._fluid_jobs`, the event queues in :mod:`replay._fluid_queues`.
Same conventions: arrays in, arrays out, times in ns, ``-1`` for "none".

Memory: per op the simulation keeps only its start and end (float64, converted to the
int64 results in op-id order at the end), the critical predecessor, a pending-constraint
counter and a state byte (~25 bytes per op); the graph's constraint lists (successors,
ready-time terms: ~12 bytes per op plus ~20 per edge) are built once per graph. Running
jobs live in *slots* (reused, so only a few are ever touched), not in per-op arrays: at any
time only a few ops run.

Speed: the event loop calls no helper that takes arrays (the job list, the start heap and
the common rate changes are written out): numba refcounts the arrays passed to an inlined
helper at every call, which cost ~30% of the run time. Its indices are unsigned (no
negative-index wrap-around code), and the starts due at the current time (nearly all) skip
the start heap. The running jobs are a list sorted by event time, the next last, while
few run and rates are not shared (on the benchmark trace ~20, at most 35: a new job's end
lands behind ~10 of them, and a scan of those beat a binary heap's sifts by ~1/6 of the
run time), else a binary heap (replay._fluid_queues).

Memory traffic: the replayed order follows the layout only roughly (with interference it
drifts by up to ~450 positions on the benchmark trace; without, not at all), which
defeats the hardware prefetcher: every first touch of a line of a per-op array missed,
~1/3 of the run time at 10^6 ops. The release loop prefetches the per-op arrays ``_PF``
positions ahead of the ops it releases (:func:`replay._fluid_jobs._prefetch`, one line per
array every 64 bytes). On the 10^6-op benchmark trace (bench/sweep.py, grid scenarios with
slowdown) the kernel takes ~70-95 ns per op, the spread run to run on a shared host
(binary heap: ~105-110; before prefetching ~150); by perf samples placing new jobs in the
list is ~1/10 of it, releasing ops (their ready times) ~1/5, the rate changes (a flow's
start or end, compute switching on or off next to flows) ~1/9.

Set-up: what depends on the graph alone (state bits, roots, wait links, sizes) comes in
precomputed (replay._succ._fluid_consts, once per graph); a scenario copies two arrays
(the pass it replaced cost ~5 ns per op). The result arrays come in uninitialized: every
entry is written.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retime.collectors.progress import watch_compiles

from ._fluid_jobs import (
    _F_DONE,
    _F_LAST,
    _F_RATE,
    _F_THR,
    _I_DEV,
    _I_DMASK,
    _I_DN,
    _I_DP,
    _I_FPOS,
    _I_JOB,
    _I_MARK,
    _I_POS,
    _L_FLOWS,
    _L_FREE,
    _NF,
    _NI,
    _fill_shares,
    _flow_change,
    _job_enter,
    _job_leave,
    _prefetch,
    _rerate_cands,
    _toggle_flows,
)
from ._fluid_queues import _LMAX, _jto_heap, _spush
from ._succ import _COLL, _HASW, _S2S, _WAITS

__all__: list[str] = []

# op state bits: started, own completion known, finalized; and (per graph, from
# replay._succ._fluid_consts) is a wait source, has wait sources, has start-to-start
# successors, collective member
_STARTED, _OWN, _FIN = 1, 2, 4
# prefetch distance (layout positions) ahead of the released ops
_PF = np.uint64(1024)

@njit(cache=True, nogil=True)
def _fluid_replay(coll_of, coll_ptr, coll_members, dur, delay, origin, lane_prev, lane_lag,
                  lane_s2s, pred_ptr, pred_src, pred_lag, pred_s2s, wait_ptr, wait_src,
                  wait_lag, device, resource, link, slowdown, inv_c, comm_inv, comm_cap,
                  share_compute, share_links, sptr, succ, cnt0, smid, pptr, pent, state0, roots, wkey, dims, start, end,
                  crit):
    """Event-driven fluid replay with resource sharing (the contention path).

    Same constraints as :func:`replay._kernels._fast_replay`. Ops with a resource
    (``resource`` 1 = compute on ``device``, 2 = communication over ``link``) run as *jobs*
    whose progress rate is set by the ops running at the same time: compute jobs share their
    device equally when ``share_compute``; communication jobs (a whole collective is one job
    over the links of its members) get max-min fair shares of unit-capacity links when
    ``share_links``; while a device runs both compute and communication, its compute
    progresses at ``inv_c`` (per position: a memory-bound kernel is slowed more than a
    compute-bound one) and a communication job touching a computing device at
    ``comm_inv`` of its first member (per position; both ``1 / (1 + slowdown)`` when the
    interference is symmetric; ``slowdown > 0`` switches the interference on): its link
    share times ``comm_inv``, or with ``comm_cap`` the smaller of the two (a rate cap: a
    transfer waiting on its CPU's scheduler, not on the link, so that concurrent transfers
    each keep it). A collective's job starts when its last member has started
    and member ``m`` completes once the job's progress reaches ``dur[m]``. Ops without a
    resource take exactly ``dur`` (their end is known when they start), and start-to-start
    links (``*_s2s``: launch edges, measured lane overlaps) resolve when their source starts,
    so the usual negative lags are exact. A start that would still fall before the current
    event time (a negative lag after a job's end) is clamped to it and counted.

    Events are ordered by (time, job events before starts, sequence number). A change only
    re-evaluates the rates it can affect: the jobs of a device whose compute/communication
    count changed, and the flows when a flow starts or ends (max-min shares) or when the
    compute on one of their devices switches on or off (slowdown).

    Times are float64 internally relative to ``base = origin.min()``. Arrays: layout
    positions, indices ``int32`` (``n + edges < 2**30``), times ``int64`` ns.

    ``sptr``, ``succ``, ``cnt0``, ``smid``, ``pptr``, ``pent``: the graph's successor lists
    (start-to-start links first), start-constraint counts and ready-time terms, repeated
    links left out (:func:`replay._succ._succ_lists`, built once per graph; the kernel
    reads them instead of ``lane_prev`` ... ``pred_s2s``); ``state0``, ``roots``, ``wkey``,
    ``dims``: the rest of the per-graph set-up (:func:`replay._succ._fluid_consts`).

    Starts ordered by (time, sequence number) wait in a heap, except those released at the
    current event time (nearly all: zero lags, clamped starts): they wait in a FIFO behind
    the heap's starts at that time (which all have smaller sequence numbers), so the order
    is the same without heap operations.

    Fills ``start``, ``end`` (float64[N], relative to ``base``) and ``crit`` (int32[N]; passed
    in uninitialized, every entry is written when every op starts, allocated by numpy,
    which asks for huge pages: fewer page faults);
    returns ``base`` and the number of clamped starts (``-1`` if some op could never start:
    a cycle). :func:`replay._kernels._to_op_order` turns them into int64 ns in op-id order.
    """
    n = dur.shape[0]
    nc = coll_ptr.shape[0] - 1
    # ---- per-graph constants (replay._succ: state bits, roots, wait links, sizes): the
    # start-constraint counts and states are copies
    cnt = cnt0.copy()  # unresolved start constraints; once started: unfinished waits
    state = state0.copy()
    rel = np.empty(n + 1, np.int32)  # ops whose start constraints all resolved in this event
    base = dims[0]
    ndev = dims[1]
    nlink = dims[2]
    n_jobs = dims[3]  # a bound: ops with a resource and a zero duration run no job
    nroots = roots.shape[0]
    nw = wkey.shape[0]
    # start, end (end holds the own completion until the op is finalized), crit: passed in
    # ---- collectives: members by threshold (max(dur, 0)), ties in member order
    ncm = max(nc, 1)
    arrived = np.zeros(ncm, np.int32)
    coll_last = np.full(ncm, -1, np.int64)
    coll_k = np.zeros(ncm, np.int32)  # members completed so far (in csorted order)
    csorted = coll_members.copy()
    for c in range(nc):  # stable insertion sort in place (a few members; no allocations)
        a0, a1 = coll_ptr[c], coll_ptr[c + 1]
        for k in range(a0 + 1, a1):
            m = csorted[k]
            key = max(dur[m], 0)
            b = k - 1
            while b >= a0 and max(dur[csorted[b]], 0) > key:
                csorted[b + 1] = csorted[b]
                b -= 1
            csorted[b + 1] = m
    # ---- devices and links
    n_compute = np.zeros(ndev, np.int32)
    n_comm = np.zeros(ndev, np.int32)
    dhead = np.full(ndev, -1, np.int64)  # compute slots of a device (linked list; only
    # with compute sharing: otherwise the rare flow changes scan the running jobs)
    dev_was = np.zeros(ndev, np.int32)
    dev_flag = np.zeros(ndev, np.uint8)
    link_cap = np.zeros(nlink, np.float64)
    link_cnt = np.zeros(nlink, np.int64)
    sharing = share_compute or share_links or slowdown > 0.0
    # devices computing (bit d, d < 64; kept without compute sharing), for the toggle test
    cmask = np.int64(0)
    # ---- job slots and event lists. Their capacity is the worst case (every job running,
    # every op released at once), but np.empty only reserves address space: pages are
    # committed when first touched, and slots are reused LIFO, so the resident part is the
    # few slots and entries actually used. (Growing them on demand would reassign arrays in
    # the event loop, and numba then refcounts them at every iteration: ~40% slower.)
    sf = np.empty((n_jobs + 1, _NF), np.float64)
    si = np.empty((n_jobs + 1, _NI), np.int64)
    # the running jobs by event key (time, sequence) (replay._fluid_queues): a list in
    # decreasing order, the next event last (times `jt`, slots `js`), or, when rates are
    # shared or more than _LMAX jobs run, a heap (`jq`: sequence numbers; si[slot, _I_POS]
    # a slot's position). si[slot, _I_POS] >= 0 while the slot runs a job. One spare entry
    # for the heap's +inf sentinel that makes its child choice branch-free.
    jt = np.empty(n_jobs + 2, np.float64)
    jq = np.empty(n_jobs + 2, np.int64)
    js = np.empty(n_jobs + 2, np.int64)
    hmode = share_compute or share_links
    fscr = np.empty(n_jobs + 1, np.int64)  # scratch of _fill_shares
    nfree = 0  # free stack of released slots (si[:, _L_FREE]) ...
    nused = 0  # ... and slots never used so far
    jsize = 0
    n_flows = 0
    ht = np.empty(n + 1, np.float64)  # start heap: time, sequence, op
    hq = np.empty(n + 1, np.int64)
    hi = np.empty(n + 1, np.int32)
    ssize = 0
    fifo = np.empty(n + 1, np.int32)  # starts at the current time, after the heap's
    fhead = 0
    ftail = 0
    fstack = np.empty(n + 1, np.int32)  # ops whose end is known: finalize, resolve successors
    seq = np.int64(0)
    clamped = 0
    started = 0
    for x in range(nroots):  # roots, in op order
        i = roots[x]
        crit[i] = -1  # (the other ops' are set when they are released)
        ssize = _spush(ht, hq, hi, ssize, float(origin[i] - base + delay[i]), seq, i)
        seq += 1
    now = 0.0
    # hot-loop indices are unsigned (np.uint64): numba then skips the negative-index
    # wrap-around, which otherwise costs instructions and registers at every access
    U0 = np.uint64(0)
    U1 = np.uint64(1)
    fhead = U0
    ftail = U0
    nf = U0
    nrel = U0
    ujsize = U0  # == jsize
    un = np.uint64(n)
    U64 = np.uint64(64)
    pf = U0  # per-op arrays are prefetched up to here (see the release loop)
    while ssize > 0 or ujsize > U0 or fhead < ftail:
        # next start: the heap's top if it is due now (smaller sequence numbers than the
        # FIFO's), else the FIFO's head (at the current time), else the heap's top
        from_heap = ssize > 0 and (fhead == ftail or ht[0] <= now)
        if ujsize > U0:
            tnext = jt[0] if hmode else jt[ujsize - U1]  # the next job event
        if from_heap:
            take_job = ujsize > U0 and tnext <= ht[0]
        elif fhead < ftail:
            take_job = ujsize > U0 and tnext <= now
        else:
            take_job = True
        nf = U0
        nrel = U0
        ins = False  # (re)insert slot `us` with key (`ut`, `uq`) into the job queue
        us = np.int64(0)
        ut = 0.0
        uq = np.int64(0)
        has_left = False  # a job ended (slot `left`) / started (slot `entered`)
        has_entered = False
        left = U0
        entered = U0
        dv = np.int64(-1)  # device of a compute job that started (with sharing)
        i = U0
        if take_job:
            if hmode:  # the root (removed or re-keyed below)
                sl = np.uint64(js[0])
            else:  # the last entry leaves the list (put back if the job goes on)
                ujsize -= U1
                sl = np.uint64(js[ujsize])
            j = si[sl, _I_JOB]
            now = tnext
            if j < n:
                uj = np.uint64(j)
                end[uj] = now
                state[uj] |= _OWN
                members_done = True
                if cnt[uj] == 0:
                    fstack[nf] = j
                    nf += U1
            else:
                sf[sl, _F_DONE] = sf[sl, _F_THR]  # exact: the event fires at the threshold
                sf[sl, _F_LAST] = now
                c = j - n
                a0, a1 = coll_ptr[c], coll_ptr[c + 1]
                while coll_k[c] < a1 - a0:
                    m = csorted[a0 + coll_k[c]]
                    thr = max(dur[m], 0) * 1.0
                    if thr > sf[sl, _F_DONE]:
                        break
                    end[m] = now
                    state[m] |= _OWN
                    coll_k[c] += 1
                    if cnt[m] == 0:
                        fstack[nf] = m
                        nf += U1
                members_done = coll_k[c] == a1 - a0
                if not members_done:
                    m = csorted[a0 + coll_k[c]]
                    sf[sl, _F_THR] = max(dur[m], 0) * 1.0
                    ut = now + (sf[sl, _F_THR] - sf[sl, _F_DONE]) / sf[sl, _F_RATE]
                    uq = seq
                    seq += 1
                    ins = True
                    us = np.int64(sl)
            if members_done:  # the slot stops
                si[sl, _I_POS] = -1
                left = sl
                has_left = True
        elif not from_heap:
            i = np.uint64(fifo[fhead])
            fhead += U1
            if fhead == ftail:
                fhead = U0
                ftail = U0
        else:
            i = np.uint64(hi[0])
            now = ht[0]
            # pop the start heap (written out: numba refcounts arrays passed to helpers)
            ssize -= 1
            tx = ht[ssize]
            qx = hq[ssize]
            x = hi[ssize]
            h = 0
            while True:
                c = 2 * h + 1
                if c >= ssize:
                    break
                if c + 1 < ssize and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c]
                                                              and hq[c + 1] < hq[c])):
                    c += 1
                if ht[c] < tx or (ht[c] == tx and hq[c] < qx):
                    ht[h] = ht[c]
                    hq[h] = hq[c]
                    hi[h] = hi[c]
                    h = c
                else:
                    break
            ht[h] = tx
            hq[h] = qx
            hi[h] = x
        if not take_job:
            start[i] = now
            sti = state[i] | _STARTED
            state[i] = sti
            started += 1
            if sti & _S2S:
                for k in range(np.uint64(sptr[i]), np.uint64(smid[i])):  # from this start
                    q = np.uint64(succ[k])
                    cq = cnt[q] - 1
                    cnt[q] = cq
                    if cq == 0:
                        rel[nrel] = q
                        nrel += U1
            # from now on cnt[i] counts the wait sources not finalized yet
            w = 0
            if sti & _WAITS:
                for k in range(wait_ptr[i], wait_ptr[i + U1]):
                    if not (state[wait_src[k]] & _FIN):
                        w += 1
            cnt[i] = w
            newjob = False
            if sti & _COLL:
                c = coll_of[i]
                arrived[c] += 1
                if arrived[c] == coll_ptr[c + 1] - coll_ptr[c]:
                    # the last member sets A; `last` = first member (op order) at max start
                    a = -np.inf
                    for k in range(coll_ptr[c], coll_ptr[c + 1]):
                        m = coll_members[k]
                        if start[m] > a:
                            a = start[m]
                            coll_last[c] = m
                    a0, a1 = coll_ptr[c], coll_ptr[c + 1]
                    while coll_k[c] < a1 - a0:  # members with no transfer tail end at once
                        m = csorted[a0 + coll_k[c]]
                        if dur[m] > 0:
                            break
                        end[m] = a + dur[m]
                        state[m] |= _OWN
                        coll_k[c] += 1
                        if cnt[m] == 0:
                            fstack[nf] = m
                            nf += U1
                    if coll_k[c] < a1 - a0:
                        newjob = True
                        j = n + c
                        thr0 = max(dur[csorted[a0 + coll_k[c]]], 0) * 1.0
                        dv = -1
            elif resource[i] > 0 and dur[i] > 0:  # a job
                newjob = True
                j = np.int64(i)
                thr0 = dur[i] * 1.0
                dv = -1
                if sharing and resource[i] == 1:
                    dv = np.int64(device[i])
            else:
                end[i] = now + dur[i]
                state[i] = sti | _OWN
                if w == 0:
                    fstack[nf] = i
                    nf += U1
            if newjob:
                if nfree > 0:
                    nfree -= 1
                    sl = np.uint64(si[nfree, _L_FREE])
                else:
                    sl = np.uint64(nused)
                    nused += 1
                    si[sl, _I_DN] = -1
                    si[sl, _I_DP] = -1
                    si[sl, _I_FPOS] = -1
                    si[sl, _I_MARK] = 0
                si[sl, _I_JOB] = j
                si[sl, _I_DEV] = dv
                sf[sl, _F_THR] = thr0
                sf[sl, _F_DONE] = 0.0
                sf[sl, _F_LAST] = now
                sf[sl, _F_RATE] = 1.0
                ut = now + thr0
                uq = seq
                seq += 1
                si[sl, _I_POS] = 0
                ins = True
                us = np.int64(sl)
                entered = sl
                has_entered = True
        fast_enter = False
        toggled = -1  # device whose compute switched on next to running flows
        if sharing and has_entered:
            if dv >= 0 and not share_compute:  # a compute job (dv: its device)
                # without compute sharing, written out: the new job's own rate, and (when
                # its device's compute switches on next to flows) the flows' (below)
                fast_enter = True
                d = np.uint64(dv)
                sl = entered
                if n_compute[d] == 0:
                    if slowdown > 0.0 and n_comm[d] > 0:
                        # a flow on d slows down only if no other member device computes
                        # (the switch-off test below, before d's bit is set); else only
                        # the new job's rate is set, here
                        flip = ndev > 64
                        if not flip:
                            bit = np.int64(1) << np.int64(d)
                            for a in range(n_flows):
                                mf = si[si[a, _L_FLOWS], _I_DMASK]
                                if (mf & bit) != 0 and (mf & cmask) == 0:
                                    flip = True
                                    break
                        if flip:
                            toggled = np.int64(d)
                    if d < U64:
                        cmask |= np.int64(1) << np.int64(d)
                n_compute[d] += 1
                if toggled < 0:
                    r = inv_c[j] if slowdown > 0.0 and n_comm[d] > 0 else 1.0
                    # as _rerate_cands would: the rate changes from "unset" to r; the job
                    # list entry is placed below
                    sf[sl, _F_RATE] = r
                    ut = now + sf[sl, _F_THR] / r
        if hmode:  # restore the heap (written out, see above)
            sift_root = False  # the root re-keyed or removed (down) ...
            sift_new = False  # ... or a new entry at the end (up)
            if take_job:
                if ins:
                    jt[0] = ut
                    jq[0] = uq
                    sift_root = True
                else:  # the root's job ended: the last entry goes to the root
                    ujsize -= U1
                    if ujsize > U0:
                        jt[0] = jt[ujsize]
                        jq[0] = jq[ujsize]
                        js[0] = js[ujsize]
                        sift_root = True
            elif ins:
                jt[ujsize] = ut
                jq[ujsize] = uq
                js[ujsize] = us
                ujsize += U1
                sift_new = True
            if sift_root or sift_new:
                if sift_root:  # the root's key grew: its hole goes down to a leaf (the
                    # smaller child moves up, chosen without branches: a +inf sentinel)
                    h = U0
                    tx = jt[0]
                    qx = jq[0]
                    x = js[0]
                    jt[ujsize] = np.inf
                    c = U1
                    while c < ujsize:
                        t0 = jt[c]
                        t1 = jt[c + U1]
                        if (t1 < t0) | ((t1 == t0) & (jq[c + U1] < jq[c])):
                            c += U1
                        jt[h] = jt[c]
                        jq[h] = jq[c]
                        y = js[c]
                        js[h] = y
                        si[y, _I_POS] = h
                        h = c
                        c = h + h + U1
                else:  # a new entry at the end
                    h = ujsize - U1
                    tx = jt[h]
                    qx = jq[h]
                    x = js[h]
                while h > U0:  # then up
                    p = (h - U1) >> U1
                    ty = jt[p]
                    if (tx < ty) | ((tx == ty) & (qx < jq[p])):
                        jt[h] = ty
                        jq[h] = jq[p]
                        y = js[p]
                        js[h] = y
                        si[y, _I_POS] = h
                        h = p
                    else:
                        break
                jt[h] = tx
                jq[h] = qx
                js[h] = x
                si[x, _I_POS] = h
        elif ins:  # place the key by a scan from the end (the next events): _queues._jins,
            # written out (numba refcounts the arrays passed to an inlined helper per call);
            # its sequence number is the newest, so it goes before every equal time
            jj = ujsize
            while jj > U0 and jt[jj - U1] <= ut:
                jt[jj] = jt[jj - U1]
                js[jj] = js[jj - U1]
                jj -= U1
            jt[jj] = ut
            js[jj] = us
            ujsize += U1
            if ujsize > _LMAX:  # too many running jobs for a list: a heap from now on
                _jto_heap(jt, jq, js, si, np.int64(ujsize), seq)
                hmode = True
        jsize = np.int64(ujsize)
        fast = False
        if sharing and has_left:
            dv = si[left, _I_DEV]
            if dv >= 0:  # a compute job on device dv
                d = np.uint64(dv)
                # without compute sharing, written out: only flows on this device can
                # change rate, when its compute switches off (interference)
                fast = not share_compute
                if fast:
                    nc_d = n_compute[d] - 1
                    n_compute[d] = nc_d
                    if nc_d == 0 and d < U64:
                        cmask &= ~(np.int64(1) << np.int64(d))
                    if slowdown > 0.0 and nc_d == 0 and n_comm[d] > 0:
                        # a flow on d speeds up only if no other member device computes
                        # (_toggle_flows' test; exact by the member masks with <= 64
                        # devices): most often another one does (symmetric TP ranks), and
                        # the call (each array passed as ~7 values) is skipped
                        flip = ndev > 64
                        if not flip:
                            bit = np.int64(1) << np.int64(d)
                            for a in range(n_flows):
                                mf = si[si[a, _L_FLOWS], _I_DMASK]
                                if (mf & bit) != 0 and (mf & cmask) == 0:
                                    flip = True
                                    break
                        if flip:
                            seq = _toggle_flows(np.int64(d), -1, now, n, coll_ptr,
                                                coll_members, device, n_compute, share_links,
                                                inv_c, comm_inv, comm_cap, sf, si, jt, jq, js, n_flows, jsize,
                                                hmode, seq)
        flow_list = sharing and not share_compute and not share_links and not hmode
        if flow_list and has_left and not fast:  # a flow ends (interference only, a list)
            seq = _flow_change(np.int64(left), si[left, _I_JOB], False, now, n, coll_ptr,
                               coll_members, device, n_comm, n_compute, inv_c, comm_inv, comm_cap, sf, si, jt, js,
                               jsize, n_flows, dev_flag, seq)
            n_flows -= 1
        elif sharing and has_left and not fast:  # no sharing: every rate stays 1
            lf = np.int64(left)
            j = si[left, _I_JOB]
            is_flow = not (j < n and resource[j] == 1)
            ncand = _job_leave(lf, j, n, coll_ptr, coll_members, device, resource, n_compute,
                               n_comm, dhead, si, n_flows, dev_flag, js, jsize,
                               share_compute, share_links, slowdown)
            if is_flow:
                n_flows -= 1
            if share_links and is_flow and n_flows > 0:
                _fill_shares(n_flows, n, coll_ptr, coll_members, link, link_cnt, link_cap,
                             sf, si, fscr)
            seq = _rerate_cands(now, ncand, n, coll_ptr, coll_members, device, resource,
                                n_compute, n_comm, share_compute, share_links, slowdown,
                                inv_c, comm_inv, comm_cap, sf, si, jt, jq, js, jsize, hmode, seq)
        if has_left:
            si[nfree, _L_FREE] = left
            nfree += 1
        if toggled >= 0:
            seq = _toggle_flows(toggled, np.int64(entered), now, n, coll_ptr, coll_members,
                                device, n_compute, share_links, inv_c, comm_inv, comm_cap, sf, si, jt, jq, js,
                                n_flows, jsize, hmode, seq)
        if flow_list and has_entered and not fast_enter:  # a flow starts (as above)
            seq = _flow_change(np.int64(entered), si[entered, _I_JOB], True, now, n,
                               coll_ptr, coll_members, device, n_comm, n_compute, inv_c, comm_inv, comm_cap, sf,
                               si, jt, js, jsize, n_flows, dev_flag, seq)
            n_flows += 1
        elif sharing and has_entered and not fast_enter:
            en = np.int64(entered)
            j = si[entered, _I_JOB]
            is_flow = not (j < n and resource[j] == 1)
            ncand = _job_enter(en, j, n, coll_ptr, coll_members, device, resource,
                               n_compute, n_comm, dhead, si, n_flows, dev_was, dev_flag, js,
                               jsize, share_compute, share_links, slowdown)
            if is_flow:
                n_flows += 1
            sf[entered, _F_RATE] = -1.0  # force (re)scheduling at the computed rate
            if share_links and is_flow and n_flows > 0:
                _fill_shares(n_flows, n, coll_ptr, coll_members, link, link_cnt, link_cap,
                             sf, si, fscr)
            seq = _rerate_cands(now, ncand, n, coll_ptr, coll_members, device, resource,
                                n_compute, n_comm, share_compute, share_links, slowdown,
                                inv_c, comm_inv, comm_cap, sf, si, jt, jq, js, jsize, hmode, seq)
        # ---- finalize ops whose end is known; resolve their successors
        while nf > U0:
            nf -= U1
            i = np.uint64(fstack[nf])
            sti = state[i]
            # end: own completion (collective members: max(start, A + tail)), then waits
            ev = end[i]
            if sti & _COLL:
                cc = coll_of[i]
                if ev > start[i]:
                    if np.int64(i) != coll_last[cc]:
                        crit[i] = coll_last[cc]
                else:
                    ev = start[i]
            if sti & _WAITS:
                for k in range(wait_ptr[i], wait_ptr[i + U1]):
                    v = end[wait_src[k]] + wait_lag[k]
                    if v > ev:
                        ev = v
                        crit[i] = wait_src[k]
            end[i] = ev
            state[i] = sti | _FIN
            for k in range(np.uint64(smid[i]), np.uint64(sptr[i + U1])):
                q = np.uint64(succ[k])
                cq = cnt[q] - 1
                cnt[q] = cq
                if cq == 0:
                    rel[nrel] = q
                    nrel += U1
            if sti & _HASW:
                ii = np.int64(i)
                lo = np.searchsorted(wkey, ii * n)
                for k in range(lo, nw):
                    if wkey[k] // n != ii:
                        break
                    q = wkey[k] - ii * n
                    if state[q] & _STARTED:
                        cnt[q] -= 1
                        if cnt[q] == 0 and state[q] & _OWN:
                            fstack[nf] = q
                            nf += U1
        # ---- release the ops whose start constraints all resolved in this event (FIFO)
        for x in range(nrel):
            q = np.uint64(rel[x])
            # prefetch the per-op arrays _PF positions ahead of the released ops (the
            # replayed order drifts from the layout by up to hundreds of positions, which
            # defeats the hardware prefetcher): one line per array every 64 bytes
            top = q + _PF
            if top > un:
                top = un
            while pf < top:
                _prefetch(start, pf)
                _prefetch(end, pf)
                _prefetch(dur, pf)
                _prefetch(delay, pf)
                if not (pf & np.uint64(15)):
                    _prefetch(cnt, pf)
                    _prefetch(crit, pf)
                    _prefetch(smid, pf)
                    _prefetch(device, pf)
                    _prefetch(coll_of, pf)
                    far = pf + _PF  # the lists' offsets further ahead (N + 1 entries)
                    if far > un:
                        far = un
                    _prefetch(sptr, far)
                    _prefetch(pptr, far)
                    if not (pf & np.uint64(63)):
                        _prefetch(state, pf)
                        _prefetch(resource, pf)
                _prefetch(succ, np.uint64(sptr[pf]))
                k = np.uint64(2 * pptr[pf])
                k1 = np.uint64(2 * pptr[min(pf + np.uint64(8), un)])
                while k < k1:
                    _prefetch(pent, k)
                    k += np.uint64(8)
                pf += np.uint64(8)
            # ready time (replay._kernels._ready on relative float times; written out)
            # (the lane term first: any finite term beats -inf, as the lane term is taken
            # unconditionally there; later terms must exceed the running maximum)
            ready = -np.inf
            cp = -1
            for k in range(np.uint64(pptr[q]), np.uint64(pptr[q + U1])):
                code = pent[k + k]
                usp = np.uint64(code >> 1)
                v = (start[usp] if code & 1 else end[usp]) + pent[k + k + U1]
                if v > ready:
                    ready = v
                    cp = np.int64(usp)
            if cp < 0:
                ready = float(origin[q] - base)
            st = ready + delay[q]
            if st < now:
                st = now
                clamped += 1
            crit[q] = cp
            if st == now:  # due now: behind the heap's starts at this time
                fifo[ftail] = q
                ftail += U1
                seq += 1
                continue
            h = ssize  # push onto the start heap
            while h > 0:
                p = (h - 1) >> 1
                if st < ht[p] or (st == ht[p] and seq < hq[p]):
                    ht[h] = ht[p]
                    hq[h] = hq[p]
                    hi[h] = hi[p]
                    h = p
                else:
                    break
            ht[h] = st
            hq[h] = seq
            hi[h] = q
            ssize += 1
            seq += 1
    return base, (clamped if started == n else -1)

watch_compiles()  # say so on stderr when these kernels compile on first use
