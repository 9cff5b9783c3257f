"""Array primitives of the replay graph's build (split from :mod:`replay.graph`): dense
codes of small-range integers, lexsort by a small major key, and edges in CSR by target,
each avoiding a general sort where the values span a small range (ranks, lanes, devices)."""

from __future__ import annotations

import numpy as np

from retime.collectors.arrays import unique

from ._kernels import _csr_by_dst, _dense_codes, _group_order

__all__ = ["_csr", "_dense_inverse", "_lexsort_small"]

_I64 = np.int64
_I32 = np.int32


def _dense_inverse(x: np.ndarray) -> tuple[int, np.ndarray]:
    """``len(u), inv`` of ``u, inv = unique(x, return_inverse=True)`` (``inv`` int64),
    without sorting when the values span a small range (ranks, devices)."""
    x = np.asarray(x)
    if len(x) == 0:
        return 0, np.zeros(0, _I64)
    lo, hi = int(x.min()), int(x.max())
    if hi - lo >= 4 * len(x) + 65536:
        u, inv = unique(x, return_inverse=True)
        return len(u), inv.astype(_I64, copy=False)
    if x.dtype.kind not in "iu" or x.dtype == np.uint64:
        u, inv = unique(x, return_inverse=True)
        return len(u), inv.astype(_I64, copy=False)
    k, inv = _dense_codes(np.ascontiguousarray(x), lo, hi - lo + 1)
    return int(k), inv


def _lexsort_small(keys: tuple) -> np.ndarray:
    """``np.lexsort(keys)`` (int64 order) when the last (major) key holds small integers
    (lanes, ranks): a counting sort plus per-group sorts (:func:`_group_order`)."""
    minor, major = keys
    major = np.asarray(major)
    n = len(major)
    if n == 0:
        return np.zeros(0, _I64)
    lo, hi = int(major.min()), int(major.max())
    if hi - lo >= 4 * n + 65536 or major.dtype.kind not in "iu":
        return np.lexsort(keys)
    return _group_order(np.ascontiguousarray(major, _I64), lo, hi - lo + 1,
                        np.ascontiguousarray(minor))


def _csr(n, dst, src, lag, kind, s2s, keep=None, pos=None):
    """CSR by ``dst``, edges of one dst sorted by src (then input order); ``keep`` masks
    edges, ``pos`` maps op ids to layout positions first (:func:`._kernels._csr_by_dst`).

    One specialization of the kernel: ids as int32 (graphs hold at most ``2**30`` ops), so
    a cold run compiles it once whichever caller comes first."""
    m = len(dst)
    return _csr_by_dst(int(n), np.ascontiguousarray(dst, _I32), np.ascontiguousarray(src, _I32),
                       np.ones(m, bool) if keep is None else np.ascontiguousarray(keep, bool),
                       np.ascontiguousarray(lag, _I64), np.ascontiguousarray(kind, np.int8),
                       np.ascontiguousarray(s2s, bool),
                       np.zeros(0, _I32) if pos is None else np.ascontiguousarray(pos, _I32))
