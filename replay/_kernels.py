"""numba kernels of the replay engine (arrays in, arrays out; no objects, no pandas).

Conventions: every time is an ``int64`` nanosecond count unless a name says otherwise, op
ids are ``int64`` row numbers of the Trace's ``ops`` table, ``-1`` means "none". The public,
typed wrappers live in :mod:`replay.graph` and :mod:`replay.engine`; only they call these.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retime.collectors.progress import watch_compiles

_NEG = np.int64(-(2**62))  # "minus infinity" that survives adding a lag


@njit(cache=True)
def _node_succ(node_of, lane_prev, pred_ptr, pred_src, wait_ptr, wait_src):
    """Successor lists between super-nodes (``node_of``: each op's representative) over
    lane links, start edges and wait edges; links inside one super-node are dropped.

    Returns ``succ_ptr`` (int32[N+1]), ``succ_dst`` (int32) and ``indeg`` (int32[N]). The
    order inside one list is arbitrary (Kahn's algorithm below does not depend on it)."""
    n = node_of.shape[0]
    ptr = np.zeros(n + 1, np.int32)
    indeg = np.zeros(n, np.int32)
    for rnd in range(2):
        if rnd == 1:
            for i in range(n):
                ptr[i + 1] += ptr[i]
            dst = np.empty(ptr[n], np.int32)
        for i in range(n):
            b = node_of[i]
            p = lane_prev[i]
            if p >= 0:
                a = node_of[p]
                if a != b:
                    if rnd == 0:
                        ptr[a + 1] += 1
                        indeg[b] += 1
                    else:
                        dst[ptr[a]] = b
                        ptr[a] += 1
            for k in range(pred_ptr[i], pred_ptr[i + 1]):
                a = node_of[pred_src[k]]
                if a != b:
                    if rnd == 0:
                        ptr[a + 1] += 1
                        indeg[b] += 1
                    else:
                        dst[ptr[a]] = b
                        ptr[a] += 1
            for k in range(wait_ptr[i], wait_ptr[i + 1]):
                a = node_of[wait_src[k]]
                if a != b:
                    if rnd == 0:
                        ptr[a + 1] += 1
                        indeg[b] += 1
                    else:
                        dst[ptr[a]] = b
                        ptr[a] += 1
    for i in range(n, 0, -1):  # the fill cursors ran to the next list's start
        ptr[i] = ptr[i - 1]
    ptr[0] = 0
    return ptr, dst, indeg


@njit(cache=True)
def _topo_order_by_time(node_of, succ_ptr, succ_dst, indeg, key):
    """Kahn's algorithm over super-nodes (an op, or all members of one collective; ``node_of``
    maps each op to its representative) taking, among the ready ones, the one with the smallest
    ``(key, id)`` (``key``: measured start; a collective's: its last member's start).

    The result is a valid topological order close to measured time order. The graph builder
    lays the ops out in this order, so both replay paths walk memory almost sequentially.
    Returns ``order`` (int32[K], representatives) and ``count`` (K; fewer than the number
    of super-nodes means a cycle). ``indeg`` is consumed.
    """
    n = node_of.shape[0]
    order = np.empty(n, np.int32)
    heap = np.empty(n + 1, np.int32)
    hkey = np.empty(n + 1, np.int64)  # the heap entries' keys, beside them: no indirection
    size = 0
    cnt = 0
    for i in range(n):
        if node_of[i] == i and indeg[i] == 0:
            size = _tpush(heap, hkey, size, key[i], i)
    while size > 0:
        u = heap[0]
        size = _tpop(heap, hkey, size)
        order[cnt] = u
        cnt += 1
        for k in range(succ_ptr[u], succ_ptr[u + 1]):
            v = succ_dst[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                size = _tpush(heap, hkey, size, key[v], v)
    return order[:cnt], cnt


@njit(cache=True)
def _tpush(heap, hkey, size, kx, x):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        y = heap[p]
        ky = hkey[p]
        if kx < ky or (kx == ky and x < y):
            heap[i] = y
            hkey[i] = ky
            i = p
        else:
            break
    heap[i] = x
    hkey[i] = kx
    return size + 1


@njit(cache=True)
def _tpop(heap, hkey, size):
    size -= 1
    x = heap[size]
    kx = hkey[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        y = heap[c]
        ky = hkey[c]
        if c + 1 < size:
            z = heap[c + 1]
            kz = hkey[c + 1]
            if kz < ky or (kz == ky and z < y):
                c += 1
                y = z
                ky = kz
        if ky < kx or (ky == kx and y < x):
            heap[i] = y
            hkey[i] = ky
            i = c
        else:
            break
    heap[i] = x
    hkey[i] = kx
    return size


@njit(cache=True)
def _dense_codes(x, lo, span):
    """``len(u), inv`` of ``u, inv = np.unique(x, return_inverse=True)`` for integers in
    ``lo .. lo + span - 1``: a presence table and its running count, no sort."""
    code = np.zeros(span, np.int64)
    for i in range(x.shape[0]):
        code[x[i] - lo] = 1
    k = 0
    for v in range(span):
        if code[v]:
            code[v] = k
            k += 1
    inv = np.empty(x.shape[0], np.int64)
    for i in range(x.shape[0]):
        inv[i] = code[x[i] - lo]
    return k, inv


@njit(cache=True)
def _stable_argsort(key):  # pragma: no cover - compiled
    """``np.argsort(key, kind="stable")``: a bottom-up merge sort of indices (ties keep
    index order). Written out because numba's own merge sort takes seconds to compile on a
    fresh install, for a fallback that rarely runs.

    key : int64[m] or float64[m]; returns int64[m]
    """
    m = key.shape[0]
    idx = np.arange(m)
    tmp = np.empty(m, np.int64)
    w = 1
    while w < m:
        for lo in range(0, m, 2 * w):
            mid = min(lo + w, m)
            hi = min(lo + 2 * w, m)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if key[idx[j]] < key[idx[i]]:
                    tmp[k] = idx[j]
                    j += 1
                else:
                    tmp[k] = idx[i]
                    i += 1
                k += 1
            while i < mid:
                tmp[k] = idx[i]
                i += 1
                k += 1
            while j < hi:
                tmp[k] = idx[j]
                j += 1
                k += 1
        idx, tmp = tmp, idx
        w *= 2
    return idx


@njit(cache=True)
def _group_order(major, lo, n_groups, minor):
    """The order of ``np.lexsort((minor, major))`` (stable: ties by index) for small
    integer ``major`` values (``lo <= major < lo + n_groups``): a counting sort by ``major``,
    then each group sorted by ``minor``: skipped for a group already in order, the common
    case (a lane's ops in op-id order are in time order), an insertion sort for a nearly
    sorted one, a merge sort otherwise (all stable)."""
    n = major.shape[0]
    ptr = np.zeros(n_groups + 1, np.int64)
    for i in range(n):
        ptr[major[i] - lo + 1] += 1
    for g in range(n_groups):
        ptr[g + 1] += ptr[g]
    out = np.empty(n, np.int64)
    cur = ptr[:n_groups].copy()
    for i in range(n):
        g = major[i] - lo
        out[cur[g]] = i
        cur[g] += 1
    for g in range(n_groups):
        a = ptr[g]
        b = ptr[g + 1]
        srt = True
        for k in range(a + 1, b):
            if minor[out[k]] < minor[out[k - 1]]:
                srt = False
                break
        if not srt:
            m = b - a
            key = np.empty(m, minor.dtype)
            for k in range(m):
                key[k] = minor[out[a + k]]
            # nearly sorted (a few ops out of place): a stable insertion sort, until its
            # moves exceed a budget; then a stable merge sort of what it left
            budget = 16 * m + 1024
            moves = 0
            for j in range(1, m):
                kj = key[j]
                if kj >= key[j - 1]:
                    continue
                oj = out[a + j]
                t = j
                while t > 0 and key[t - 1] > kj:
                    key[t] = key[t - 1]
                    out[a + t] = out[a + t - 1]
                    t -= 1
                key[t] = kj
                out[a + t] = oj
                moves += j - t
                if moves > budget:
                    seg = out[a:b].copy()
                    idx = _stable_argsort(key)
                    for k in range(m):
                        out[a + k] = seg[idx[k]]
                    break
    return out


@njit(cache=True)
def _lane_links(lo, lane, start, end):
    """Lane predecessors from ``lo`` (op ids by lane, then measured start): ``lane_prev``
    (int32, -1 for a lane's first op), ``lane_lag`` (int64: ``min(0, start - prev end)``, or
    ``start - prev start`` where that is negative) and ``lane_s2s`` (bool: the op overlapped
    its predecessor, so it counts from the predecessor's start)."""
    n = lo.shape[0]
    prev = np.full(n, -1, np.int32)
    lag = np.zeros(n, np.int64)
    s2s = np.zeros(n, np.bool_)
    for j in range(1, n):
        i = lo[j]
        p = lo[j - 1]
        if lane[i] != lane[p]:
            continue
        prev[i] = p
        v = start[i] - end[p]
        if v < 0:
            s2s[i] = True
            lag[i] = start[i] - start[p]
    return prev, lag, s2s


@njit(cache=True)
def _edge_lags(src, dst, lag, kind, sync, start, end, dur, node_of):
    """Per edge: its lag clamped to the measured gap (``min(lag, start[dst] - end[src])``),
    whether it joins two super-nodes (``keep``), and how many lags the clamp lowered. A
    negative lag (a kernel that starts before its launch call returns, skewed clocks across
    ranks) is counted from the source's start (``+ dur[src]``; ``s2s``), so shortening the
    source does not pull the destination ahead of it; except on SYNC edges (``kind ==
    sync``: a thread that resumes a little before the collective it waited for closes its
    range), which stay counted from the source's end and move with it."""
    m = src.shape[0]
    out = np.empty(m, np.int64)
    s2s = np.empty(m, np.bool_)
    keep = np.empty(m, np.bool_)
    clamped = 0
    for k in range(m):
        a = src[k]
        b = dst[k]
        v = start[b] - end[a]
        if lag[k] <= v:
            v = lag[k]
        else:
            clamped += 1
        neg = v < 0 and kind[k] != sync
        s2s[k] = neg
        out[k] = v + dur[a] if neg else v
        keep[k] = node_of[a] != node_of[b]
    return out, s2s, keep, clamped


@njit(cache=True)
def _layout_perm(order, coll_of, coll_ptr, members):
    """Layout position -> op id: the super-nodes in ``order``, a collective's members
    together in op-id order (``members`` sorted by collective, then op id)."""
    n = coll_of.shape[0]
    perm = np.empty(n, np.int32)
    k = 0
    for t in range(order.shape[0]):
        u = order[t]
        c = coll_of[u]
        if c < 0:
            perm[k] = u
            k += 1
        else:
            for j in range(coll_ptr[c], coll_ptr[c + 1]):
                perm[k] = members[j]
                k += 1
    pos = np.empty(n, np.int32)
    for i in range(n):
        pos[perm[i]] = i
    return perm, pos


@njit(cache=True)
def _csr_by_dst(n, dst, src, keep, lag, kind, s2s, pos):
    """CSR of the kept edges by ``dst``, each row sorted by ``src`` (ties in input order).

    With ``pos`` (an op id -> layout position map; empty for none) rows and sources are
    mapped through it first. Returns ``ptr`` (int32[n+1]), ``src`` (int32), ``lag``
    (int64), ``kind`` (int8), ``s2s`` (bool)."""
    m = dst.shape[0]
    ptr = np.zeros(n + 1, np.int32)
    mapped = pos.shape[0] > 0
    for k in range(m):
        if keep[k]:
            r = pos[dst[k]] if mapped else dst[k]
            ptr[r + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    e = ptr[n]
    o_src = np.empty(e, np.int32)
    o_lag = np.empty(e, np.int64)
    o_kind = np.empty(e, np.int8)
    o_s2s = np.empty(e, np.bool_)
    cur = ptr[:n].copy()  # fill cursor of each row
    for k in range(m):  # in input order, insertion-sorting each row by src (stable)
        if not keep[k]:
            continue
        r = pos[dst[k]] if mapped else dst[k]
        v = pos[src[k]] if mapped else src[k]
        lo = ptr[r]
        j = cur[r]
        cur[r] += 1
        while j > lo and o_src[j - 1] > v:
            o_src[j] = o_src[j - 1]
            o_lag[j] = o_lag[j - 1]
            o_kind[j] = o_kind[j - 1]
            o_s2s[j] = o_s2s[j - 1]
            j -= 1
        o_src[j] = v
        o_lag[j] = lag[k]
        o_kind[j] = kind[k]
        o_s2s[j] = s2s[k]
    return ptr, o_src, o_lag, o_kind, o_s2s


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


@njit(cache=True, nogil=True)
def _fast_replay(order, coll_of, coll_ptr, coll_members, dur, delay, origin, lane_prev,
                 lane_lag, lane_s2s, pred_ptr, pred_src, pred_lag, pred_s2s, wait_ptr, wait_src,
                 wait_lag, start, end, crit):
    """Longest-path list scheduling in topological order, O(N + E).

    An op starts at ``max(lane predecessor end + lane_lag, pred end + lag) + delay`` (its
    ``origin`` when it has no predecessor at all) and ends at ``start + dur``, or later when a
    wait edge says so (``end >= wait_src end + wait_lag``: blocking host calls). A collective
    member starts at its own ready time; the collective begins when the last member has
    started (time ``A``) and member ``m`` ends at ``max(start_m, A + dur_m)`` (``dur_m`` is its
    transfer tail after the last arrival).

    Inputs and outputs are per layout position: fills ``start``, ``end`` (int64[N], ns) and
    ``crit`` (int64[N]: the position of the op whose end bound the op's end, through its
    start or a wait; ``-1`` for roots). :func:`_to_op_order_i64` maps them to op ids (the
    engine does so only when a result's op-order arrays are first read: a sweep's row
    metrics read the layout order directly). The outputs are passed in, allocated by numpy:
    it asks for huge pages, which halves the page-fault cost of a 10^7-op replay compared
    with numba's allocator.
    """
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
                crit[m] = cp  # the start's binding op, for now
                if s > a:
                    a = s
                    last = m
            for k in range(coll_ptr[c], coll_ptr[c + 1]):
                m = coll_members[k]
                cp = crit[m]
                e = start[m]
                v = a + dur[m]
                if v > e:
                    e = v
                    if m != last:
                        cp = last
                for j in range(wait_ptr[m], wait_ptr[m + 1]):
                    v = end[wait_src[j]] + wait_lag[j]
                    if v > e:
                        e = v
                        cp = wait_src[j]
                end[m] = e
                crit[m] = cp


@njit(cache=True)
def _measured_ready(start, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src,
                    pred_lag, pred_s2s):
    """Ready time of every op computed from the measured times of its predecessors.

    :func:`_ready`'s rule written out here (without the binding op): through the inlined
    call this loop took ~120 ns per op on 0.5 M-op replay windows, written out ~5 ns (the
    same values; ``tests/test_replay_window*.py`` compare every op's replayed times)."""
    n = start.shape[0]
    out = np.empty(n, np.int64)
    for i in range(n):
        ready = _NEG
        found = False
        p = lane_prev[i]
        if p >= 0:
            ready = (start[p] if lane_s2s[i] else end[p]) + lane_lag[i]
            found = True
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if pred_s2s[k]:
                v = start[pred_src[k]] + pred_lag[k]
            else:
                v = end[pred_src[k]] + pred_lag[k]
            if v > ready:
                ready = v
                found = True
        out[i] = ready if found else origin[i]
    return out


@njit(cache=True, nogil=True)
def _to_op_order(perm, start, end, crit, base, s, e, c):
    """Per-position float results (relative to ``base``) -> int64 ns in op-id order, rounded,
    into ``s``, ``e`` and ``c`` (``crit`` values mapped to op ids too)."""
    n = perm.shape[0]
    for k in range(n):
        p = perm[k]
        s[p] = np.int64(np.rint(start[k])) + base
        e[p] = np.int64(np.rint(end[k])) + base
        c[p] = perm[crit[k]] if crit[k] >= 0 else -1


@njit(cache=True, nogil=True)
def _to_op_order_i64(perm, start, end, crit, s, e, c):
    """The fast path's per-position results (int64 ns, ``crit`` positions) in op-id order,
    into ``s``, ``e`` and ``c``."""
    for k in range(perm.shape[0]):
        p = perm[k]
        s[p] = start[k]
        e[p] = end[k]
        c[p] = perm[crit[k]] if crit[k] >= 0 else -1


@njit(cache=True)
def _scale_by_class(dur, cls, factor):
    """``dur *= factor[cls]`` in place, without the temporary per-op factor array."""
    for i in range(dur.shape[0]):
        dur[i] *= factor[cls[i]]


@njit(cache=True)
def _layout_durations(dur, perm, coll_of, ref, out):
    """A what-if's float durations (op-id order) -> int64 ns in layout order, into ``out``:
    rounded half to even (as ``np.rint``), negative values set to 0 except on collective
    members (``coll_of``, layout order: a skewed clock's negative transfer tail). Returns
    whether ``out`` differs from ``ref`` (the graph's own layout durations)."""
    changed = False
    for k in range(perm.shape[0]):
        v = np.int64(np.rint(dur[perm[k]]))
        if v < 0 and coll_of[k] < 0:
            v = np.int64(0)
        out[k] = v
        if v != ref[k]:
            changed = True
    return changed


@njit(cache=True, nogil=True)
def _layout_durations_scaled(ref, cls, factor, coll_of, out):
    """:func:`_layout_durations` of the graph's own durations scaled per class, all in
    layout order: ``out[k] = rint(float(ref[k]) * factor[cls[k]])`` (the product
    :func:`_scale_by_class` forms in op-id order), negative values set to 0 except on
    collective members. Returns whether ``out`` differs from ``ref``."""
    changed = False
    for k in range(ref.shape[0]):
        d = np.float64(ref[k])
        d *= factor[cls[k]]
        v = np.int64(np.rint(d))
        if v < 0 and coll_of[k] < 0:
            v = np.int64(0)
        out[k] = v
        if v != ref[k]:
            changed = True
    return changed


# sweep metrics kernels: replay._metric_kernels (re-exported for existing imports)
from ._metric_kernels import _metric_spans, _metric_spans_layout  # noqa: E402, F401

watch_compiles()  # say so on stderr when these kernels compile on first use
