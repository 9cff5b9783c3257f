"""JSON lexing and string interning for the streaming Kineto reader's kernels
(collectors/kineto/_scan_kernels.py): whitespace, strings, numbers and nested values
skipped or parsed in place, eight bytes at a time where it pays (SWAR), and the intern
table that gives each distinct name or category one id.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from ..progress import watch_compiles
from ._scan_mem import addr, ld8, ldb, ldq, stb, stq, utf8_len

__all__ = ["intern", "hash_of"]


def _u64(s: bytes) -> np.uint64:
    """Up to 8 bytes as the little-endian word an 8-byte load reads."""
    return np.uint64(int.from_bytes(s, "little"))


def _mask(k: int) -> np.uint64:
    return np.uint64((1 << (8 * k)) - 1)


_CC = np.zeros(256, np.uint8)  # byte classes: 1 space, 2 string special, 4 structural, 8 ends a number
for _c in b" \n\r\t":
    _CC[_c] |= 1 | 8
for _c in b",]}":
    _CC[_c] |= 8
for _c in b'"{}[]':
    _CC[_c] |= 4
_CC[34] |= 2
_CC[92] |= 2
_CC[128:] |= 2

_LO8, _HI8 = _u64(b"\x01" * 8), _u64(b"\x80" * 8)
_QQ8, _BS8 = _u64(b'"' * 8), _u64(b"\\" * 8)
_Z64, _U1, _U3, _U8, _U29, _U32 = (np.uint64(x) for x in (0, 1, 3, 8, 29, 32))
_FF = np.uint64(255)
# eight ASCII digits at a time: a byte is a digit when its high nibble is 3 and +6 keeps it 3
_F08, _068, _308 = _u64(b"\xf0" * 8), _u64(b"\x06" * 8), _u64(b"0" * 8)
_338 = _u64(b"3" * 8)  # (w & 0xf0..) | ((w + 0x06..) & 0xf0..) >> 4 for all digits: 0x33..
_U4, _U10, _U16 = np.uint64(4), np.uint64(10), np.uint64(16)
_LANE2 = np.uint64(0x000000FF000000FF)
_MUL_A, _MUL_B = np.uint64(100 + (1000000 << 32)), np.uint64(1 + (10000 << 32))
_M2, _M4, _M5, _M6, _M7 = _mask(2), _mask(4), _mask(5), _mask(6), _mask(7)
_HSEED, _HMUL, _HMUL2 = (np.uint64(x) for x in (0xCBF29CE484222325, 0x9E3779B97F4A7C15,
                                                0xFF51AFD7ED558CCD))


@njit(cache=True)
def _ws(b, i, n):  # pragma: no cover - compiled
    while i < n:
        c = ldb(b + i)
        if c > 32 or (c != 32 and c != 10 and c != 13 and c != 9):
            return i
        i += 1
    return i


@njit(cache=True)
def _word(b, i, n):  # pragma: no cover - compiled
    """The 8 bytes at ``i`` as a word; past ``n`` they read as zero bytes."""
    if i + 8 <= n:
        return ld8(b + i)
    w = _Z64
    for k in range(max(n - i, 0)):
        w |= np.uint64(ldb(b + i + k)) << (np.uint64(k) * _U8)
    return w


@njit(cache=True)
def _special(b, i, n):  # pragma: no cover - compiled
    """Offset of the first '"', '\\' or byte >= 0x80 at or after ``i`` (``n`` if none)."""
    while i + 8 <= n:
        w = ld8(b + i)
        q = w ^ _QQ8
        s = w ^ _BS8
        m = (((q - _LO8) & ~q) | ((s - _LO8) & ~s) | w) & _HI8
        if m != _Z64:
            return i + np.int64(trailing_zeros(m) >> _U3)
        i += 8
    while i < n:
        c = ldb(b + i)
        if c == 34 or c == 92 or c >= 128:
            return i
        i += 1
    return n


@njit(cache=True)
def _str_skip(b, i, n):  # pragma: no cover - compiled
    """``i`` at an opening quote -> (offset after the closing quote, escaped?); -1 when the
    buffer ends first, -2 on invalid UTF-8."""
    esc = False
    i += 1
    while True:
        i = _special(b, i, n)
        if i >= n:
            return -1, esc
        c = ldb(b + i)
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = True
            i += 2
            continue
        m = utf8_len(b, i, n)
        if m < 0:
            return m, esc
        i += m


@njit(cache=True)
def _skip_nested(b, i, n):  # pragma: no cover - compiled
    """Offset after the object or array at ``i``; -1 when the buffer ends first, -2 when invalid."""
    stack = np.int64(0)  # bit per level: 1 object, 0 array
    depth = 0
    while i < n:
        c = ldb(b + i)
        if (_CC[c] & 4) == 0:
            i += 1
            continue
        if c == 34:
            e, _ = _str_skip(b, i, n)
            if e < 0:
                return e
            i = e
            continue
        if c == 123 or c == 91:
            if depth >= 62:
                return -2
            stack = (stack << 1) | (1 if c == 123 else 0)
            depth += 1
        else:
            if depth == 0 or (stack & 1) != (1 if c == 125 else 0):
                return -2
            stack >>= 1
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


@njit(cache=True)
def _skip(b, i, n):  # pragma: no cover - compiled
    """Offset after the JSON value at ``i``; -1 when the buffer ends first, -2 when invalid."""
    c = ldb(b + i)
    if c == 34:
        e, _ = _str_skip(b, i, n)
        return e
    if c == 123 or c == 91:
        return _skip_nested(b, i, n)
    if not (c == 45 or 48 <= c <= 57 or c == 116 or c == 102 or c == 110):
        return -2
    while i < n:
        if _CC[ldb(b + i)] & 8:
            return i
        i += 1
    return -1


@njit(cache=True)
def _int(b, i, n):  # pragma: no cover - compiled
    """A JSON integer at ``i`` -> (value, end, ok); ok is False for floats, null, strings."""
    neg = False
    j = i
    if j < n and ldb(b + j) == 45:
        neg = True
        j += 1
    v = np.int64(0)
    d0 = j
    while j < n:
        d = ldb(b + j) - 48
        if d < 0 or d > 9:
            break
        v = v * 10 + d
        j += 1
    nd = j - d0
    if nd == 0 or nd > 18 or j >= n:
        return v, j, False
    c = ldb(b + j)
    if c == 46 or c == 101 or c == 69:
        return v, j, False
    return (-v if neg else v), j, True


@njit(cache=True)
def _digits8(t):  # pragma: no cover - compiled
    """The number written by the 8 digit values (0..9, first digit in the low byte) of ``t``."""
    t = (t * _U10) + (t >> _U8)
    t = (((t & _LANE2) * _MUL_A) + (((t >> _U16) & _LANE2) * _MUL_B)) >> _U32
    return np.int64(t)


@njit(cache=True)
def _ns(b, i, n):  # pragma: no cover - compiled
    """A non-negative JSON number of microseconds at ``i`` -> (integer ns, end, ok), exact:
    three decimals are ns, the fourth rounds (half up). Negative or exponent: not ok."""
    j = i
    v = np.int64(0)
    while j + 8 <= n and j - i < 16:  # eight digits at a time (timestamps have 16)
        w = ld8(b + j)
        if ((w & _F08) | ((w + _068) & _F08) >> _U4) != _338:
            break
        v = v * 100_000_000 + _digits8(w - _308)
        j += 8
    while j < n:
        d = ldb(b + j) - 48
        if d < 0 or d > 9:
            break
        v = v * 10 + d
        j += 1
    if j == i or j - i > 16 or v > 9_000_000_000_000_000 or j >= n:
        return v, j, False
    v *= 1000
    if ldb(b + j) == 46:
        j += 1
        f0 = j
        scale = 100
        while j < n:
            d = ldb(b + j) - 48
            if d < 0 or d > 9:
                break
            k = j - f0
            if k < 3:
                v += d * scale
                scale //= 10
            elif k == 3 and d >= 5:
                v += 1
            j += 1
        if j == f0 or j >= n:
            return v, j, False
    c = ldb(b + j)
    if c == 101 or c == 69:
        return v, j, False
    return v, j, True



# (hashes, ids, pool, offsets, lengths, meta): open addressing on the 64-bit hash of the raw
# bytes (ids -1: empty slot); a string's bytes are kept in ``pool`` at ``offsets[id]``;
# meta = [strings, pool bytes used, most strings before growing]. A slot matches only when
# hash, length and every byte agree: a hash collision costs a probe, never a wrong id.


@njit(cache=True)
def _table_at(t):  # pragma: no cover - compiled
    """An intern table as (addresses of its six arrays..., slot mask)."""
    return (addr(t[0]), addr(t[1]), addr(t[2]), addr(t[3]), addr(t[4]), addr(t[5]),
            t[0].shape[0] - 1)


@njit(cache=True)
def _hash(b, s, e, n):  # pragma: no cover - compiled
    """64-bit hash of the raw bytes at ``s:e`` (``e <= n``), eight at a time."""
    h = _HSEED
    while s + 8 <= e:
        h = (h ^ ld8(b + s)) * _HMUL
        s += 8
    if s < e:
        w = _word(b, s, n) & ((_U1 << (np.uint64(e - s) * _U8)) - _U1)
        h = (h ^ w) * _HMUL
    h ^= h >> _U32
    h *= _HMUL2
    h ^= h >> _U29
    return np.int64(h)


@njit(cache=True)
def _intern_at(ta, b, s, e, h):  # pragma: no cover - compiled
    """Id of the string at ``s:e`` of the text at ``b`` (hash ``h``) in the intern table
    whose addresses are ``ta`` (see _table_at); added if new."""
    hs, ids, pool, off, ln, meta, mask = ta
    m = e - s
    i = (h ^ (h >> 29)) & mask
    while True:
        d = ldq(ids + 8 * i)
        if d < 0:
            d = ldq(meta)
            stq(hs + 8 * i, h)
            stq(ids + 8 * i, d)
            p = ldq(meta + 8)
            stq(off + 8 * d, p)
            stq(ln + 8 * d, m)
            for k in range(m):
                stb(pool + p + k, ldb(b + s + k))
            stq(meta, d + 1)
            stq(meta + 8, p + m)
            return d
        if ldq(hs + 8 * i) == h and ldq(ln + 8 * d) == m:
            p = pool + ldq(off + 8 * d)
            same = True
            k = 0
            while k + 8 <= m:
                if ld8(p + k) != ld8(b + s + k):
                    same = False
                    break
                k += 8
            while same and k < m:
                if ldb(p + k) != ldb(b + s + k):
                    same = False
                k += 1
            if same:
                return d
        i = (i + 1) & mask


@njit(cache=True)
def _hash_of(buf, s, e):  # pragma: no cover - compiled
    """The intern hash of ``buf[s:e]`` (for tests)."""
    return _hash(addr(buf), s, e, buf.shape[0])


@njit(cache=True)
def _intern(t, buf, s, e, h):  # pragma: no cover - compiled
    """Id of the string ``buf[s:e]`` (hash ``h``) in the intern table ``t``; added if new."""
    return _intern_at(_table_at(t), addr(buf), s, e, h)



intern = _intern
hash_of = _hash_of

watch_compiles()  # say so on stderr when these kernels compile on first use
