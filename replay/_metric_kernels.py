"""numba kernels of the sweep's row metrics (split from :mod:`replay._kernels`): per rank,
the replayed span and the union lengths of its device and compute intervals."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from retime.collectors.progress import watch_compiles

_NEG = np.int64(-(2**62))  # "minus infinity" (as in replay._kernels)


@njit(cache=True)
def _metric_spans(s, e, dev, dev_ptr, dev_compute, other, ridx, lo, hi, both, x, has_x,
                  buf_a, buf_b, buf_c):
    """Per rank (dense index): first start ``lo`` and last end ``hi`` of all its ops, and the
    union lengths of its device ops' intervals (``both``) and of its compute ops' (``x``;
    ``has_x`` marks ranks with compute), in one pass.

    ``dev`` holds the device ops by rank (rank ``r``'s in ``dev[dev_ptr[r]:dev_ptr[r + 1]]``,
    by measured start); ``s``/``e`` are the replayed times (``dev``, ``other`` and ``ridx``
    index them). Each rank's block is gathered into the scratch buffers (``buf_*``, at least
    the largest block long) and reduced by :func:`_block_unions`.
    ``lo``/``hi``/``both``/``x``/``has_x`` come filled with their neutral values."""
    for k in range(other.shape[0]):
        i = other[k]
        r = ridx[i]
        if s[i] < lo[r]:
            lo[r] = s[i]
        if e[i] > hi[r]:
            hi[r] = e[i]
    for r in range(dev_ptr.shape[0] - 1):
        k0 = dev_ptr[r]
        m = dev_ptr[r + 1] - k0
        if m == 0:
            continue
        l0 = lo[r]
        h0 = hi[r]
        for j in range(m):
            i = dev[k0 + j]
            a = s[i]
            b = e[i]
            buf_a[j] = a
            buf_b[j] = b
            buf_c[j] = dev_compute[k0 + j]
            if a < l0:
                l0 = a
            if b > h0:
                h0 = b
        lo[r] = l0
        hi[r] = h0
        tot, tot_x, any_x, _ = _block_unions(buf_a[:m], buf_b[:m], buf_c[:m])
        if any_x:
            has_x[r] = True
        both[r] += tot
        x[r] += tot_x


@njit(cache=True, nogil=True)
def _metric_spans_layout(start, end, base, slot, kind, ridx, dev_ptr, lo, hi, both, x, has_x,
                         buf_a, buf_b, buf_c):
    """:func:`_metric_spans` on a replay's per-position results, in one sequential pass over
    them (no gather from scattered positions): ``start``/``end`` as the kernels leave them
    (int64 ns, or the contention path's floats relative to ``base``, rounded here as
    :func:`replay._kernels._to_op_order` rounds them). ``slot`` per position: where a device
    op goes in ``buf_*`` (rank ``r``'s block ``dev_ptr[r]:dev_ptr[r + 1]``, its ops in
    layout order), ``-1`` for the others; ``kind``: 2 for device compute; ``ridx``: the
    position's dense rank. Each block is then reduced by :func:`_block_unions` (the union
    lengths do not depend on the order the ops come in)."""
    for k in range(start.shape[0]):
        a = _ns(start[k], base)
        b = _ns(end[k], base)
        j = slot[k]
        if j >= 0:
            buf_a[j] = a
            buf_b[j] = b
            buf_c[j] = kind[k] == 2
        else:
            r = ridx[k]
            lo[r] = min(lo[r], a)
            hi[r] = max(hi[r], b)
    for r in range(dev_ptr.shape[0] - 1):
        k0 = dev_ptr[r]
        k1 = dev_ptr[r + 1]
        if k1 == k0:
            continue
        tot, tot_x, any_x, b_max = _block_unions(buf_a[k0:k1], buf_b[k0:k1], buf_c[k0:k1])
        lo[r] = min(lo[r], buf_a[k0])  # sorted: the block's first start
        hi[r] = max(hi[r], b_max)
        if any_x:
            has_x[r] = True
        both[r] += tot
        x[r] += tot_x


@njit(cache=True)
def _block_slots(kind, ridx, dev_ptr, slot):
    """``slot`` per layout position for :func:`_metric_spans_layout`: the device ops of rank
    ``r`` numbered from ``dev_ptr[r]`` in layout order, ``-1`` for the other ops."""
    fill = dev_ptr[:-1].copy()
    for k in range(kind.shape[0]):
        if kind[k] != 0:
            r = ridx[k]
            slot[k] = fill[r]
            fill[r] += 1
        else:
            slot[k] = -1


@njit(cache=True)
def _group_spans(code, start, end, lo, hi):
    """Per dense code (rank): first start ``lo`` and last end ``hi`` (filled with neutral
    values by the caller)."""
    for i in range(code.shape[0]):
        c = code[i]
        lo[c] = min(lo[c], start[i])
        hi[c] = max(hi[c], end[i])


def _ns(v, base):  # pragma: no cover - replaced by the overload below inside kernels
    return v


@overload(_ns, inline="always")
def _ns_overload(v, base):
    """A replayed time as int64 ns: floats (relative to ``base``) rounded half to even."""
    if isinstance(v, types.Float):
        return lambda v, base: np.int64(np.rint(v)) + base
    return lambda v, base: np.int64(v) + base


@njit(cache=True)
def _block_unions(buf_a, buf_b, buf_c):
    """Sort one rank's device ops (``buf_a`` starts, ``buf_b`` ends, ``buf_c`` compute flags)
    by start in place and return the union lengths of all their intervals and of the
    compute ones, whether there was compute, and the last end. Insertion sort, as a replay keeps nearly
    every op's place (a merge sort once the moves exceed a budget); then one running
    maximum of the ends gives the union length of start-sorted intervals (which ties' order
    does not change)."""
    m = buf_a.shape[0]
    budget = 32 * m + 4096
    moves = 0
    far = False
    for j in range(1, m):  # a sorted block costs one comparison per op
        a = buf_a[j]
        if a >= buf_a[j - 1]:
            continue
        b = buf_b[j]
        c = buf_c[j]
        t = j
        while t > 0 and buf_a[t - 1] > a:
            buf_a[t] = buf_a[t - 1]
            buf_b[t] = buf_b[t - 1]
            buf_c[t] = buf_c[t - 1]
            t -= 1
        buf_a[t] = a
        buf_b[t] = b
        buf_c[t] = c
        moves += j - t
        if moves > budget:  # far from sorted: sort the (permuted) block outright
            far = True
            break
    if far:
        idx = np.argsort(buf_a, kind="mergesort")
        ta = buf_a.copy()
        tb = buf_b.copy()
        tc = buf_c.copy()
        for j in range(m):
            buf_a[j] = ta[idx[j]]
            buf_b[j] = tb[idx[j]]
            buf_c[j] = tc[idx[j]]
    # branch-free: compute and communication ops interleave unpredictably
    run = buf_a[0]
    run_x = _NEG  # no compute op yet: the first one adds its whole length
    tot = np.int64(0)
    tot_x = np.int64(0)
    any_x = False
    b_max = _NEG
    for j in range(m):
        a = buf_a[j]
        b = buf_b[j]
        b_max = max(b_max, b)
        p = max(a, run)
        tot += max(b - p, 0)
        run = max(run, b)
        cx = buf_c[j]
        bx = b if cx else _NEG
        px = max(a, run_x)
        tot_x += max(bx - px, 0)
        run_x = max(run_x, bx)
        any_x |= cx
    return tot, tot_x, any_x, b_max

watch_compiles()  # say so on stderr when these kernels compile on first use
