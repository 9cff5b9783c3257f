"""numba kernels of the streaming Kineto reader (collectors/kineto_fast.py).

Arrays in, arrays out (CONVENTIONS.md §1): the JSON text of a block is a uint8 array, the
result one int64 column per field.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["scan_events", "find_array", "rehash"]


# ---------------------------------------------------------------- Kineto event scanner
# Reads the objects of a ``traceEvents`` array straight into one int64 row per event (no
# Python object per event). Anything it does not model exactly (an unusual value type, a
# duplicate or escaped key, a phase other than X/s/f/t/i/I) is flagged SLOW: the caller
# decodes that event's bytes with msgspec and handles it the general way. Structural
# problems (truncation, bad syntax, invalid UTF-8) stop the scan with an error status; the
# caller then falls back to the whole-document decoder, which words the error.

#: columns of the scanner's output rows
#: (EV_CAT / EV_NAME: ids in the reader's intern tables)
EV_SPAN0, EV_SPAN1, EV_PH, EV_FLAGS, EV_CAT, EV_NAME, EV_PID, EV_TID, EV_TS, EV_DUR, EV_CORR, \
    EV_EXT, EV_DEV, EV_STREAM, EV_BYTES, EV_DEVTYPE, EV_DEVID, EV_MEMBYTES, EV_TALLOC, \
    EV_TRES = range(20)
EV_FIELDS = 20
#: flag bits
F_SLOW, F_TS, F_DUR, F_ARGS, F_NAME, F_CAT, F_PID, F_TID = 1, 2, 4, 8, 16, 32, 64, 128
#: value of an absent optional field
NONE = np.int64(-(1 << 63))
#: scan status
S_MORE, S_END, S_FULL, S_GROW, S_ERROR = 0, 1, 2, 3, -1
TOP_KEYS = (b"ph", b"cat", b"name", b"pid", b"tid", b"ts", b"dur", b"args")
ARG_KEYS = (b"correlation", b"External id", b"device", b"stream", b"bytes", b"Device Type",
            b"Device Id", b"Bytes", b"Total Allocated", b"Total Reserved")
_FNV0 = -3750763034362895579  # FNV-1a offset basis as int64
_FNV_P = 1099511628211


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


@njit(cache=True, inline="always")
def _ws(buf, i, n):  # pragma: no cover - compiled
    while i < n:
        c = buf[i]
        if c > 32 or (_CC[c] & 1) == 0:
            return i
        i += 1
    return i


@njit(cache=True)
def _utf8(buf, i, n):  # pragma: no cover - compiled
    """Length of the UTF-8 sequence led by ``buf[i]`` (>= 0x80); -1 past the end, -2 invalid."""
    c = buf[i]
    need = 0
    lo = 128
    hi = 191
    if 0xC2 <= c <= 0xDF:
        need = 1
    elif 0xE0 <= c <= 0xEF:
        need = 2
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
    elif 0xF0 <= c <= 0xF4:
        need = 3
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
    else:
        return -2
    if i + need >= n:
        return -1
    for k in range(1, need + 1):
        d = buf[i + k]
        if k == 1:
            if d < lo or d > hi:
                return -2
        elif d < 128 or d > 191:
            return -2
    return need + 1


@njit(cache=True, inline="always")
def _str_end(buf, i, n):  # pragma: no cover - compiled
    """``i`` at an opening quote -> (index after the closing quote, hash of the raw bytes,
    escaped?); index -1 when the buffer ends first, -2 on invalid UTF-8. The hash only
    spreads strings over the intern table (equal strings are confirmed byte by byte)."""
    h = _FNV0
    esc = False
    i += 1
    while i < n:
        c = buf[i]
        if (_CC[c] & 2) == 0:
            h = ((h << 5) | ((h >> 59) & 31)) ^ c
            i += 1
            continue
        if c == 34:
            return i + 1, (h ^ (h >> 31)) * _FNV_P, esc
        if c == 92:
            esc = True
            if i + 1 >= n:
                return -1, h, esc
            h = ((h << 5) | ((h >> 59) & 31)) ^ c
            h = ((h << 5) | ((h >> 59) & 31)) ^ buf[i + 1]
            i += 2
            continue
        if c >= 128:
            m = _utf8(buf, i, n)
            if m < 0:
                return m, h, esc
            for k in range(m):
                h = ((h << 5) | ((h >> 59) & 31)) ^ buf[i + k]
            i += m
            continue
        return -2, h, esc  # not reached: every other byte is plain
    return -1, h, esc


@njit(cache=True, inline="always")
def _str_skip(buf, i, n):  # pragma: no cover - compiled
    """As :func:`_str_end` without the hash: -> (index after the closing quote, escaped?)."""
    esc = False
    i += 1
    while i < n:
        c = buf[i]
        if (_CC[c] & 2) == 0:
            i += 1
            continue
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = True
            i += 2
            continue
        if c >= 128:
            m = _utf8(buf, i, n)
            if m < 0:
                return m, esc
            i += m
            continue
        i += 1
    return -1, esc


@njit(cache=True)
def _skip(buf, i, n):  # pragma: no cover - compiled
    """Index after the JSON value at ``i``; -1 when the buffer ends first, -2 when invalid."""
    c = buf[i]
    if c == 34:
        e, _ = _str_skip(buf, i, n)
        return e
    if c == 123 or c == 91:
        stack = np.int64(0)  # bit per level: 1 object, 0 array
        depth = 0
        while i < n:
            c = buf[i]
            if (_CC[c] & 4) == 0:
                i += 1
                continue
            if c == 34:
                e, _ = _str_skip(buf, i, n)
                if e < 0:
                    return e
                i = e
                continue
            if c == 123 or c == 91:
                if depth >= 62:
                    return -2
                stack = (stack << 1) | (1 if c == 123 else 0)
                depth += 1
            elif c == 125 or c == 93:
                if depth == 0 or (stack & 1) != (1 if c == 125 else 0):
                    return -2
                stack >>= 1
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    if not (c == 45 or 48 <= c <= 57 or c == 116 or c == 102 or c == 110):
        return -2
    while i < n:
        if _CC[buf[i]] & 8:
            return i
        i += 1
    return -1


@njit(cache=True, inline="always")
def _int(buf, i, n):  # pragma: no cover - compiled
    """A JSON integer at ``i`` -> (value, end, ok); ok is False for floats, null, strings."""
    neg = False
    j = i
    if j < n and buf[j] == 45:
        neg = True
        j += 1
    v = np.int64(0)
    d0 = j
    while j < n and 48 <= buf[j] <= 57:
        v = v * 10 + (buf[j] - 48)
        j += 1
    nd = j - d0
    if nd == 0 or nd > 18 or j >= n:
        return v, j, False
    c = buf[j]
    if c == 46 or c == 101 or c == 69:
        return v, j, False
    return (-v if neg else v), j, True


@njit(cache=True, inline="always")
def _ns(buf, i, n):  # pragma: no cover - compiled
    """A non-negative JSON number of microseconds at ``i`` -> (integer ns, end, ok), exact:
    three decimals are ns, the fourth rounds (half up). Negative or exponent: not ok."""
    j = i
    v = np.int64(0)
    d0 = j
    while j < n and 48 <= buf[j] <= 57:
        v = v * 10 + (buf[j] - 48)
        j += 1
    if j - d0 == 0 or j - d0 > 16 or v > 9_000_000_000_000_000 or j >= n:
        return v, j, False
    v *= 1000
    if buf[j] == 46:
        j += 1
        f0 = j
        scale = 100
        while j < n and 48 <= buf[j] <= 57:
            k = j - f0
            if k < 3:
                v += (buf[j] - 48) * scale
                scale //= 10
            elif k == 3 and buf[j] >= 53:
                v += 1
            j += 1
        if j == f0 or j >= n:
            return v, j, False
    c = buf[j]
    if c == 101 or c == 69:
        return v, j, False
    return v, j, True


@njit(cache=True, inline="always")
def _key_id(buf, s, e, kb, ko):  # pragma: no cover - compiled
    ln = e - s
    if ln <= 0:
        return 0
    c0 = buf[s]
    for k in range(ko.shape[0] - 1):
        if ko[k + 1] - ko[k] == ln and kb[ko[k]] == c0:
            ok = True
            for j in range(ln):
                if buf[s + j] != kb[ko[k] + j]:
                    ok = False
                    break
            if ok:
                return k + 1
    return 0


@njit(cache=True, inline="always")
def _args(buf, i, n, out, r, kb, ko):  # pragma: no cover - compiled
    """Parse the args object at ``i`` into column ``r`` of ``out``; -> (end, slow) with end -1/-2 as _skip."""
    slow = False
    j = _ws(buf, i + 1, n)
    if j >= n:
        return -1, slow
    if buf[j] == 125:
        return j + 1, slow
    seen = 0
    while True:
        if j >= n:
            return -1, slow
        if buf[j] != 34:
            return -2, slow
        ke, kesc = _str_skip(buf, j, n)
        if ke < 0:
            return ke, slow
        kid = 0 if kesc else _key_id(buf, j + 1, ke - 1, kb, ko)
        if kesc:
            slow = True
        j = _ws(buf, ke, n)
        if j >= n:
            return -1, slow
        if buf[j] != 58:
            return -2, slow
        j = _ws(buf, j + 1, n)
        if j >= n:
            return -1, slow
        if kid > 0:
            if seen & (1 << kid):
                slow = True
            seen |= 1 << kid
            v, e, ok = _int(buf, j, n)
            if ok:
                out[EV_CORR + kid - 1, r] = v
                j = e
            else:
                isnull = (buf[j] == 110 and j + 3 < n and buf[j + 1] == 117
                          and buf[j + 2] == 108 and buf[j + 3] == 108)
                # null is "absent" for the optional fields; correlation / External id
                # must be integers (the general path reports it)
                if not isnull or kid <= 2:
                    slow = True
                e = _skip(buf, j, n)
                if e < 0:
                    return e, slow
                j = e
        else:
            e = _skip(buf, j, n)
            if e < 0:
                return e, slow
            j = e
        j = _ws(buf, j, n)
        if j >= n:
            return -1, slow
        c = buf[j]
        if c == 44:
            j = _ws(buf, j + 1, n)
            continue
        if c == 125:
            return j + 1, slow
        return -2, slow


@njit(cache=True, inline="always")
def _event(buf, i, n, out, r, tk, to, ak, ao, nt, ct):  # pragma: no cover - compiled
    """Parse the event object at ``i`` into column ``r`` of ``out``; -> end (-1 more data, -2 invalid)."""
    out[EV_SPAN0, r] = i
    out[EV_PH, r] = 0
    out[EV_CORR, r] = -1
    out[EV_EXT, r] = -1
    for f in range(EV_DEV, EV_FIELDS):
        out[f, r] = NONE
    flags = 0
    seen = 0
    j = _ws(buf, i + 1, n)
    if j >= n:
        return -1
    if buf[j] == 125:
        out[EV_FLAGS, r] = F_SLOW
        out[EV_SPAN1, r] = j + 1
        return j + 1
    while True:
        if j >= n:
            return -1
        if buf[j] != 34:
            return -2
        ke, kesc = _str_skip(buf, j, n)
        if ke < 0:
            return ke
        kid = 0 if kesc else _key_id(buf, j + 1, ke - 1, tk, to)
        if kesc:
            flags |= F_SLOW
        if kid > 0:
            if seen & (1 << kid):
                flags |= F_SLOW
            seen |= 1 << kid
        j = _ws(buf, ke, n)
        if j >= n:
            return -1
        if buf[j] != 58:
            return -2
        j = _ws(buf, j + 1, n)
        if j >= n:
            return -1
        c = buf[j]
        done = False  # the value was read into the row
        if (kid == 1 or kid == 2 or kid == 3) and c == 34:  # ph, cat, name: strings
            e, h, esc = _str_end(buf, j, n)
            if e < 0:
                return e
            if kid == 1:
                if e - j == 3 and not esc:
                    out[EV_PH, r] = buf[j + 1]
                else:
                    flags |= F_SLOW
            elif kid == 2:
                out[EV_CAT, r] = _intern(ct, buf, j + 1, e - 1, h)
                flags |= F_CAT
            else:
                out[EV_NAME, r] = _intern(nt, buf, j + 1, e - 1, h)
                flags |= F_NAME
            j = e
            done = True
        elif kid == 4 or kid == 5:  # pid, tid: integers
            v, e, ok = _int(buf, j, n)
            if ok:
                out[EV_PID + kid - 4, r] = v
                flags |= F_PID if kid == 4 else F_TID
                j = e
                done = True
        elif kid == 6 or kid == 7:  # ts, dur: microseconds
            v, e, ok = _ns(buf, j, n)
            if ok:
                out[EV_TS + kid - 6, r] = v
                flags |= F_TS if kid == 6 else F_DUR
                j = e
                done = True
        elif kid == 8 and c == 123:  # args object
            e, slow = _args(buf, j, n, out, r, ak, ao)
            if e < 0:
                return e
            if slow:
                flags |= F_SLOW
            flags |= F_ARGS
            j = e
            done = True
        if not done:
            # other keys are skipped; a known key with another value type (args: null is
            # "no args") goes the general way
            if kid != 0 and not (kid == 8 and c == 110):
                flags |= F_SLOW
            e = _skip(buf, j, n)
            if e < 0:
                return e
            j = e
        j = _ws(buf, j, n)
        if j >= n:
            return -1
        c = buf[j]
        if c == 44:
            j = _ws(buf, j + 1, n)
            continue
        if c == 125:
            out[EV_FLAGS, r] = flags
            out[EV_SPAN1, r] = j + 1
            return j + 1
        return -2


@njit(cache=True)
def _scan_events(buf, pos, state, out, tk, to, ak, ao, nt, ct):  # pragma: no cover - compiled
    n = buf.shape[0]
    cap = out.shape[1]
    k = 0
    while True:
        j = _ws(buf, pos, n)
        if j >= n:
            return S_MORE, pos, state, k
        c = buf[j]
        if state == 2:  # after an element: , or ]
            if c == 44:
                pos = j + 1
                state = 1
                continue
            if c == 93:
                return S_END, j, state, k
            return S_ERROR, j, state, k
        if c == 93 and state == 0:  # empty array
            return S_END, j, state, k
        if c != 123:
            return S_ERROR, j, state, k
        if k == cap:
            return S_FULL, j, state, k
        if nt[5][0] >= nt[5][2] or ct[5][0] >= ct[5][2]:
            return S_GROW, j, state, k  # an intern table is half full: grow it, call again
        e = _event(buf, j, n, out, k, tk, to, ak, ao, nt, ct)
        if e == -1:
            return S_MORE, j, state, k
        if e < 0:
            return S_ERROR, j, state, k
        ph = out[EV_PH, k]
        if not (ph == 88 or ph == 115 or ph == 102 or ph == 116 or ph == 105 or ph == 73):
            out[EV_FLAGS, k] |= F_SLOW  # X s f t i I are read here; others the general way
        k += 1
        pos = e
        state = 2


def scan_events(buf: np.ndarray, pos: int, state: int, out: np.ndarray, tables, names,
                cats):
    """Scan trace events from ``buf[pos:]`` into the columns of ``out`` (int64, (EV_FIELDS, cap)).

    ``names`` and ``cats`` are intern tables (tuples, see below; made and grown by
    collectors.kineto_fast): the ``name`` and ``cat`` strings of the events get ids in them
    (columns EV_NAME, EV_CAT), compared byte by byte with the stored copy, so two different
    strings never share an id. The pools must have room for every string of ``buf[pos:]``.
    S_GROW: a table must grow before the call is repeated from ``pos``.

    ``state`` is 0 right after the array's ``[``, 1 after a comma, 2 after an element.
    Returns ``(status, pos, state, rows)``: S_MORE (the buffer ends inside an event or
    between events: continue at ``pos`` with more bytes appended), S_END (``pos`` is the
    array's ``]``), S_FULL (``out`` is full: call again from ``pos``), S_ERROR (invalid at
    ``pos``).
    """
    return _scan_events(buf, pos, state, out, *tables, names, cats)


# ---------------------------------------------------------------- intern tables
# (hashes, ids, pool, offsets, lengths, meta): open addressing on the 64-bit hash of the raw
# bytes (ids -1: empty slot); a string's bytes are kept in ``pool`` at ``offsets[id]``;
# meta = [strings, pool bytes used, most strings before growing]. A slot matches only when
# hash, length and every byte agree: a hash collision costs a probe, never a wrong id.


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


@njit(cache=True, inline="always")
def _intern(t, buf, s, e, h):  # pragma: no cover - compiled
    """Id of the string ``buf[s:e]`` (hash ``h``) in the intern table ``t``; added if new."""
    hs, ids, pool, off, ln, meta = t
    mask = hs.shape[0] - 1
    m = e - s
    i = (h ^ (h >> 29)) & mask
    while True:
        d = ids[i]
        if d < 0:
            d = meta[0]
            hs[i] = h
            ids[i] = d
            p = meta[1]
            off[d] = p
            ln[d] = m
            for k in range(m):
                pool[p + k] = buf[s + k]
            meta[0] = d + 1
            meta[1] = p + m
            return d
        if hs[i] == h and ln[d] == m:
            p = off[d]
            same = True
            for k in range(m):
                if pool[p + k] != buf[s + k]:
                    same = False
                    break
            if same:
                return d
        i = (i + 1) & mask


@njit(cache=True)
def _find_array(buf, key):  # pragma: no cover - compiled
    n = buf.shape[0]
    i = _ws(buf, 0, n)
    if i >= n:
        return -1
    if buf[i] == 91:
        return i
    if buf[i] != 123:
        return -2
    i = _ws(buf, i + 1, n)
    while True:
        if i >= n:
            return -1
        if buf[i] != 34:
            return -2
        ke, esc = _str_skip(buf, i, n)
        if ke < 0:
            return ke
        match = not esc and ke - i - 2 == key.shape[0]
        if match:
            for k in range(key.shape[0]):
                if buf[i + 1 + k] != key[k]:
                    match = False
                    break
        i = _ws(buf, ke, n)
        if i >= n:
            return -1
        if buf[i] != 58:
            return -2
        i = _ws(buf, i + 1, n)
        if i >= n:
            return -1
        if match and buf[i] == 91:
            return i
        e = _skip(buf, i, n)
        if e < 0:
            return e
        i = _ws(buf, e, n)
        if i >= n:
            return -1
        if buf[i] != 44:
            return -2
        i = _ws(buf, i + 1, n)


def find_array(buf: np.ndarray, key: bytes) -> int:
    """Position of the ``[`` of the array under top-level ``key`` (or of a top-level array).

    -1: the text ends first (read more); -2: there is no such array or the text is invalid.
    """
    return int(_find_array(buf, np.frombuffer(key, np.uint8).copy()))
