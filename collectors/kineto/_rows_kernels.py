"""numba kernels of the streaming Kineto reader: one scanner call's rows -> column parts.

The scanner (:mod:`collectors.kineto._scan_kernels`) writes one int64 row per event; these
kernels sort a block of rows into the reader's column parts in one pass each, instead of
some hundred numpy passes per block (collectors/kineto/scan.py, ``_Reader.block``):

- :func:`new_ids`: the name / category ids (of the scanner's intern tables) the reader has
  not mapped to strings yet, in order of first appearance (the order the string table gets
  them in);
- :func:`split_rows`: GPU ops, host events, GPU annotation ranges, memory samples, and the
  rows to decode whole (kept, slow), with the counts the accounting needs;
- :func:`gather_spans`: the text of the rows to decode whole as one JSON array (one
  msgspec call decodes them all).

Arrays in, arrays out (CONVENTIONS.md §1); ``tests/test_kineto_rows_kernels.py`` checks them
against a plain-Python reference on random seeded rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..enums import OpKind
from ..progress import watch_compiles
from ._scan_kernels import (
    EV_BYTES,
    EV_CAT,
    EV_CORR,
    EV_DEV,
    EV_DEVID,
    EV_DEVTYPE,
    EV_DUR,
    EV_EXT,
    EV_FIELDS,
    EV_FLAGS,
    EV_MEMBYTES,
    EV_NAME,
    EV_PH,
    EV_PID,
    EV_STREAM,
    EV_TALLOC,
    EV_TID,
    EV_TRES,
    EV_TS,
    F_ARGS,
    F_CAT,
    F_DUR,
    F_NAME,
    F_PID,
    F_SLOW,
    F_TID,
    F_TS,
    NONE,
)
from .schema import C_ANNOT, C_KERNEL, C_MEMSET, C_RUNTIME, H_ANNOT, H_GLOO

__all__ = ["new_ids", "split_rows", "gather_spans", "X_SYNC", "X_GANNOT", "X_TRACE", "X_OTHER",
           "N_COMM_KERNEL", "N_GLOO", "N_COMM_RANGE", "N_MEMORY", "CNT_FIELDS",
           "CNT_FLOWS", "CNT_SYNCS", "CNT_RANGES", "CNT_TRACE", "CNT_MEMORY", "CNT_MARKERS",
           "CNT_LAST_TRACE"]

#: class codes of the categories that are neither GPU ops nor host events (the others are
#: their ``schema.C_*`` codes): cuda_sync, gpu_user_annotation, trace, anything else (dropped)
X_SYNC, X_GANNOT, X_TRACE, X_OTHER = 100, 101, 102, 103
#: name flag bits (per string id): communication kernel, ``gloo:*``, communication range,
#: ``[memory]``
N_COMM_KERNEL, N_GLOO, N_COMM_RANGE, N_MEMORY = 1, 2, 4, 8
#: the counts :func:`split_rows` returns
CNT_FLOWS, CNT_SYNCS, CNT_RANGES, CNT_TRACE, CNT_MEMORY, CNT_MARKERS, CNT_LAST_TRACE = range(7)
CNT_FIELDS = 7

# row classes
_R_SLOW, _R_X, _R_I, _R_FLOW = 0, 1, 2, 3
_NEED = F_TS | F_DUR | F_NAME | F_CAT | F_PID | F_TID
_COLLECTIVE = int(OpKind.COLLECTIVE)


@njit(cache=True)
def _row_class(flags, ph):  # pragma: no cover - compiled
    """How the reader treats a row: slow (decoded whole, the general way), X, i/I, flow.
    The scanner flags every other phase slow."""
    if flags & F_SLOW:
        return _R_SLOW
    if ph == 88:
        return _R_X if (flags & _NEED) == _NEED else _R_SLOW
    if ph == 105 or ph == 73:
        return _R_I
    if ph == 115 or ph == 102 or ph == 116:
        return _R_FLOW
    return _R_SLOW


@njit(cache=True)
def _new_ids(rows, k, sid, csid):  # pragma: no cover - compiled
    seen_n = np.zeros(sid.shape[0], np.bool_)
    seen_c = np.zeros(csid.shape[0], np.bool_)
    new_n = np.empty(k, np.int64)
    new_c = np.empty(k, np.int64)
    nn = nc = 0
    for j in range(k):
        r = _row_class(rows[EV_FLAGS, j], rows[EV_PH, j])
        if r == _R_X or (r == _R_I and (rows[EV_FLAGS, j] & F_NAME) != 0):
            t = rows[EV_NAME, j]
            if sid[t] < 0 and not seen_n[t]:
                seen_n[t] = True
                new_n[nn] = t
                nn += 1
        if r == _R_X:
            t = rows[EV_CAT, j]
            if csid[t] < 0 and not seen_c[t]:
                seen_c[t] = True
                new_c[nc] = t
                nc += 1
    return new_n[:nn].copy(), new_c[:nc].copy()


def new_ids(rows: np.ndarray, k: int, sid: np.ndarray, csid: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Name and category table ids of the first ``k`` rows not mapped yet, in order of first
    appearance.

    Parameters
    ----------
    rows : int64 (EV_FIELDS, cap), the scanner's row buffer (C-contiguous: passed whole, not
        sliced, so that no block is copied)
    k : rows used
    sid : int64, name table id -> string id (-1: not mapped); covers every id in ``rows``
    csid : int64, category table id -> category index (-1: not mapped); likewise

    Returns
    -------
    (name table ids, category table ids), int64: names of the X rows and the named i/I rows,
    categories of the X rows (the rows :func:`split_rows` reads them of).
    """
    rows, sid, csid = _check(rows, k, sid, csid)
    return _new_ids(rows, np.int64(k), sid, csid)


@njit(cache=True)
def _split_rows(rows, k, first_idx, sid, ccode, nflag):  # pragma: no cover - compiled
    g = np.empty((10, k), np.int64)
    h = np.empty((9, k), np.int64)
    gr = np.empty((6, k), np.int64)
    mem = np.empty((k, 6), np.int64)
    keep = np.empty(k, np.int64)
    syncs = np.empty(k, np.int64)
    slow = np.empty(k, np.int64)
    drop = np.zeros(ccode.shape[0], np.int64)
    cnt = np.zeros(CNT_FIELDS, np.int64)
    cnt[CNT_LAST_TRACE] = -1
    ng = nh = ngr = nm = nk = ns = nsl = 0
    for j in range(k):
        flags = rows[EV_FLAGS, j]
        r = _row_class(flags, rows[EV_PH, j])
        if r == _R_SLOW:
            slow[nsl] = j
            nsl += 1
            continue
        if r == _R_FLOW:
            cnt[CNT_FLOWS] += 1
            continue
        idx = first_idx + j
        if r == _R_I:
            nm_id = sid[rows[EV_NAME, j]] if (flags & F_NAME) != 0 else -1
            if ((flags & (F_ARGS | F_TS)) == (F_ARGS | F_TS) and nm_id >= 0
                    and (nflag[nm_id] & N_MEMORY) != 0):
                dt, di = rows[EV_DEVTYPE, j], rows[EV_DEVID, j]
                mem[nm, 0] = di if (dt != NONE and dt != 0 and di != NONE) else -1
                mem[nm, 1] = rows[EV_TS, j]
                b = rows[EV_MEMBYTES, j]
                mem[nm, 2] = b if b != NONE else 0
                b = rows[EV_TALLOC, j]
                mem[nm, 3] = b if b != NONE else -1
                b = rows[EV_TRES, j]
                mem[nm, 4] = b if b != NONE else -1
                mem[nm, 5] = idx
                nm += 1
                cnt[CNT_MEMORY] += 1
            else:
                cnt[CNT_MARKERS] += 1
            continue
        # a complete (X) event
        nid = sid[rows[EV_NAME, j]]
        code = ccode[rows[EV_CAT, j]]
        ts, dur = rows[EV_TS, j], rows[EV_DUR, j]
        if code <= C_MEMSET:  # a GPU op
            kind = code
            if code == C_KERNEL and (nflag[nid] & N_COMM_KERNEL) != 0:
                kind = _COLLECTIVE
                keep[nk] = j
                nk += 1
            v = rows[EV_DEV, j]
            g[0, ng] = v if v != NONE else rows[EV_PID, j]
            v = rows[EV_STREAM, j]
            g[1, ng] = v if v != NONE else rows[EV_TID, j]
            g[2, ng] = kind
            g[3, ng] = nid
            g[4, ng] = ts
            g[5, ng] = dur
            g[6, ng] = rows[EV_CORR, j]
            g[7, ng] = rows[EV_EXT, j]
            v = rows[EV_BYTES, j]
            g[8, ng] = v if v != NONE else 0
            g[9, ng] = idx
            ng += 1
        elif C_RUNTIME <= code <= C_ANNOT:  # a host event
            hc = code - C_RUNTIME
            if hc == H_ANNOT and (nflag[nid] & N_GLOO) != 0:
                hc = H_GLOO
            if hc == H_GLOO or (nflag[nid] & N_COMM_RANGE) != 0:
                keep[nk] = j
                nk += 1
            h[0, nh] = rows[EV_PID, j]
            h[1, nh] = rows[EV_TID, j]
            h[2, nh] = hc
            h[3, nh] = nid
            h[4, nh] = ts
            h[5, nh] = ts + dur
            h[6, nh] = rows[EV_CORR, j]
            h[7, nh] = rows[EV_EXT, j]
            h[8, nh] = idx
            nh += 1
        elif code == X_SYNC:
            syncs[ns] = idx
            ns += 1
            keep[nk] = j
            nk += 1
            cnt[CNT_SYNCS] += 1
        elif code == X_GANNOT:
            v = rows[EV_DEV, j]
            gr[0, ngr] = v if v != NONE else rows[EV_PID, j]
            v = rows[EV_STREAM, j]
            gr[1, ngr] = v if v != NONE else rows[EV_TID, j]
            gr[2, ngr] = nid
            gr[3, ngr] = ts
            gr[4, ngr] = ts + dur
            gr[5, ngr] = idx
            ngr += 1
            cnt[CNT_RANGES] += 1
        elif code == X_TRACE:
            cnt[CNT_TRACE] += 1
            cnt[CNT_LAST_TRACE] = j
        else:
            drop[rows[EV_CAT, j]] += 1
    # exact-size copies: the parts live until the file is read, the block buffers need not
    return (g[:, :ng].copy(), h[:, :nh].copy(), gr[:, :ngr].copy(), mem[:nm].copy(),
            keep[:nk].copy(), syncs[:ns].copy(), slow[:nsl].copy(), drop, cnt)


def split_rows(rows: np.ndarray, k: int, first_idx: int, sid: np.ndarray, ccode: np.ndarray,
               nflag: np.ndarray):
    """Sort one scanner call's rows into the streaming reader's column parts.

    Parameters
    ----------
    rows : int64 (EV_FIELDS, cap), the scanner's row buffer; its first ``k`` rows are events
        ``first_idx ... first_idx+k-1``
    k : rows used
    first_idx : index (in the file's ``traceEvents``) of the first row's event
    sid : int64, name table id -> string id; mapped for every name :func:`new_ids` returns
    ccode : int64, category table id -> class: a ``schema.C_*`` code of a GPU op
        (<= ``C_MEMSET``) or a host event (``C_RUNTIME`` ... ``C_ANNOT``), else one of
        ``X_SYNC``, ``X_GANNOT``, ``X_TRACE``, ``X_OTHER``
    nflag : uint8 per string id, ``N_*`` bits

    Returns
    -------
    g : int64 (10, ng) GPU ops: device, stream, kind (OpKind), name id, start ns, dur ns,
        correlation, external id, bytes, event index
    h : int64 (9, nh) host events: pid, tid, host code (``H_*``), name id, start ns, end ns,
        correlation, external id, event index
    gr : int64 (6, ngr) GPU annotation ranges: device, stream, name id, start ns, end ns,
        event index
    mem : int64 (nm, 6) memory samples: device (-1 host), ts ns, bytes delta, allocated,
        reserved (-1 unknown), event index
    keep : row positions of the events to keep decoded (collective kernels, gloo and
        communication ranges, cuda_sync events), ascending
    syncs : event indices of the cuda_sync events, ascending
    slow : row positions of the events to read the general way, ascending
    drop : int64 per category table id, X events of an unsupported category
    cnt : int64 (CNT_FIELDS,) flows, cuda_sync events, GPU ranges, Trace markers, memory
        samples, other instant events (markers), the last Trace row (-1 none)

    Times are the scanner's (ns, relative to the file's base time).
    """
    rows, sid, ccode = _check(rows, k, sid, ccode)
    nflag = np.ascontiguousarray(nflag, dtype=np.uint8)
    return _split_rows(rows, np.int64(k), np.int64(first_idx), sid, ccode, nflag)


@njit(cache=True)
def _gather(buf, a, b):  # pragma: no cover - compiled
    m = a.shape[0]
    size = 2 + max(m - 1, 0)
    for i in range(m):
        size += b[i] - a[i]
    out = np.empty(size, np.uint8)
    out[0] = 91  # [
    p = 1
    for i in range(m):
        if i:
            out[p] = 44  # ,
            p += 1
        ln = b[i] - a[i]
        out[p: p + ln] = buf[a[i]: b[i]]
        p += ln
    out[p] = 93  # ]
    return out


def gather_spans(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``b"[" + b",".join(buf[s:e] for s, e in spans) + b"]"`` as a uint8 array.

    Parameters
    ----------
    buf : uint8, the text of a block
    starts, ends : int64, byte spans in ``buf`` (``0 <= start <= end <= len(buf)``)
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("gather_spans: buf must be a C-contiguous uint8 array")
    if len(starts) != len(ends) or (len(starts) and (
            starts.min() < 0 or ends.max() > len(buf) or (ends < starts).any())):
        raise ValueError(f"gather_spans: spans must lie in buf (length {len(buf)})")
    return _gather(buf, starts, ends)


def _check(rows, k, a, b):
    if rows.ndim != 2 or rows.shape[0] != EV_FIELDS or not 0 <= k <= rows.shape[1]:
        raise ValueError(f"rows: expected shape ({EV_FIELDS}, cap >= k={k}), got {rows.shape}")
    if not (rows.dtype == np.int64 and rows.flags.c_contiguous):
        raise ValueError("rows: must be the scanner's C-contiguous int64 buffer")
    return rows, np.ascontiguousarray(a, dtype=np.int64), np.ascontiguousarray(b, dtype=np.int64)


watch_compiles()  # say so on stderr when these kernels compile on first use
