"""numba kernels of the analysis package (arrays in, arrays out; see CONVENTIONS.md §1)."""

from __future__ import annotations

import numpy as np
from numba import njit

from retime.collectors.progress import watch_compiles

__all__: list[str] = []


@njit(cache=True)
def _union_len_grouped(group, start, end, n_groups):  # pragma: no cover - compiled
    """Length of the union of intervals per group.

    Parameters
    ----------
    group : int64[n]   group index 0..n_groups-1, sorted ascending
    start, end : int64[n]  interval bounds in ns, sorted by start within each group
    n_groups : int

    Returns
    -------
    int64[n_groups]  total covered ns per group (overlaps counted once)
    """
    out = np.zeros(n_groups, np.int64)
    n = group.shape[0]
    i = 0
    while i < n:
        g = group[i]
        cur_s = start[i]
        cur_e = end[i]
        total = 0
        i += 1
        while i < n and group[i] == g:
            s = start[i]
            e = end[i]
            if s > cur_e:
                total += cur_e - cur_s
                cur_s = s
                cur_e = e
            elif e > cur_e:
                cur_e = e
            i += 1
        total += cur_e - cur_s
        out[g] = total
    return out


@njit(cache=True)
def _longest_path(order, indptr, pred_src, pred_w, dur):  # pragma: no cover - compiled
    """Longest path (node weight ``dur``, arc weight ``pred_w``) in topological ``order``.

    Parameters
    ----------
    order : int64[n]  node ids in a topological order (every arc goes forward in it)
    indptr : int64[n+1], pred_src : int64[m], pred_w : int64[m]
        CSR of incoming arcs per node (source node, weight in ns), sorted by source id
    dur : int64[n]  node durations in ns

    Returns
    -------
    es : int64[n]  earliest start, ``max(0, max over arcs (es[u] + dur[u] + w))``, in ns
    best : int64[n]  predecessor on the longest path, -1 for none (ties: lowest source id)
    best_arc : int64[n]  CSR index of the arc from ``best`` (-1 when none)
    """
    n = order.shape[0]
    es = np.zeros(n, np.int64)
    best = np.full(n, -1, np.int64)
    best_arc = np.full(n, -1, np.int64)
    for k in range(n):
        v = order[k]
        b = -1
        bj = -1
        bv = 0
        for j in range(indptr[v], indptr[v + 1]):
            u = pred_src[j]
            val = es[u] + dur[u] + pred_w[j]
            if b == -1 or val > bv:
                b = u
                bv = val
                bj = j
        # a negative-lag chain never starts before time 0
        es[v] = bv if bv > 0 else 0
        best[v] = b
        best_arc[v] = bj
    return es, best, best_arc


@njit(cache=True)
def _backtrack(pred, last):  # pragma: no cover - compiled
    """Follow ``pred`` links from ``last`` to a node without predecessor; path in order.

    Stops after ``pred.shape[0]`` hops so a corrupt (cyclic) ``pred`` cannot hang.
    """
    buf = np.empty(pred.shape[0] + 1, np.int64)
    k = 0
    v = last
    while v >= 0 and k <= pred.shape[0]:
        buf[k] = v
        k += 1
        v = pred[v]
    out = np.empty(k, np.int64)
    for i in range(k):
        out[i] = buf[k - 1 - i]
    return out


@njit(cache=True)
def _add_cover(out, row, s, e, t0, bin_ns, n_bins):  # pragma: no cover - compiled
    """Add the interval [s, e) (ns) to ``row`` of ``out`` (covered ns per time bin)."""
    a = (s - t0) / bin_ns
    b = (e - t0) / bin_ns
    if a < 0.0:
        a = 0.0
    if b > n_bins:
        b = float(n_bins)
    if b <= a:
        return
    ia = int(a)
    ib = int(b)
    if ia == ib:
        out[row, ia] += (b - a) * bin_ns
        return
    out[row, ia] += (ia + 1 - a) * bin_ns
    for k in range(ia + 1, min(ib, n_bins)):
        out[row, k] += bin_ns
    if ib < n_bins:
        out[row, ib] += (b - ib) * bin_ns


@njit(cache=True)
def _binned_union(group, start, end, row_of_group, n_rows, t0, bin_ns, n_bins):  # pragma: no cover
    """Covered time of the union of each group's intervals, per time bin, summed into rows.

    Parameters
    ----------
    group : int64[n]  group index (e.g. a rank), sorted ascending
    start, end : int64[n]  interval bounds in ns, sorted by start within each group
    row_of_group : int64[n_groups]  output row of each group (several groups may share one)
    n_rows : int
    t0 : int64  start of bin 0 in ns
    bin_ns : float64  bin width in ns
    n_bins : int

    Returns
    -------
    float64[n_rows, n_bins]  per row and bin, the sum over its groups of each group's covered
    ns (overlaps within a group counted once; time outside the bins ignored)
    """
    out = np.zeros((n_rows, n_bins), np.float64)
    n = group.shape[0]
    i = 0
    while i < n:
        g = group[i]
        row = row_of_group[g]
        cs = start[i]
        ce = end[i]
        i += 1
        while i < n and group[i] == g:
            s = start[i]
            e = end[i]
            if s > ce:
                _add_cover(out, row, cs, ce, t0, bin_ns, n_bins)
                cs = s
                ce = e
            elif e > ce:
                ce = e
            i += 1
        _add_cover(out, row, cs, ce, t0, bin_ns, n_bins)
    return out


@njit(cache=True)
def _merge_close(group, start, end, gap):  # pragma: no cover - compiled
    """Merge intervals of a group that overlap or lie less than ``gap`` ns apart.

    Parameters
    ----------
    group : int64[n]  sorted ascending; start, end : int64[n] sorted by start per group
    gap : int64  largest gap (ns) closed by merging

    Returns
    -------
    (index of each merged interval's first input row, start, end), int64[m] each
    """
    n = group.shape[0]
    first = np.empty(n, np.int64)
    ms = np.empty(n, np.int64)
    me = np.empty(n, np.int64)
    m = 0
    i = 0
    while i < n:
        g = group[i]
        first[m] = i
        ms[m] = start[i]
        me[m] = end[i]
        i += 1
        while i < n and group[i] == g and start[i] - me[m] <= gap:
            if end[i] > me[m]:
                me[m] = end[i]
            i += 1
        m += 1
    return first[:m].copy(), ms[:m].copy(), me[:m].copy()



@njit(cache=True)
def _clip_pass(op_r, s, e, wptr, ws, we, idx, win, cs, ce):  # pragma: no cover
    """One pass of :func:`_clip_to_windows`: count the pieces, or write them where the
    output arrays have room (a flag argument would compile twice, once per literal)."""
    fill = idx.shape[0] > 0
    m = 0
    for i in range(s.shape[0]):
        r = op_r[i]
        if r < 0:
            continue
        a = s[i]
        b = e[i]
        if b <= a:
            continue
        lo = wptr[r]
        end = wptr[r + 1]
        hi = end
        while lo < hi:  # first window ending after a
            mid = (lo + hi) // 2
            if we[mid] <= a:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        while j < end and ws[j] < b:
            p = max(a, ws[j])
            q = min(b, we[j])
            if q > p:
                if fill:
                    idx[m] = i
                    win[m] = j
                    cs[m] = p
                    ce[m] = q
                m += 1
            j += 1
    return m


@njit(cache=True)
def _clip_to_windows(op_r, s, e, wptr, ws, we):  # pragma: no cover - compiled
    """Cut intervals at the windows of their group (rank).

    Parameters
    ----------
    op_r : int64[n]  dense group (rank) of each interval, ``-1`` for none
    s, e : int64[n]  interval bounds in ns
    wptr : int64[R+1]  group ``r``'s windows are ``ws/we[wptr[r]:wptr[r+1]]``, sorted by
        start and not overlapping
    ws, we : int64[W]  window bounds in ns

    Returns
    -------
    idx, win, cs, ce : int64[m]  one row per non-empty piece: the interval, its window, the
        piece's bounds (``max(s, ws)``, ``min(e, we)``), in interval order
    """
    z = np.empty(0, np.int64)
    m = _clip_pass(op_r, s, e, wptr, ws, we, z, z, z, z)
    idx = np.empty(m, np.int64)
    win = np.empty(m, np.int64)
    cs = np.empty(m, np.int64)
    ce = np.empty(m, np.int64)
    _clip_pass(op_r, s, e, wptr, ws, we, idx, win, cs, ce)
    return idx, win, cs, ce


@njit(cache=True)
def _host_nesting(lane, s, e, ty):  # pragma: no cover - compiled
    """Nesting of host instances on their threads (the attribution tree's stack walk).

    Events come sorted by (lane, start, -end, type). An instance (``ty`` 0 range, 1 leaf
    operator) is enclosed by the instance on top of its lane's stack; the stack pops the
    instances that ended at or before the event's start. A runtime call (``ty`` 2) is only
    attributed to the top of the stack.

    Parameters
    ----------
    lane, s, e, ty : int64[n]  lane, start and end (ns) and type of each event, sorted

    Returns
    -------
    parent : int64[n]  the enclosing instance's event index, -1 for none
    depth : int64[n]   instances: 0 for outermost, parent's depth + 1; calls: -1
    child_ns : int64[n]  instances: time covered by their direct children (each child
        clipped at the instance's end)
    """
    n = lane.shape[0]
    parent = np.full(n, -1, np.int64)
    depth = np.full(n, -1, np.int64)
    child = np.zeros(n, np.int64)
    stack = np.empty(n, np.int64)
    top = 0
    cur = np.int64(-1)
    for j in range(n):
        if j == 0 or lane[j] != cur:
            cur = lane[j]
            top = 0
        while top > 0 and s[j] >= e[stack[top - 1]]:
            top -= 1
        if ty[j] == 2:
            if top > 0:
                parent[j] = stack[top - 1]
            continue
        if top > 0:
            p = stack[top - 1]
            parent[j] = p
            depth[j] = depth[p] + 1
            end = e[j] if e[j] < e[p] else e[p]
            child[p] += end - s[j]
        else:
            depth[j] = 0
        stack[top] = j
        top += 1
    return parent, depth, child


@njit(cache=True)
def _union_lens_coded(g1, s1, e1, code, sets, g2, s2, e2, with2, n_groups):  # pragma: no cover - compiled
    """Several :func:`_union_len_grouped` in one pass: the union length per group of the
    intervals whose ``code`` has a bit of ``sets[k]``, for every ``k`` at once; the second
    sequence (``g2, s2, e2``) joins the sets where ``with2[k]``. Both sequences sorted by
    (group, start); merged on the fly.

    Parameters
    ----------
    g1, s1, e1 : int64[n1]  group, start, end, sorted by (group, start)
    code : int64[n1]  bit flags of each interval
    sets : int64[K]  the bits of each set
    g2, s2, e2 : int64[n2]  the second sequence, sorted the same way
    with2 : bool[K]  sets the second sequence belongs to
    n_groups : int

    Returns
    -------
    int64[n_groups, K]  covered ns per group and set (overlaps counted once)
    """
    nk = sets.shape[0]
    out = np.zeros((n_groups, nk), np.int64)
    cs = np.zeros(nk, np.int64)
    ce = np.zeros(nk, np.int64)
    tot = np.zeros(nk, np.int64)
    on = np.zeros(nk, np.bool_)
    n1 = g1.shape[0]
    n2 = g2.shape[0]
    i = 0
    j = 0
    g = np.int64(-1)
    while i < n1 or j < n2:
        if j >= n2 or (i < n1 and (g1[i] < g2[j] or (g1[i] == g2[j] and s1[i] <= s2[j]))):
            gg = g1[i]
            s = s1[i]
            e = e1[i]
            c = code[i]
            second = False
            i += 1
        else:
            gg = g2[j]
            s = s2[j]
            e = e2[j]
            c = 0
            second = True
            j += 1
        if gg != g:
            if g >= 0:
                for k in range(nk):
                    out[g, k] = tot[k] + (ce[k] - cs[k] if on[k] else 0)
            g = gg
            for k in range(nk):
                tot[k] = 0
                on[k] = False
        for k in range(nk):
            if (c & sets[k]) == 0 and not (second and with2[k]):
                continue
            if not on[k]:
                on[k] = True
                cs[k] = s
                ce[k] = e
            elif s > ce[k]:
                tot[k] += ce[k] - cs[k]
                cs[k] = s
                ce[k] = e
            elif e > ce[k]:
                ce[k] = e
    if g >= 0:
        for k in range(nk):
            out[g, k] = tot[k] + (ce[k] - cs[k] if on[k] else 0)
    return out


@njit(cache=True)
def _mix64(x):  # pragma: no cover - compiled
    """pandas' ``hash_array`` of one 64-bit integer (its bit mixer, same result)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _op_signatures(name, kind, rel, dur, ordinal):  # pragma: no cover - compiled
    """Per op, :func:`analysis.timeline.step_signatures`' hash: the pandas hashes of its
    name, kind, offset, duration and lane position, weighted and summed (wrapping).

    Parameters
    ----------
    name, kind, rel, dur, ordinal : uint64[n]  the ops' fields, as unsigned 64-bit views

    Returns
    -------
    uint64[n]
    """
    n = name.shape[0]
    out = np.empty(n, np.uint64)
    for i in range(n):
        out[i] = (_mix64(name[i]) * np.uint64(1000003) + _mix64(kind[i]) * np.uint64(7919)
                  + _mix64(rel[i]) * np.uint64(104729) + _mix64(dur[i]) * np.uint64(1299709)
                  + _mix64(ordinal[i]) * np.uint64(15485863))
    return out


watch_compiles()  # say so on stderr when these kernels compile on first use
