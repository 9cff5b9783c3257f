"""numba kernels of the collectors (arrays in, arrays out; see CONVENTIONS.md §1)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .progress import watch_compiles

__all__ = ["latest_done", "nest_intervals", "scan_json_array"]
__all__ = ["latest_done", "nest_intervals", "scan_json_array", "align_sequences",
           "ALIGN_MAX_CELLS", "acyclic_nodes"]


@njit(cache=True)
def _nest(lane, start, end):  # pragma: no cover - compiled
    n = start.shape[0]
    depth = np.zeros(n, np.int16)
    container = np.zeros(n, np.bool_)
    parent = np.full(n, -1, np.int64)
    stack = np.empty(n, np.int64)
    top = 0
    for i in range(n):
        if i > 0 and lane[i] != lane[i - 1]:
            top = 0
        while top > 0 and end[stack[top - 1]] <= start[i]:
            top -= 1
        if top > 0:
            p = stack[top - 1]
            container[p] = True
            parent[i] = p
        depth[i] = top
        stack[top] = i
        top += 1
    return depth, container, parent


def nest_intervals(lane: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Nesting of intervals on lanes.

    Inputs must be sorted by (lane, start ascending, end descending).

    Parameters
    ----------
    lane : int64 (n,)   lane of each interval
    start, end : int64 (n,) ns

    Returns
    -------
    depth : int16 (n,) number of enclosing intervals on the same lane
    container : bool (n,) True if the interval encloses another one
    parent : int64 (n,) index of the innermost enclosing interval, -1 if none
    """
    return _nest(np.ascontiguousarray(lane, np.int64), np.ascontiguousarray(start, np.int64),
                 np.ascontiguousarray(end, np.int64))


@njit(cache=True)
def _scan_json_array(buf, key, chunk_bytes):  # pragma: no cover - compiled
    n = buf.shape[0]
    depth = 0
    in_str = False
    esc = False
    str_start = -1
    key_match = False
    pending = False
    a = -1
    b = -1
    cuts = np.empty(n // max(chunk_bytes, 1) + 2, np.int64)
    nc = 0
    next_cut = n
    for i in range(n):
        c = buf[i]
        if in_str:
            if esc:
                esc = False
            elif c == 92:  # backslash
                esc = True
            elif c == 34:  # closing quote
                in_str = False
                if depth == 1 and a < 0:
                    ln = i - str_start - 1
                    m = ln == key.shape[0]
                    if m:
                        for k in range(ln):
                            if buf[str_start + 1 + k] != key[k]:
                                m = False
                                break
                    key_match = m
            continue
        if c == 34:
            in_str = True
            str_start = i
            if depth == 1 and pending:
                pending = False
        elif c == 123 or c == 91:  # { [
            if c == 91 and depth == 1 and pending and a < 0:
                a = i
                next_cut = i + chunk_bytes
            pending = False
            depth += 1
        elif c == 125 or c == 93:  # } ]
            depth -= 1
            if c == 93 and depth == 1 and a >= 0 and b < 0:
                b = i
                next_cut = n
        elif c == 58:  # :
            if depth == 1:
                pending = key_match
                key_match = False
        elif c == 44:  # ,
            if depth == 1:
                key_match = False
                pending = False
            elif depth == 2 and a >= 0 and b < 0 and i >= next_cut:
                cuts[nc] = i
                nc += 1
                next_cut = i + chunk_bytes
    if in_str or depth != 0:
        return -1, -1, cuts[:0]
    return a, b, cuts[:nc]


def scan_json_array(buf: np.ndarray, key: bytes, chunk_bytes: int):
    """Locate the array under top-level ``key`` in a JSON object and cut it into pieces.

    Parameters
    ----------
    buf : uint8 (n,) the JSON text
    key : the top-level key (e.g. ``b"traceEvents"``)
    chunk_bytes : approximate piece size

    Returns
    -------
    start, end : int positions of the array's ``[`` and ``]`` (-1, -1 when not found or the
        text is not balanced — the caller then decodes the whole text and reports the error)
    cuts : int64 positions of top-level commas of the array where pieces end
    """
    return _scan_json_array(np.ascontiguousarray(buf, np.uint8),
                            np.frombuffer(key, np.uint8).copy(), int(chunk_bytes))


@njit(cache=True)
def _latest_done(op_corr, op_end, q_corr, q_t, by_end, by_corr, q_order):  # pragma: no cover
    # the stable sorts come in from numpy (by_end: ops by end ascending, ties by position
    # descending, so the first op wins a tie; by_corr; q_order): numba's merge sort would
    # add seconds to a fresh install's first compile
    n = op_corr.shape[0]
    rank = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    for r in range(n):
        rank[by_end[r]] = r
        ends[r] = op_end[by_end[r]]
    tree = np.full(n + 1, -1, np.int64)  # Fenwick tree of prefix maxima of inserted ranks
    out = np.full(q_corr.shape[0], -1, np.int64)
    j = 0
    for q in q_order:
        while j < n and op_corr[by_corr[j]] < q_corr[q]:
            r = rank[by_corr[j]]
            i = r + 1
            while i <= n:
                if tree[i] < r:
                    tree[i] = r
                i += i & -i
            j += 1
        k = np.searchsorted(ends, q_t[q], side="right")  # ranks 0..k-1 end by then
        best = -1
        i = k
        while i > 0:
            if tree[i] > best:
                best = tree[i]
            i -= i & -i
        if best >= 0:
            out[q] = by_end[best]
    return out


def latest_done(op_corr: np.ndarray, op_end: np.ndarray, q_corr: np.ndarray,
                q_t: np.ndarray) -> np.ndarray:
    """For each query ``q``: the position of the op that ends last among those with
    ``0 <= op_corr < q_corr[q]`` and ``op_end <= q_t[q]`` (the first such op on a tie), or -1.

    Offline in O((n + m) log n): queries by correlation, ops inserted into a Fenwick tree of
    prefix maxima over their end ranks.
    """
    ok = np.flatnonzero(np.asarray(op_corr) >= 0)
    c = np.ascontiguousarray(np.asarray(op_corr, np.int64)[ok])
    e = np.ascontiguousarray(np.asarray(op_end, np.int64)[ok])
    qc = np.ascontiguousarray(q_corr, np.int64)
    rev = np.arange(len(c) - 1, -1, -1, dtype=np.int64)
    by_end = rev[np.argsort(e[rev], kind="stable")]
    pos = _latest_done(c, e, qc, np.ascontiguousarray(q_t, np.int64),
                       np.ascontiguousarray(by_end, np.int64),
                       np.argsort(c, kind="stable").astype(np.int64),
                       np.argsort(qc, kind="stable").astype(np.int64))
    out = np.full(len(pos), -1, np.int64)
    out[pos >= 0] = ok[pos[pos >= 0]]
    return out


@njit(cache=True)
def _align(sa, ta, sb, tb, a_lo, a_hi, b_lo, b_hi, use_iv):  # pragma: no cover - compiled
    """Order-preserving alignment of two symbol sequences (longest common subsequence).

    Maximizes the number of matched pairs (``sa[i] == sb[j]`` and, with ``use_iv``, the
    intervals ``[a_lo[i], a_hi[i]]`` and ``[b_lo[j], b_hi[j]]`` overlap; each index used once, pairs
    in increasing ``i`` and ``j``); among alignments with as many pairs, the smallest sum of
    ``|ta[i] - tb[j]|`` over them (the time tie-break that picks the right period of a
    periodic sequence). O(n m) time and memory.

    Parameters
    ----------
    sa, sb : int64[n], int64[m]  symbols
    ta, tb : int64[n], int64[m]  times (ns) of the elements
    a_lo, a_hi, b_lo, b_hi : int64[n], int64[n], int64[m], int64[m]  the elements' time
        intervals (ns; read only with ``use_iv``)
    use_iv : bool  only elements whose intervals overlap may match

    Returns
    -------
    ia, ib : int64[k]  matched index pairs, increasing
    """
    n = sa.shape[0]
    m = sb.shape[0]
    cnt = np.zeros((n + 1, m + 1), np.int32)
    cost = np.zeros((n + 1, m + 1), np.int64)
    move = np.zeros((n + 1, m + 1), np.int8)  # 0 match, 1 skip a[i-1], 2 skip b[j-1]
    cap = np.int64(1) << 50
    for i in range(1, n + 1):
        move[i, 0] = 1
    for j in range(1, m + 1):
        move[0, j] = 2
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            bc = cnt[i - 1, j]
            bx = cost[i - 1, j]
            bm = 1
            c2 = cnt[i, j - 1]
            x2 = cost[i, j - 1]
            if c2 > bc or (c2 == bc and x2 < bx):
                bc = c2
                bx = x2
                bm = 2
            ok = sa[i - 1] == sb[j - 1]
            if ok and use_iv:
                lo = a_lo[i - 1] if a_lo[i - 1] > b_lo[j - 1] else b_lo[j - 1]
                hi = a_hi[i - 1] if a_hi[i - 1] < b_hi[j - 1] else b_hi[j - 1]
                ok = lo <= hi
            if ok:
                d = ta[i - 1] - tb[j - 1]
                if d < 0:
                    d = -d
                if d > cap:
                    d = cap
                c3 = cnt[i - 1, j - 1] + 1
                x3 = cost[i - 1, j - 1] + d
                if c3 > bc or (c3 == bc and x3 < bx):
                    bc = c3
                    bx = x3
                    bm = 0
            cnt[i, j] = bc
            cost[i, j] = bx
            move[i, j] = bm
    k = cnt[n, m]
    ia = np.empty(k, np.int64)
    ib = np.empty(k, np.int64)
    i = n
    j = m
    while i > 0 or j > 0:
        mv = move[i, j]
        if mv == 0:
            k -= 1
            ia[k] = i - 1
            ib[k] = j - 1
            i -= 1
            j -= 1
        elif mv == 1:
            i -= 1
        else:
            j -= 1
    return ia, ib


#: the largest alignment table (cells) :func:`align_sequences` builds
ALIGN_MAX_CELLS = 40_000_000


def align_sequences(sa: np.ndarray, ta: np.ndarray, sb: np.ndarray, tb: np.ndarray,
                    a_iv: tuple[np.ndarray, np.ndarray] | None = None,
                    b_iv: tuple[np.ndarray, np.ndarray] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """Matched index pairs of the order-preserving alignment of ``sa`` and ``sb`` (see
    :func:`_align`; with ``a_iv``/``b_iv``, (start, end) per element, only elements whose
    intervals overlap match); None when the table would exceed :data:`ALIGN_MAX_CELLS`
    cells."""
    if (len(sa) + 1) * (len(sb) + 1) > ALIGN_MAX_CELLS:
        return None
    i64 = np.int64
    use = a_iv is not None and b_iv is not None
    z = np.zeros(0, i64)
    al, ah = (a_iv if use else (z, z))
    bl, bh = (b_iv if use else (z, z))
    c = np.ascontiguousarray
    return _align(c(sa, i64), c(ta, i64), c(sb, i64), c(tb, i64), c(al, i64), c(ah, i64),
                  c(bl, i64), c(bh, i64), use)


@njit(cache=True)
def _kahn_done(n_nodes, src, dst):  # pragma: no cover - compiled
    """Nodes Kahn's algorithm orders in the directed graph ``src -> dst`` (int64 arrays of
    node ids < n_nodes): a bool per node, False for nodes on or behind a cycle."""
    indeg = np.zeros(n_nodes, np.int64)
    for k in range(src.shape[0]):
        indeg[dst[k]] += 1
    ptr = np.zeros(n_nodes + 1, np.int64)
    for k in range(src.shape[0]):
        ptr[src[k] + 1] += 1
    for v in range(n_nodes):
        ptr[v + 1] += ptr[v]
    fill = ptr[:-1].copy()
    succ = np.empty(src.shape[0], np.int64)
    for k in range(src.shape[0]):
        succ[fill[src[k]]] = dst[k]
        fill[src[k]] += 1
    stack = np.empty(n_nodes, np.int64)
    top = 0
    for v in range(n_nodes):
        if indeg[v] == 0:
            stack[top] = v
            top += 1
    done = np.zeros(n_nodes, np.bool_)
    while top > 0:
        top -= 1
        v = stack[top]
        done[v] = True
        for k in range(ptr[v], ptr[v + 1]):
            w = succ[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                stack[top] = w
                top += 1
    return done


def acyclic_nodes(n_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Bool per node: ordered by a topological sort of ``src -> dst`` (False: on a cycle or
    reachable only through one)."""
    return _kahn_done(int(n_nodes), np.ascontiguousarray(src, np.int64),
                      np.ascontiguousarray(dst, np.int64))


watch_compiles()  # say so on stderr when these kernels compile on first use
