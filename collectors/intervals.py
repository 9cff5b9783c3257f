"""Interval helpers shared by the readers and the what-if policies."""

from __future__ import annotations

import numpy as np

__all__ = ["interval_union"]


def interval_union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Union of the intervals ``[starts[i], ends[i])``.

    Parameters
    ----------
    starts, ends : array-like of int
        Interval bounds (ns), any order; touching intervals merge.

    Returns
    -------
    (np.ndarray, np.ndarray)
        Sorted, disjoint int64 starts and ends.
    """
    s = np.asarray(starts, np.int64)
    e = np.asarray(ends, np.int64)
    if len(s) == 0:
        return s.copy(), e.copy()
    o = np.argsort(s, kind="stable")
    s, reach = s[o], np.maximum.accumulate(e[o])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    last = np.append(np.flatnonzero(new)[1:] - 1, len(s) - 1)
    return s[new], reach[last]
