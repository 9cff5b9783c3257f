"""numba event queues of the contention path (:mod:`replay._fluid`): the start heap and the
running jobs' queue (a sorted list or a binary heap).

Split from :mod:`replay._fluid_jobs` (job slots and resource sharing). After editing this module
touch ``replay/_fluid.py``: numba keys the kernel's on-disk cache by that file alone, and the
compiled code of these helpers is inside it.
"""

from __future__ import annotations

from numba import njit

from retime.collectors.progress import watch_compiles

__all__: list[str] = []

# the job-slot column (``si``, replay._fluid_jobs) holding a running slot's heap position
_I_POS = 2


# ---------------------------------------------------------------------------- start heap
# (time float64, sequence int64, op int64) stored inline, ordered by (time, sequence)
@njit(cache=True, inline="always")
def _spush(ht, hq, hi, size, t, q, x):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if t < ht[p] or (t == ht[p] and q < hq[p]):
            ht[i] = ht[p]
            hq[i] = hq[p]
            hi[i] = hi[p]
            i = p
        else:
            break
    ht[i] = t
    hq[i] = q
    hi[i] = x
    return size + 1


# ---------------------------------------------------------------------------- job queue
# The running jobs ordered by event key (time, sequence), in one of two forms (the kernel's
# ``hmode``):
# * a list sorted in decreasing order, the next event last: times ``jt`` and slots ``js``.
#   A key's sequence number is the newest when it is inserted (every key is made then), so
#   the list's order among equal times is the sequence order and only times are compared.
#   A new key is placed by a scan from the end: on the benchmark trace (~20 running jobs,
#   at most 35) a new end lands behind ~10 of them, and these few moves beat a binary
#   heap's sifts, which mispredict at most levels (kernel ~105 -> ~88 ns per op). Its cost
#   grows with the number of running jobs, and a rate change finds its slot by a scan.
# * a binary heap (``jt``, ``jq`` the sequence numbers, ``js``), si[s, _I_POS] slot s's
#   position: from the start when rates are shared (every flow start/end re-keys all
#   flows), and once more than ``_LMAX`` jobs run (:func:`_jto_heap`).
# The inlined helpers that take arrays are only called from helpers compiled without
# reference counting: numba would refcount the arrays at every inlined call (~30% of the
# run time); the event loop has them written out.
_LMAX = 64


@njit(cache=True, inline="always")
def _jsift(jt, jq, js, si, size, i):
    """Restore the heap around position ``i`` (its key changed)."""
    tx = jt[i]
    qx = jq[i]
    x = js[i]
    moved = False
    while i > 0:  # up
        p = (i - 1) >> 1
        ty = jt[p]
        if tx < ty or (tx == ty and qx < jq[p]):
            jt[i] = ty
            jq[i] = jq[p]
            y = js[p]
            js[i] = y
            si[y, _I_POS] = i
            i = p
            moved = True
        else:
            break
    if not moved:
        while True:  # down
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and (jt[c + 1] < jt[c] or (jt[c + 1] == jt[c]
                                                        and jq[c + 1] < jq[c])):
                c += 1
            ty = jt[c]
            if ty < tx or (ty == tx and jq[c] < qx):
                jt[i] = ty
                jq[i] = jq[c]
                y = js[c]
                js[i] = y
                si[y, _I_POS] = i
                i = c
            else:
                break
    jt[i] = tx
    jq[i] = qx
    js[i] = x
    si[x, _I_POS] = i


@njit(cache=True, _nrt=False)
def _jto_heap(jt, jq, js, si, size, seq):
    """Turn the sorted list into the heap: reversed, it is in increasing order, which is a
    heap; the sequence numbers keep the list's order below ``seq`` (later keys get larger
    ones)."""
    for a in range(size // 2):
        b = size - 1 - a
        t = jt[a]
        jt[a] = jt[b]
        jt[b] = t
        x = js[a]
        js[a] = js[b]
        js[b] = x
    for a in range(size):
        jq[a] = seq - size + a
        si[js[a], _I_POS] = a


@njit(cache=True, inline="always")
def _jkey(jt, jq, js, si, size, hmode, s, t, q):
    """Give running slot ``s`` the key ``(t, q)`` (``q`` the newest sequence number) in
    either form of the queue."""
    if hmode:
        h = si[s, _I_POS]
        jt[h] = t
        jq[h] = q
        _jsift(jt, jq, js, si, size, h)
    else:
        _jrekey(jt, js, size, s, t)


@njit(cache=True, inline="always")
def _jins(jt, js, size, t, s):
    """Insert slot ``s`` with event time ``t`` (and the newest sequence number) into
    ``jt/js[:size]``: before every entry of time ``t``. Returns the new size."""
    j = size
    while j > 0 and jt[j - 1] <= t:
        jt[j] = jt[j - 1]
        js[j] = js[j - 1]
        j -= 1
    jt[j] = t
    js[j] = s
    return size + 1


@njit(cache=True, inline="always")
def _jrekey(jt, js, size, s, t):
    """Give running slot ``s`` the event time ``t`` (and the newest sequence number): find
    it, close its gap, re-insert."""
    p = size - 1
    while js[p] != s:
        p -= 1
    for i in range(p, size - 1):
        jt[i] = jt[i + 1]
        js[i] = js[i + 1]
    _jins(jt, js, size - 1, t, s)

watch_compiles()  # say so on stderr when these kernels compile on first use
