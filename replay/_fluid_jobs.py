"""numba helpers of the contention path: job slots and resource sharing.

Split from :mod:`replay._fluid` (the event loop) to keep modules short. Running jobs live in
*slots*: a float row (``sf``) and an int row (``si``) each; the int array's extra columns
hold per-index lists (running flows, rate-update candidates, free slots) that share the
pool's capacity. The running jobs are ordered by event key in a sorted list or a heap
(:mod:`replay._fluid_queues`).
Link sharing (max-min fair bandwidth): a job's flows load the links of its member devices;
``link_cnt`` counts active flows per link and ``link_cap`` is each link's capacity share.

Editing this module (or :mod:`replay._fluid_queues`): numba's on-disk cache of
:func:`replay._fluid._fluid_replay` holds the compiled code of the helpers it calls from
here, but its cache is keyed by ``_fluid.py`` alone. After a change here, touch ``replay/_fluid.py`` (or delete ``replay/__pycache__/
_fluid*.nb*``), or the kernel keeps running the old helpers. (A fresh install writes both.)
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from retime.collectors.progress import watch_compiles

from ._fluid_queues import _I_POS, _jins, _jkey

__all__: list[str] = []

# float columns of a job slot
_F_DONE, _F_RATE, _F_LAST, _F_THR, _F_SHARE = 0, 1, 2, 3, 4
_NF = 5
# Helpers that allocate nothing are compiled without reference counting (``_nrt=False``):
# numba otherwise increfs/decrefs every array argument at each call, which made the ~10^5
# rate updates of a 10^6-op replay with interference cost a third of its run time. The
# small ones they call are inlined (``inline="always"``; only ever called from helpers
# without reference counting): a call passes each array as ~7 values, which cost more
# than their bodies.
# int columns of a job slot (and the per-index lists that share the pool's capacity)
# (_I_POS: >= 0 while the slot runs a job, -1 otherwise;
# _I_DMASK: a flow's member devices as bits ``d % 64``, a prefilter for _toggle_flows;
# _I_DEV: a compute job's device, -1 for other jobs, set when rates are shared: the event
# loop and the scans of the running jobs read it instead of the job's op's device/resource)
_I_JOB, _I_DMASK, _I_DN, _I_DP, _I_FPOS, _I_MARK, _I_FROZEN = 0, 1, 3, 4, 5, 6, 7  # _I_POS = 2
_L_FLOWS, _L_CAND, _L_FREE, _I_DEV = 8, 9, 10, 11
_NI = 12


# ---------------------------------------------------------------------------- prefetch
@intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the CPU to load the cache line of ``arr[idx]`` (``llvm.prefetch``: no fault, no
    result, retires at once; ``idx`` is not bounds-checked). The event loop's per-op arrays
    are walked in layout order only roughly (the replayed order drifts from the measured
    one by hundreds of positions), which defeats the hardware prefetcher: without this
    every first touch of a cache line missed (~1 miss per op on 10^6 ops)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                       wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


# ---------------------------------------------------------------------------- sharing
@njit(cache=True, inline="always")
def _add_cand(s, si, ncand):
    if si[s, _I_MARK] == 0:
        si[s, _I_MARK] = 1
        si[ncand, _L_CAND] = s
        ncand += 1
    return ncand


@njit(cache=True, inline="always")
def _flows_add(si, sl, n_flows):
    """Slot ``sl`` joins the running flows ``si[:n_flows, _L_FLOWS]`` (the caller counts)."""
    si[n_flows, _L_FLOWS] = sl
    si[sl, _I_FPOS] = n_flows


@njit(cache=True, inline="always")
def _flows_remove(si, sl, n_flows):
    """Slot ``sl`` leaves the running flows: the last one takes its place."""
    p = si[sl, _I_FPOS]
    last = si[n_flows - 1, _L_FLOWS]
    si[p, _L_FLOWS] = last
    si[last, _I_FPOS] = p
    si[sl, _I_FPOS] = -1


@njit(cache=True, inline="always")
def _rerate(sf, s, now, old, r):
    """Slot ``s`` changes its rate from ``old`` (unset if not positive) to ``r`` at ``now``:
    its progress so far counted at the old rate, returns its new event time."""
    if old > 0.0:
        sf[s, _F_DONE] += (now - sf[s, _F_LAST]) * old
    sf[s, _F_LAST] = now
    sf[s, _F_RATE] = r
    rem = sf[s, _F_THR] - sf[s, _F_DONE]
    if rem < 0.0:
        rem = 0.0
    return now + rem / r


@njit(cache=True, inline="always")
def _cands_by_job(si, ncand):
    """Sort the candidate slots ``si[:ncand, _L_CAND]`` by job id in place (an insertion
    sort: the list is short). Rates change in job-id order, so that the sequence numbers
    do not depend on the order the bookkeeping found the slots in."""
    for a in range(1, ncand):
        x = si[a, _L_CAND]
        xj = si[x, _I_JOB]
        b = a - 1
        while b >= 0 and si[si[b, _L_CAND], _I_JOB] > xj:
            si[b + 1, _L_CAND] = si[b, _L_CAND]
            b -= 1
        si[b + 1, _L_CAND] = x


@njit(cache=True, inline="always")
def _add_device_jobs(d, dhead, si, ncand):
    s = dhead[d]
    while s >= 0:
        ncand = _add_cand(s, si, ncand)
        s = si[s, _I_DN]
    return ncand


@njit(cache=True, inline="always")
def _add_flagged_compute(n, device, resource, dev_flag, si, js, jsize, ncand):
    """Without compute sharing the compute jobs are in no per-device list: add the running
    compute jobs of the devices flagged in ``dev_flag`` (a scan of the few running jobs, by
    their slots' ``_I_DEV``, set whenever rates are shared)."""
    for a in range(jsize):
        s = js[a]
        d = si[s, _I_DEV]
        if d >= 0 and dev_flag[d]:
            ncand = _add_cand(s, si, ncand)
    return ncand


@njit(cache=True, inline="always")
def _add_flows(si, n_flows, ncand):
    for a in range(n_flows):
        ncand = _add_cand(si[a, _L_FLOWS], si, ncand)
    return ncand


@njit(cache=True, inline="always")
def _member_device(j, n, k, coll_members, device):
    return device[j] if j < n else device[coll_members[k]]


@njit(cache=True, _nrt=False)
def _job_enter(sl, j, n, coll_ptr, coll_members, device, resource, n_compute, n_comm, dhead,
               si, n_flows, dev_was, dev_flag, js, jsize, share_compute, share_links,
               slowdown):
    """Register running job ``j`` (slot ``sl``); collect the slots whose rate may change.
    Without compute sharing the event loop keeps compute jobs out of the per-device lists:
    they are found by a scan of the running jobs (``js[:jsize]``)."""
    ncand = _add_cand(sl, si, 0)
    if j < n and resource[j] == 1:
        d = device[j]
        si[sl, _I_DN] = dhead[d]
        si[sl, _I_DP] = -1
        if dhead[d] >= 0:
            si[dhead[d], _I_DP] = sl
        dhead[d] = sl
        n_compute[d] += 1
        if share_compute:
            ncand = _add_device_jobs(d, dhead, si, ncand)
        # flows see interference switch on only if one of them runs on this device
        if slowdown > 0.0 and n_compute[d] == 1 and n_comm[d] > 0:
            ncand = _add_flows(si, n_flows, ncand)
    else:
        _flows_add(si, sl, n_flows)
        n_flows += 1
        a0 = j if j < n else coll_ptr[j - n]
        a1 = j + 1 if j < n else coll_ptr[j - n + 1]
        mask = np.uint64(0)
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                dev_was[d] = n_comm[d]
                mask |= np.uint64(1) << np.uint64(d & 63)
        si[sl, _I_DMASK] = np.int64(mask)
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                n_comm[d] += 1
        if share_links:
            ncand = _add_flows(si, n_flows, ncand)
        if slowdown > 0.0:
            flagged = False
            for k in range(a0, a1):
                d = _member_device(j, n, k, coll_members, device)
                if d >= 0 and dev_was[d] == 0:
                    if share_compute:
                        ncand = _add_device_jobs(d, dhead, si, ncand)
                    else:
                        dev_flag[d] = 1
                        flagged = True
            if flagged:
                ncand = _add_flagged_compute(n, device, resource, dev_flag, si, js, jsize,
                                             ncand)
                for k in range(a0, a1):
                    d = _member_device(j, n, k, coll_members, device)
                    if d >= 0:
                        dev_flag[d] = 0
    return ncand


@njit(cache=True, _nrt=False)
def _job_leave(sl, j, n, coll_ptr, coll_members, device, resource, n_compute, n_comm, dhead,
               si, n_flows, dev_flag, js, jsize, share_compute, share_links,
               slowdown):
    """Unregister finished job ``j`` (slot ``sl``); collect the slots whose rate may change
    (compute jobs without compute sharing: see :func:`_job_enter`)."""
    ncand = 0
    if j < n and resource[j] == 1:
        d = device[j]
        dp = si[sl, _I_DP]
        dn = si[sl, _I_DN]
        if dp >= 0:
            si[dp, _I_DN] = dn
        else:
            dhead[d] = dn
        if dn >= 0:
            si[dn, _I_DP] = dp
        si[sl, _I_DN] = -1
        si[sl, _I_DP] = -1
        n_compute[d] -= 1
        if share_compute:
            ncand = _add_device_jobs(d, dhead, si, ncand)
        if slowdown > 0.0 and n_compute[d] == 0 and n_comm[d] > 0:
            ncand = _add_flows(si, n_flows, ncand)
    else:
        _flows_remove(si, sl, n_flows)
        n_flows -= 1
        a0 = j if j < n else coll_ptr[j - n]
        a1 = j + 1 if j < n else coll_ptr[j - n + 1]
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                n_comm[d] -= 1
        if share_links:
            ncand = _add_flows(si, n_flows, ncand)
        if slowdown > 0.0:
            flagged = False
            for k in range(a0, a1):
                d = _member_device(j, n, k, coll_members, device)
                if d >= 0 and n_comm[d] == 0:
                    if share_compute:
                        ncand = _add_device_jobs(d, dhead, si, ncand)
                    else:
                        dev_flag[d] = 1
                        flagged = True
            if flagged:
                ncand = _add_flagged_compute(n, device, resource, dev_flag, si, js, jsize,
                                             ncand)
                for k in range(a0, a1):
                    d = _member_device(j, n, k, coll_members, device)
                    if d >= 0:
                        dev_flag[d] = 0
    return ncand


@njit(cache=True, _nrt=False)
def _flow_change(sl, j, entering, now, n, coll_ptr, coll_members, device, n_comm, n_compute,
                 inv_c, comm_inv, comm_cap, sf, si, jt, js, jsize, n_flows, dev_flag, seq):
    """Flow ``j`` (slot ``sl``) starts (``entering``: already in the job list, at rate 1) or
    ends (already out of it), with interference but neither rate sharing, the job queue a
    sorted list: what :func:`_job_enter` / :func:`_job_leave` and :func:`_rerate_cands` do
    for it, in one pass over the list. A flow's start or end changes the rates of the
    compute jobs on the member devices whose communication switches on or off (up to a
    collective's size) and the new flow's own: they leave the list in that pass and go back
    in job-id order with their new event times (_queues._jins), the order the re-keys of
    :func:`_rerate_cands` leave, without a search and a gap closed per re-key."""
    a0 = j if j < n else coll_ptr[j - n]
    a1 = j + 1 if j < n else coll_ptr[j - n + 1]
    flagged = False
    if entering:
        _flows_add(si, sl, n_flows)
        mask = np.uint64(0)
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                mask |= np.uint64(1) << np.uint64(d & 63)
                if n_comm[d] == 0:
                    dev_flag[d] = 1
                    flagged = True
                n_comm[d] += 1
        si[sl, _I_DMASK] = np.int64(mask)
    else:
        _flows_remove(si, sl, n_flows)
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                n_comm[d] -= 1
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0 and n_comm[d] == 0:
                dev_flag[d] = 1
                flagged = True
    # the list without the slots whose rate changes (kept in order); those in si[:, _L_CAND]
    m = 0
    ncand = 0
    for a in range(jsize):
        s = js[a]
        cand = entering and s == sl
        if flagged and not cand:
            d = si[s, _I_DEV]
            if d >= 0 and dev_flag[d] != 0:
                r = inv_c[si[s, _I_JOB]] if n_comm[d] > 0 else 1.0
                cand = r != sf[s, _F_RATE]
        if cand:
            si[ncand, _L_CAND] = s
            ncand += 1
        else:
            jt[m] = jt[a]
            js[m] = s
            m += 1
    if flagged:
        for k in range(a0, a1):
            d = _member_device(j, n, k, coll_members, device)
            if d >= 0:
                dev_flag[d] = 0
    _cands_by_job(si, ncand)
    for a in range(ncand):
        s = si[a, _L_CAND]
        if entering and s == sl:
            r = _comm_inv(j, n, coll_ptr, coll_members, comm_inv) if _touches_compute(
                j, n, coll_ptr, coll_members, device, n_compute) else 1.0
            old = -1.0  # forced: its rate is being set
        else:
            r = inv_c[si[s, _I_JOB]] if n_comm[si[s, _I_DEV]] > 0 else 1.0
            old = sf[s, _F_RATE]
        m = _jins(jt, js, m, _rerate(sf, s, now, old, r), s)
        seq += 1
    return seq


@njit(cache=True, _nrt=False)
def _fill_shares(n_flows, n, coll_ptr, coll_members, link, link_cnt, link_cap, sf, si, fl):
    """Max-min fair link shares (``sf[:, _F_SHARE]``) by progressive filling over all running
    flows (job-id order); they change only when a flow starts or ends. ``fl``: scratch for
    the flows' slots (capacity: the slot pool)."""
    for a in range(n_flows):
        fl[a] = si[a, _L_FLOWS]
    h = 1  # by job id (unique): Shell sort in place, no allocation
    while h < n_flows // 3:
        h = 3 * h + 1
    while h >= 1:
        for a in range(h, n_flows):
            x = fl[a]
            xj = si[x, _I_JOB]
            b = a
            while b >= h and si[fl[b - h], _I_JOB] > xj:
                fl[b] = fl[b - h]
                b -= h
            fl[b] = x
        h //= 3
    for a in range(n_flows):
        s = fl[a]
        si[s, _I_FROZEN] = 0
        sf[s, _F_SHARE] = 1.0
        _links_add(si[s, _I_JOB], n, coll_ptr, coll_members, link, link_cnt, link_cap, 1)
    left = n_flows
    while left > 0:
        best = np.inf
        for a in range(n_flows):
            s = fl[a]
            if si[s, _I_FROZEN] == 0:
                v = _flow_share(si[s, _I_JOB], n, coll_ptr, coll_members, link, link_cnt,
                                link_cap)
                if v < best:
                    best = v
        progressed = False
        for a in range(n_flows):
            s = fl[a]
            if si[s, _I_FROZEN] == 0:
                v = _flow_share(si[s, _I_JOB], n, coll_ptr, coll_members, link, link_cnt,
                                link_cap)
                if v <= best:
                    si[s, _I_FROZEN] = 1
                    sf[s, _F_SHARE] = min(best, 1.0)
                    left -= 1
                    progressed = True
                    _links_freeze(si[s, _I_JOB], n, coll_ptr, coll_members, link,
                                  link_cnt, link_cap, sf[s, _F_SHARE])
        if not progressed:
            break
    for a in range(n_flows):
        _links_reset(si[fl[a], _I_JOB], n, coll_ptr, coll_members, link, link_cnt, link_cap)


@njit(cache=True, _nrt=False)
def _rerate_cands(now, ncand, n, coll_ptr, coll_members, device, resource, n_compute, n_comm,
                  share_compute, share_links, slowdown, inv_c, comm_inv, comm_cap, sf, si, jt, jq, js, jsize,
                  hmode, seq):
    """Re-evaluate the rates of the candidate slots (link shares already set by
    :func:`_fill_shares`), in job-id order (so that sequence numbers do not depend on
    bookkeeping order); reschedule those whose rate changed.

    Candidates whose rate does not change have no effect, so the candidate sets may be
    supersets of the jobs a change affects."""
    _cands_by_job(si, ncand)
    for a in range(ncand):
        s = si[a, _L_CAND]
        si[s, _I_MARK] = 0
        if si[s, _I_POS] < 0:
            continue
        j = si[s, _I_JOB]
        if j < n and resource[j] == 1:
            d = device[j]
            r = 1.0
            if share_compute and n_compute[d] > 1:
                r = 1.0 / n_compute[d]
            if slowdown > 0.0 and n_comm[d] > 0:
                r = r * inv_c[j]
        else:
            r = sf[s, _F_SHARE] if share_links else 1.0
            if slowdown > 0.0 and _touches_compute(j, n, coll_ptr, coll_members, device,
                                                       n_compute):
                r = _under_compute(r, _comm_inv(j, n, coll_ptr, coll_members, comm_inv),
                                   comm_cap)
        if r != sf[s, _F_RATE]:
            _jkey(jt, jq, js, si, jsize, hmode, s, _rerate(sf, s, now, sf[s, _F_RATE], r),
                  seq)
            seq += 1
    return seq


@njit(cache=True, inline="always")
def _comm_inv(j, n, coll_ptr, coll_members, comm_inv):
    """Rate of communication job ``j`` (an op, or collective ``j - n``: its first member's)
    while it touches a computing device."""
    return comm_inv[j] if j < n else comm_inv[coll_members[coll_ptr[j - n]]]


@njit(cache=True, inline="always")
def _under_compute(share, inv, cap):
    """A flow's rate next to compute: its link share slowed by ``inv``, or capped at it."""
    return min(share, inv) if cap else share * inv


@njit(cache=True, inline="always")
def _touches_compute(j, n, coll_ptr, coll_members, device, n_compute):
    if j < n:
        return device[j] >= 0 and n_compute[device[j]] > 0
    c = j - n
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        d = device[coll_members[k]]
        if d >= 0 and n_compute[d] > 0:
            return True
    return False


@njit(cache=True, _nrt=False)
def _toggle_flows(d, entered, now, n, coll_ptr, coll_members, device, n_compute, share_links,
                  inv_c, comm_inv, comm_cap, sf, si, jt, jq, js, n_flows, jsize, hmode, seq):
    """Device ``d``'s compute just switched on or off (``n_compute[d]`` already updated)
    while flows run on it, without compute sharing: rescale the flows whose slowdown
    status flipped (a member on ``d`` and none on another computing device), and set the
    rate of the compute job that just started (slot ``entered``; -1 for none), in job-id
    order: what :func:`_rerate_cands` does for this change, without its general candidate sets."""
    on = n_compute[d] > 0
    ncand = 0
    if entered >= 0:
        si[0, _L_CAND] = entered
        ncand = 1
    bit = np.int64(np.uint64(1) << np.uint64(d & 63))
    for a in range(n_flows):
        f = si[a, _L_FLOWS]
        if not (si[f, _I_DMASK] & bit):  # no member on d
            continue
        j = si[f, _I_JOB]
        a0 = j if j < n else coll_ptr[j - n]
        a1 = j + 1 if j < n else coll_ptr[j - n + 1]
        hasd = False
        other = False
        for k in range(a0, a1):
            dd = device[j] if j < n else device[coll_members[k]]
            if dd == d:
                hasd = True
            elif dd >= 0 and n_compute[dd] > 0:
                other = True  # touches compute elsewhere: no change
                break
        if hasd and not other:
            si[ncand, _L_CAND] = f
            ncand += 1
    _cands_by_job(si, ncand)
    for a in range(ncand):
        s = si[a, _L_CAND]
        if s == entered:
            r = inv_c[si[s, _I_JOB]]  # a compute job next to communication
            old = -1.0  # forced: its rate is being set
        else:
            r = sf[s, _F_SHARE] if share_links else 1.0
            if on:
                r = _under_compute(r, _comm_inv(si[s, _I_JOB], n, coll_ptr, coll_members,
                                                comm_inv), comm_cap)
            old = sf[s, _F_RATE]
        if r != old:
            _jkey(jt, jq, js, si, jsize, hmode, s, _rerate(sf, s, now, old, r), seq)
            seq += 1
    return seq

watch_compiles()  # say so on stderr when these kernels compile on first use
