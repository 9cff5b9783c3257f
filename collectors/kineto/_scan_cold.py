"""Cold kernels of the streaming Kineto reader (collectors/kineto/scan.py): finding the
``traceEvents`` array and growing an intern table. The hot scanner is in
collectors/kineto/_scan_kernels.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..progress import watch_compiles
from ._scan_lex import _skip, _str_skip, _ws
from ._scan_mem import addr

__all__ = ["find_array", "rehash"]


def rehash(hs, ids, nh, ni) -> None:
    """Insert the strings of table slots ``hs``/``ids`` into the empty slots ``nh``/``ni``."""
    _rehash(hs, ids, nh, ni)


@njit(cache=True)
def _rehash(hs, ids, nh, ni):  # pragma: no cover - compiled
    mask = nh.shape[0] - 1
    for s in range(hs.shape[0]):
        if ids[s] >= 0:
            i = (hs[s] ^ (hs[s] >> 29)) & mask
            while ni[i] >= 0:
                i = (i + 1) & mask
            nh[i] = hs[s]
            ni[i] = ids[s]


@njit(cache=True)
def _find_array(buf, key):  # pragma: no cover - compiled
    n = buf.shape[0]
    b = addr(buf)
    i = _ws(b, 0, n)
    if i >= n:
        return -1
    if buf[i] == 91:
        return i
    if buf[i] != 123:
        return -2
    i = _ws(b, i + 1, n)
    while True:
        if i >= n:
            return -1
        if buf[i] != 34:
            return -2
        ke, esc = _str_skip(b, i, n)
        if ke < 0:
            return ke
        match = not esc and ke - i - 2 == key.shape[0]
        if match:
            for k in range(key.shape[0]):
                if buf[i + 1 + k] != key[k]:
                    match = False
                    break
        i = _ws(b, ke, n)
        if i >= n:
            return -1
        if buf[i] != 58:
            return -2
        i = _ws(b, i + 1, n)
        if i >= n:
            return -1
        if match and buf[i] == 91:
            return i
        e = _skip(b, i, n)
        if e < 0:
            return e
        i = _ws(b, e, n)
        if i >= n:
            return -1
        if buf[i] != 44:
            return -2
        i = _ws(b, i + 1, n)


def find_array(buf: np.ndarray, key: bytes) -> int:
    """Position of the ``[`` of the array under top-level ``key`` (or of a top-level array).

    -1: the text ends first (read more); -2: there is no such array or the text is invalid.
    """
    return int(_find_array(np.ascontiguousarray(buf), np.frombuffer(key, np.uint8).copy()))

watch_compiles()  # say so on stderr when these kernels compile on first use
