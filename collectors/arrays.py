"""``unique`` and ``isin`` for the large integer arrays of a trace.

numpy 2.3+ answers ``np.unique(x)`` (no ``return_*``) from a hash table and ``np.isin`` with a
large second argument from ``np.unique`` too; on millions of mostly distinct int64 keys
(``rank << 40 | correlation``, op ids) that hash path is 10-100x slower than sorting:
np.unique of 3 M keys 3.5 s against 0.04 s, np.isin of 10 M in 3 M 6.2 s against 0.5 s
(measured on this project's 2-core machine, numpy 2.4). These give numpy's results:
``unique`` sorts (integers and booleans; anything else, and any extra argument, goes to
numpy), ``isin`` asks pandas' hash table when the second array is large.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["unique", "isin"]


def unique(x: Any, **kw: Any) -> Any:
    """``np.unique(x, **kw)``: sorted distinct values of a 1-D integer or boolean array by one
    sort, and with ``return_inverse`` / ``return_counts`` by ``pd.factorize(sort=True)``
    (6-30x faster than numpy's sort of every element on 10 M keys); anything else by numpy."""
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype.kind not in "iub" or set(kw) - {"return_inverse",
                                                              "return_counts"}:
        return np.unique(x, **kw)
    if a.dtype.kind in "iu" and len(a):
        lo, hi = int(a.min()), int(a.max())
        if hi - lo <= len(a) + (1 << 16):  # few distinct values in a small range (ranks,
            return _unique_dense(a, lo, hi - lo + 1, kw)  # steps, kinds): one count, no sort
    if kw.get("return_inverse") or kw.get("return_counts"):
        import pandas as pd

        codes, u = pd.factorize(a, sort=True)  # a hash table, then the few uniques sorted
        u = np.asarray(u, dtype=a.dtype)
        out = [u]
        if kw.get("return_inverse"):
            out.append(codes.astype(np.intp, copy=False))
        if kw.get("return_counts"):
            out.append(np.bincount(codes, minlength=len(u)).astype(np.intp))
        return tuple(out) if len(out) > 1 else u
    if len(a) == 0:
        return a.copy()
    s = np.sort(a)
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def _unique_dense(a: np.ndarray, lo: int, span: int, kw: dict[str, Any]) -> Any:
    """:func:`unique` of integers within ``[lo, lo + span)`` by counting each value (numpy's
    results: sorted values, ``intp`` inverse and counts)."""
    off = a.astype(np.intp) - lo if lo else a.astype(np.intp, copy=False)
    c = np.bincount(off, minlength=span)
    present = c > 0
    u = (np.flatnonzero(present) + lo).astype(a.dtype)
    out = [u]
    if kw.get("return_inverse"):
        lut = np.cumsum(present, dtype=np.intp) - 1
        out.append(lut[off])
    if kw.get("return_counts"):
        out.append(c[present].astype(np.intp))
    return tuple(out) if len(out) > 1 else u


def isin(a: Any, b: Any, **kw: Any) -> np.ndarray:
    """``np.isin(a, b, **kw)``: with a large integer ``b``, by a hash table (pandas)."""
    x = np.asarray(a)
    y = np.asarray(b)
    if kw or x.ndim != 1 or y.ndim != 1 or x.dtype.kind not in "iub" or \
            y.dtype.kind not in "iub" or len(y) < 64:
        return np.isin(a, b, **kw)
    import pandas as pd

    return np.asarray(pd.Series(x, copy=False).isin(y), dtype=bool)
