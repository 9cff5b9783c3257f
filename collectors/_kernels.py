"""numba kernels of the collectors (arrays in, arrays out; see CONVENTIONS.md §1)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["nest_intervals"]


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
