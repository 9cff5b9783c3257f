"""numba kernels of the streaming Kineto reader (collectors/kineto/scan.py).

Arrays in, arrays out (CONVENTIONS.md §1): the JSON text of a block is a uint8 array, the
result one int64 column per field. Inside, the hot helpers work on base addresses and
offsets (collectors/kineto/_scan_mem.py says why).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..progress import watch_compiles
from ._scan_lex import (
    _FF,
    _M2,
    _M4,
    _M5,
    _M6,
    _M7,
    _U8,
    _hash,
    _int,
    _intern_at,
    _ns,
    _skip,
    _str_skip,
    _table_at,
    _u64,
    _word,
    _ws,
)
from ._scan_mem import addr, ldb, ldq, stq

__all__ = ["scan_events"]


# ---------------------------------------------------------------- Kineto event scanner
# Reads the objects of a ``traceEvents`` array straight into one int64 row per event (no
# Python object per event). Anything it does not model exactly (an unusual value type, a
# duplicate or escaped key, a phase other than X/s/f/t/i/I) is flagged SLOW: the caller
# decodes that event's bytes with msgspec and handles it the general way. Structural
# problems (truncation, bad syntax, invalid UTF-8) stop the scan with an error status; the
# caller then falls back to the whole-document decoder, which words the error.
#
# Speed: string bodies are skipped eight bytes at a time (SWAR: the first '"', '\\' or byte
# >= 0x80 of a word); the known keys are recognized from one or two 8-byte words (the key
# with its closing quote, so "phase" is never "ph"); numbers are parsed in place; every
# other value is skipped without being looked at twice.

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
#: the event keys read into the row (id = 1 + index) ...
TOP_KEYS = (b"ph", b"cat", b"name", b"pid", b"tid", b"ts", b"dur", b"args")
#: ... and the args keys (id = 1 + index; column EV_CORR + index)
ARG_KEYS = (b"correlation", b"External id", b"device", b"stream", b"bytes", b"Device Type",
            b"Device Id", b"Bytes", b"Total Allocated", b"Total Reserved")


# top keys with their quotes (from the opening quote)
_K_PH, _K_TS, _K_CAT, _K_PID, _K_TID, _K_DUR, _K_NAME, _K_ARGS = (_u64(b'"%s"' % k) for k in (
    b"ph", b"ts", b"cat", b"pid", b"tid", b"dur", b"name", b"args"))
# args keys: the first 8 characters, then the rest with the closing quote
_A_CORR, _A_CORR2 = _u64(b"correlat"), _u64(b'ion"')
_A_EXT, _A_EXT2 = _u64(b"External"), _u64(b' id"')
_A_DEV, _A_STREAM, _A_BYTES, _A_BYTES_C = (_u64(x) for x in (b'device"', b'stream"', b'bytes"',
                                                               b'Bytes"'))
_A_DEVICE, _A_TYPE, _A_ID = _u64(b"Device T"), _u64(b'ype"'), _u64(b'd"')
_A_DEVICE_I = _u64(b"Device I")
_A_TOTAL_A, _A_ALLOC = _u64(b"Total Al"), _u64(b'located"')
_A_TOTAL_R, _A_RES = _u64(b"Total Re"), _u64(b'served"')

@njit(cache=True)
def _top_key(w):  # pragma: no cover - compiled
    """(id, length with quotes) of the event key whose opening quote starts the word ``w``;
    (0, 0) for any other key."""
    c = np.int64((w >> _U8) & _FF)
    if c == 112:  # p
        if (w & _M4) == _K_PH:
            return 1, 4
        if (w & _M5) == _K_PID:
            return 4, 5
    elif c == 99:  # c
        if (w & _M5) == _K_CAT:
            return 2, 5
    elif c == 110:  # n
        if (w & _M6) == _K_NAME:
            return 3, 6
    elif c == 116:  # t
        if (w & _M4) == _K_TS:
            return 6, 4
        if (w & _M5) == _K_TID:
            return 5, 5
    elif c == 100:  # d
        if (w & _M5) == _K_DUR:
            return 7, 5
    elif c == 97:  # a
        if (w & _M6) == _K_ARGS:
            return 8, 6
    return 0, 0


@njit(cache=True)
def _arg_key(w, w2):  # pragma: no cover - compiled
    """(id, length with quotes) of the args key whose first 8 characters are ``w`` (the next
    8 bytes: ``w2``); (0, 0) for any other key."""
    c = np.int64(w & _FF)
    if c == 99:  # c
        if w == _A_CORR and (w2 & _M4) == _A_CORR2:
            return 1, 13
    elif c == 69:  # E
        if w == _A_EXT and (w2 & _M4) == _A_EXT2:
            return 2, 13
    elif c == 100:  # d
        if (w & _M7) == _A_DEV:
            return 3, 8
    elif c == 115:  # s
        if (w & _M7) == _A_STREAM:
            return 4, 8
    elif c == 98:  # b
        if (w & _M6) == _A_BYTES:
            return 5, 7
    elif c == 68:  # D
        if w == _A_DEVICE:
            if (w2 & _M4) == _A_TYPE:
                return 6, 13
        elif w == _A_DEVICE_I and (w2 & _M2) == _A_ID:
            return 7, 11
    elif c == 66:  # B
        if (w & _M6) == _A_BYTES_C:
            return 8, 7
    elif c == 84:  # T
        if w == _A_TOTAL_A:
            if w2 == _A_ALLOC:
                return 9, 17
        elif w == _A_TOTAL_R and (w2 & _M7) == _A_RES:
            return 10, 16
    return 0, 0


@njit(cache=True)
def _after(b, j, n):  # pragma: no cover - compiled
    """After a value: (offset of the next non-space byte, that byte); (-1, 0) at the end."""
    if j < n:
        c = ldb(b + j)
        if c > 32:
            return j, c
    j = _ws(b, j, n)
    if j >= n:
        return -1, 0
    return j, ldb(b + j)


@njit(cache=True)
def _colon(b, j, n):  # pragma: no cover - compiled
    """After a key: offset of its value (-1 at the end, -2 without a colon)."""
    if j < n and ldb(b + j) != 58:
        j = _ws(b, j, n)
    if j >= n:
        return -1
    if ldb(b + j) != 58:
        return -2
    j = _ws(b, j + 1, n)
    if j >= n:
        return -1
    return j


@njit(cache=True)
def _args(b, i, n, ro, fs):  # pragma: no cover - compiled
    """Parse the args object at ``i`` into the row at ``ro`` (field stride ``fs``) ->
    (end, slow) with end -1/-2 as _skip."""
    slow = False
    j = _ws(b, i + 1, n)
    if j >= n:
        return -1, slow
    if ldb(b + j) == 125:
        return j + 1, slow
    seen = 0
    while True:
        if j >= n:
            return -1, slow
        if ldb(b + j) != 34:
            return -2, slow
        kid, kl = _arg_key(_word(b, j + 1, n), _word(b, j + 9, n))
        if kid > 0:
            j += kl
        else:
            ke, kesc = _str_skip(b, j, n)
            if ke < 0:
                return ke, slow
            if kesc:
                slow = True
            j = ke
        j = _colon(b, j, n)
        if j < 0:
            return j, slow
        if kid > 0:
            if seen & (1 << kid):
                slow = True
            seen |= 1 << kid
            v, e, ok = _int(b, j, n)
            if ok:
                stq(ro + (EV_CORR + kid - 1) * fs, v)
                j = e
            else:
                isnull = (j + 3 < n and ldb(b + j) == 110 and ldb(b + j + 1) == 117
                          and ldb(b + j + 2) == 108 and ldb(b + j + 3) == 108)
                # null is "absent" for the optional fields; correlation / External id
                # must be integers (the general path reports it)
                if not isnull or kid <= 2:
                    slow = True
                j = _skip(b, j, n)
                if j < 0:
                    return j, slow
        else:
            j = _skip(b, j, n)
            if j < 0:
                return j, slow
        j, c = _after(b, j, n)
        if j < 0:
            return -1, slow
        if c == 44:
            j = _ws(b, j + 1, n)
            continue
        if c == 125:
            return j + 1, slow
        return -2, slow


@njit(cache=True)
def _event(b, i, n, ro, fs, nt, ct):  # pragma: no cover - compiled
    """Parse the event object at ``i`` into the row at ``ro`` (field stride ``fs``); ``nt`` /
    ``ct``: the name and category intern tables as addresses; -> end (-1 more data, -2 invalid)."""
    stq(ro + EV_SPAN0 * fs, i)
    stq(ro + EV_PH * fs, 0)
    stq(ro + EV_CORR * fs, -1)
    stq(ro + EV_EXT * fs, -1)
    for f in range(EV_DEV, EV_FIELDS):
        stq(ro + f * fs, NONE)
    flags = 0
    seen = 0
    j = _ws(b, i + 1, n)
    if j >= n:
        return -1
    if ldb(b + j) == 125:
        stq(ro + EV_FLAGS * fs, F_SLOW)
        stq(ro + EV_SPAN1 * fs, j + 1)
        return j + 1
    while True:
        if j >= n:
            return -1
        if ldb(b + j) != 34:
            return -2
        kid, kl = _top_key(_word(b, j, n))
        dup = False
        if kid > 0:
            if seen & (1 << kid):
                flags |= F_SLOW  # read the general way; its name is not interned twice
                dup = True
            seen |= 1 << kid
            j += kl
        else:
            ke, kesc = _str_skip(b, j, n)
            if ke < 0:
                return ke
            if kesc:
                flags |= F_SLOW
            j = ke
        j = _colon(b, j, n)
        if j < 0:
            return j
        c = ldb(b + j)
        done = False  # the value was read into the row
        if kid == 0:
            pass
        elif kid <= 3:  # ph, cat, name: strings
            if c == 34:
                if kid == 1:
                    c1 = ldb(b + j + 1) if j + 1 < n else 34
                    if c1 != 34 and c1 != 92 and c1 < 128 and j + 2 < n and ldb(b + j + 2) == 34:
                        stq(ro + EV_PH * fs, c1)  # one plain character
                        e = j + 3
                    else:
                        e, _ = _str_skip(b, j, n)
                        if e < 0:
                            return e
                        flags |= F_SLOW
                else:
                    e, _ = _str_skip(b, j, n)
                    if e < 0:
                        return e
                if kid > 1 and not dup:  # at most one new string per table and event
                    h = _hash(b, j + 1, e - 1, n)
                    if kid == 2:
                        stq(ro + EV_CAT * fs, _intern_at(ct, b, j + 1, e - 1, h))
                        flags |= F_CAT
                    else:
                        stq(ro + EV_NAME * fs, _intern_at(nt, b, j + 1, e - 1, h))
                        flags |= F_NAME
                j = e
                done = True
        elif kid <= 5:  # pid, tid: integers
            v, e, ok = _int(b, j, n)
            if ok:
                stq(ro + (EV_PID + kid - 4) * fs, v)
                flags |= F_PID if kid == 4 else F_TID
                j = e
                done = True
        elif kid <= 7:  # ts, dur: microseconds
            v, e, ok = _ns(b, j, n)
            if ok:
                stq(ro + (EV_TS + kid - 6) * fs, v)
                flags |= F_TS if kid == 6 else F_DUR
                j = e
                done = True
        elif c == 123:  # args object
            e, slow = _args(b, j, n, ro, fs)
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
            j = _skip(b, j, n)
            if j < 0:
                return j
        j, c = _after(b, j, n)
        if j < 0:
            return -1
        if c == 44:
            j = _ws(b, j + 1, n)
            continue
        if c == 125:
            stq(ro + EV_FLAGS * fs, flags)
            stq(ro + EV_SPAN1 * fs, j + 1)
            return j + 1
        return -2


@njit(cache=True)
def _scan_events(buf, pos, state, out, nt, ct):  # pragma: no cover - compiled
    n = buf.shape[0]
    cap = out.shape[1]
    b = addr(buf)
    op = addr(out)
    fs = 8 * cap
    na = _table_at(nt)
    ca = _table_at(ct)
    k = 0
    while True:
        j = _ws(b, pos, n)
        if j >= n:
            return S_MORE, pos, state, k
        c = ldb(b + j)
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
        if ldq(na[5]) >= ldq(na[5] + 16) or ldq(ca[5]) >= ldq(ca[5] + 16):
            return S_GROW, j, state, k  # an intern table is half full: grow it, call again
        ro = op + 8 * k
        e = _event(b, j, n, ro, fs, na, ca)
        if e == -1:
            return S_MORE, j, state, k
        if e < 0:
            return S_ERROR, j, state, k
        ph = ldq(ro + EV_PH * fs)
        if not (ph == 88 or ph == 115 or ph == 102 or ph == 116 or ph == 105 or ph == 73):
            stq(ro + EV_FLAGS * fs, ldq(ro + EV_FLAGS * fs) | F_SLOW)  # X s f t i I are read here
        k += 1
        pos = e
        state = 2


def scan_events(buf: np.ndarray, pos: int, state: int, out: np.ndarray, names, cats):
    """Scan trace events from ``buf[pos:]`` into the columns of ``out`` (int64, (EV_FIELDS, cap)).

    ``names`` and ``cats`` are intern tables (tuples, see below; made and grown by
    collectors.kineto.scan): the ``name`` and ``cat`` strings of the events get ids in them
    (columns EV_NAME, EV_CAT), compared byte by byte with the stored copy, so two different
    strings never share an id. The pools must have room for every string of ``buf[pos:]``.
    S_GROW: a table must grow before the call is repeated from ``pos``.

    ``state`` is 0 right after the array's ``[``, 1 after a comma, 2 after an element.
    Returns ``(status, pos, state, rows)``: S_MORE (the buffer ends inside an event or
    between events: continue at ``pos`` with more bytes appended), S_END (``pos`` is the
    array's ``]``), S_FULL (``out`` is full: call again from ``pos``), S_ERROR (invalid at
    ``pos``).
    """
    if not (buf.flags.c_contiguous and out.flags.c_contiguous and out.dtype == np.int64
            and out.shape[0] == EV_FIELDS):
        raise ValueError("scan_events: buf and out must be C-contiguous; out int64 (EV_FIELDS, cap)")
    return _scan_events(buf, pos, state, out, names, cats)


# ---------------------------------------------------------------- intern tables
watch_compiles()  # say so on stderr when these kernels compile on first use
