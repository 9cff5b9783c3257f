"""numba kernels of the collectors (arrays in, arrays out; see CONVENTIONS.md §1)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["nest_intervals", "scan_json_array"]


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
