"""Streaming Kineto reader: the file is decompressed block by block and its events are
scanned by numba straight into columns (:func:`collectors.kineto._scan_kernels.scan_events`).

No Python object is made per event: the scanner writes one int64 row per event (the
event's byte span, ids of its ``name`` / ``cat``, ``pid``/``tid``, ``ts``/``dur`` as exact
integer ns, and the ``args`` fields the reader uses), and numpy turns the rows of a block
into the same column parts that :class:`collectors.kineto.links.EventLoop` makes. Events
that need more than columns — collective kernels, sync events, communication annotations —
are decoded from their bytes with msgspec (one call per block for all of them) and kept,
exactly as the general path keeps them. Events the scanner does not model (metadata, B/E
pairs, unusual value types, duplicate or escaped keys) are decoded the same way and fed to
the general loop, so every rule lives in one place.

Only one block of text (``BLOCK_BYTES``) and one block of rows are alive at a time: peak
memory is the columns, not the file.

Anything unexpected in the document's structure (truncation, a syntax error, invalid UTF-8,
no ``traceEvents`` array, a ``retime export`` file) makes :func:`parse_fast` return None, and
the caller reads the file the general way, which reports the problem in its own words.
Names and categories are interned by the scanner itself, in open-addressing tables keyed by a
hash of their raw bytes; every occurrence is compared byte by byte with the stored copy, so a
hash collision costs a probe and can never merge two names. A plain file is read into one
reused buffer; gzip is inflated with ISA-L (``isal``) when installed.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np

from . import _scan_kernels as K
from ._scan_cold import find_array, rehash

try:  # ISA-L inflates gzip ~2.4x faster than zlib, with the same interface
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the stand-in
    _zlib = zlib
from ..enums import OpKind
from .drift import invalid_field
from .links import EventLoop, finish_part
from .schema import (
    C_ANNOT,
    C_KERNEL,
    C_MEMSET,
    C_OTHER,
    C_RUNTIME,
    CAT_CODE,
    FILE_DECODER,
    H_ANNOT,
    H_GLOO,
    Event,
    TraceFile,
)

__all__ = ["parse_fast", "BLOCK_BYTES", "scanner_cached"]

#: decompressed bytes per block
BLOCK_BYTES = 4 << 20
#: rows per scanner call
ROWS = 1 << 16
_DEC_EV = msgspec.json.Decoder(Event)
_DEC_EVS = msgspec.json.Decoder(list[Event])
_NONE = K.NONE


class _Fallback(Exception):
    """The streaming reader cannot read this file exactly; use the general path."""


def _blocks(path: Path, on_bytes=None) -> Iterator:
    """Decompressed blocks of a gzip file; for a plain file, its open file object once.
    Any gzip problem -> _Fallback.

    ``on_bytes(n)`` is called with the number of bytes read from disk after each read.
    """
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise _Fallback from exc
    with fh:
        head = fh.read(2)
        fh.seek(0)
        if head != b"\x1f\x8b":
            yield fh
            return
        d = _zlib.decompressobj(wbits=31)
        pending = b""
        while True:
            raw = pending or fh.read(1 << 20)
            if not pending and on_bytes:
                on_bytes(len(raw))
            pending = b""
            if not raw:
                break
            try:
                out = d.decompress(raw, BLOCK_BYTES)
                while d.unconsumed_tail and not d.eof:
                    yield out
                    out = d.decompress(d.unconsumed_tail, BLOCK_BYTES)
            except (zlib.error, _zlib.error) as exc:
                raise _Fallback from exc
            if out:
                yield out
            if d.eof:  # multi-member gzip: the next member starts in unused_data
                pending = d.unused_data
                if not pending and not fh.peek(1)[:1]:
                    return
                d = _zlib.decompressobj(wbits=31)
        if not d.eof:
            raise _Fallback  # truncated gzip


def intern_table(slots: int = 1 << 12, pool_bytes: int = 1 << 16) -> list:
    """An empty intern table for :func:`scan_events` (``slots`` a power of two)."""
    return [np.zeros(slots, np.int64), np.full(slots, -1, np.int64), np.empty(pool_bytes, np.uint8),
            np.empty(slots // 2, np.int64), np.empty(slots // 2, np.int64),
            np.array([0, 0, slots // 2 - 1], np.int64)]


def grow_table(t: list, pool_free: int = 0) -> None:
    """Grow the intern table ``t`` in place: twice the slots when half full, a pool with at
    least ``pool_free`` free bytes."""
    hs, ids, pool, off, ln, meta = t
    if meta[0] >= meta[2]:
        slots = 2 * len(hs)
        nh, ni = np.zeros(slots, np.int64), np.full(slots, -1, np.int64)
        rehash(hs, ids, nh, ni)
        t[0], t[1] = nh, ni
        t[3] = np.concatenate([off, np.empty(slots // 2 - len(off), np.int64)])
        t[4] = np.concatenate([ln, np.empty(slots // 2 - len(ln), np.int64)])
        meta[2] = slots // 2 - 1
    if len(pool) - meta[1] < pool_free:
        grown = np.empty(max(2 * len(pool), int(meta[1]) + pool_free), np.uint8)
        grown[: meta[1]] = pool[: meta[1]]
        t[2] = grown


def table_bytes(t, i: int) -> bytes:
    """The raw bytes of string ``i`` of the intern table ``t``."""
    a = int(t[3][i])
    return t[2][a: a + int(t[4][i])].tobytes()


class _Source:
    """``carry`` + the next block of the file, block by block (set ``carry`` in between).

    A plain file is read into one reused buffer (no fresh 4 MB string per block), and a
    gzip block is joined to the carry there; what is yielded may then be a view that the
    next block overwrites: keep copies only. Views are read-only, as ``bytes`` blocks are,
    so the scanner is compiled (and loaded from numba's cache) for one buffer type only.
    """

    def __init__(self, path: Path, on_bytes):
        self.path, self.on_bytes = path, on_bytes
        self.carry = b""

    def __iter__(self) -> Iterator:
        ba = bytearray(0)
        for blk in _blocks(self.path, self.on_bytes):
            if isinstance(blk, bytes):  # gzip: carry + block in the reused buffer too
                c = self.carry
                if not c:
                    yield blk
                    continue
                n, m = len(c), len(blk)
                if n + m > len(ba):
                    ba = bytearray(n + m)
                mv = memoryview(ba)
                mv[:n] = c
                mv[n: n + m] = blk
                yield mv[: n + m].toreadonly()
                continue
            while True:  # a plain file
                c = self.carry
                n = len(c)
                if n + BLOCK_BYTES > len(ba):
                    ba = bytearray(n + BLOCK_BYTES)
                mv = memoryview(ba)
                mv[:n] = c
                got = blk.readinto(mv[n: n + BLOCK_BYTES])
                if not got:
                    return
                if self.on_bytes:
                    self.on_bytes(got)
                yield mv[: n + got].toreadonly()


class _Names:
    """Ids of the scanner's intern table (raw strings) -> string ids, made on first use."""

    def __init__(self, intern):
        self.intern = intern
        self.table = intern_table()
        self.sid = np.zeros(0, np.int64)  # table id -> string id (-1: not decoded yet)

    def ids(self, tids: np.ndarray) -> np.ndarray:
        n = int(self.table[5][0])
        if len(self.sid) < n:
            self.sid = np.concatenate([self.sid, np.full(max(n, 2 * len(self.sid)) - len(self.sid), -1,
                                                         np.int64)])
        out = self.sid[tids]
        miss = out < 0
        if miss.any():
            new, first = np.unique(tids[miss], return_index=True)
            for t in new[np.argsort(first)].tolist():  # in order of first appearance
                raw = table_bytes(self.table, t)
                try:
                    s = msgspec.json.decode(b'"' + raw + b'"', type=str)
                except msgspec.DecodeError as exc:
                    raise _Fallback from exc  # bad escape / encoding: the general path says so
                self.sid[t] = self.intern(s)
            out = self.sid[tids]
        return out


def _decode_events(path: Path, data, rows: np.ndarray, js: np.ndarray, idx: np.ndarray) -> list:
    """The events of rows ``js`` decoded by msgspec, all in one call (one JSON array of their
    bytes); if that fails, one by one, so the first bad event is reported as it would be alone."""
    spans = list(zip(rows[K.EV_SPAN0, js].tolist(), rows[K.EV_SPAN1, js].tolist()))
    try:
        return _DEC_EVS.decode(b"[" + b",".join([data[a:b] for a, b in spans]) + b"]")
    except msgspec.MsgspecError:
        return [_decode_event(path, data, a, b, i) for (a, b), i in zip(spans, idx[js].tolist())]


def _decode_event(path: Path, data: bytes, a: int, b: int, idx: int) -> Event:
    try:
        return _DEC_EV.decode(data[a:b])
    except msgspec.ValidationError as exc:
        msg = str(exc)
        fld = msg.split("$")[-1].split("`")[0] if "$" in msg else "?"
        raise invalid_field(path, idx, fld, msg.split(" - at ")[0]) from exc
    except msgspec.DecodeError as exc:
        raise _Fallback from exc


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.loop = loop = EventLoop(path)
        loop.sorted = False
        self.names = _Names(loop.intern)
        self.cats: list[str] = []
        self.cat_ids = _Names(self._cat_intern)
        self.window_idx = -1
        # per name id flags, grown as names are interned
        self.nccl = np.zeros(0, bool)
        self.gloo = np.zeros(0, bool)
        self.commf = np.zeros(0, bool)
        self.memory = np.zeros(0, bool)

    def _cat_intern(self, s: str) -> int:
        self.cats.append(s)
        return len(self.cats) - 1

    def _name_flags(self) -> None:
        names = self.loop.strings.names
        n0 = len(self.nccl)
        if n0 == len(names):
            return
        new = names[n0:]
        self.nccl = np.asarray(self.loop.comm_kernel, bool)  # communication kernel names
        self.gloo = np.concatenate([self.gloo, [x.startswith("gloo:") for x in new]])
        self.commf = np.asarray(self.loop.comm_flag, bool)
        self.memory = np.concatenate([self.memory, [x == "[memory]" for x in new]])

    def block(self, data: bytes, buf: np.ndarray, rows: np.ndarray, first_idx: int) -> None:  # noqa: C901
        """Turn one scanner call's rows (events ``first_idx``...) into column parts."""
        loop, path = self.loop, self.path
        k = rows.shape[1]
        idx = np.arange(first_idx, first_idx + k, dtype=np.int64)
        flags = rows[K.EV_FLAGS]
        ph = rows[K.EV_PH]
        slow = (flags & K.F_SLOW) != 0
        need = K.F_TS | K.F_DUR | K.F_NAME | K.F_CAT | K.F_PID | K.F_TID
        is_x = ph == 88
        slow |= is_x & ((flags & need) != need)  # missing fields: the general path words it
        fast = ~slow
        is_x &= fast
        is_i = fast & ((ph == 105) | (ph == 73))
        n_flow = int((fast & ((ph == 115) | (ph == 102) | (ph == 116))).sum())
        if n_flow:
            loop.kept["flows"] += n_flow
        named = np.flatnonzero((is_x | is_i) & ((flags & K.F_NAME) != 0))
        nid = np.full(k, -1, np.int64)
        nid[named] = self.names.ids(rows[K.EV_NAME, named])
        xi = np.flatnonzero(is_x)
        if len(xi):
            cid = self.cat_ids.ids(rows[K.EV_CAT, xi])
        self._name_flags()
        keep: list[np.ndarray] = []
        if len(xi):
            codes = np.asarray([loop.cat_code.get(c) if c in loop.cat_code else
                                CAT_CODE.get(c.lower(), C_OTHER) for c in self.cats], np.int64)
            code = codes[cid]
            xn = nid[xi]
            # GPU ops
            g = code <= C_MEMSET
            if g.any():
                gi = xi[g]
                kind = code[g].astype(np.int8)
                coll = (kind == C_KERNEL) & self.nccl[xn[g]]
                kind[coll] = int(OpKind.COLLECTIVE)
                keep.append(gi[coll])
                dev = np.where(rows[K.EV_DEV, gi] != _NONE, rows[K.EV_DEV, gi], rows[K.EV_PID, gi])
                st = np.where(rows[K.EV_STREAM, gi] != _NONE, rows[K.EV_STREAM, gi], rows[K.EV_TID, gi])
                G = dict(dev=dev, stream=st, kind=kind, name=xn[g].astype(np.int32),
                         start=rows[K.EV_TS, gi], dur=rows[K.EV_DUR, gi],
                         corr=rows[K.EV_CORR, gi], ext=rows[K.EV_EXT, gi],
                         bytes=np.where(rows[K.EV_BYTES, gi] != _NONE, rows[K.EV_BYTES, gi], 0),
                         idx=idx[gi])
            else:
                G = _empty_g()
            # host events
            h = (code >= C_RUNTIME) & (code <= C_ANNOT)
            if h.any():
                hi = xi[h]
                hn = xn[h]
                hc = (code[h] - C_RUNTIME).astype(np.int8)
                gl = (hc == H_ANNOT) & self.gloo[hn]
                hc[gl] = H_GLOO
                keep.append(hi[gl | self.commf[hn]])
                H = dict(pid=rows[K.EV_PID, hi], tid=rows[K.EV_TID, hi], code=hc,
                         name=hn.astype(np.int32), start=rows[K.EV_TS, hi],
                         end=rows[K.EV_TS, hi] + rows[K.EV_DUR, hi], corr=rows[K.EV_CORR, hi],
                         ext=rows[K.EV_EXT, hi], idx=idx[hi])
            else:
                H = _empty_h()
            # other categories
            o = ~(g | h)
            GR = _empty_gr()
            if o.any():
                lower = np.asarray([c.lower() for c in self.cats], object)
                ocid = cid[o]
                oi = xi[o]
                lo = lower[ocid]
                sy = lo == "cuda_sync"
                if sy.any():
                    loop.syncs.extend(idx[oi[sy]].tolist())
                    keep.append(oi[sy])
                    loop.kept["sync_events"] += int(sy.sum())
                ga = lo == "gpu_user_annotation"
                if ga.any():
                    gai = oi[ga]
                    GR = dict(dev=np.where(rows[K.EV_DEV, gai] != _NONE, rows[K.EV_DEV, gai], rows[K.EV_PID, gai]),
                              stream=np.where(rows[K.EV_STREAM, gai] != _NONE, rows[K.EV_STREAM, gai],
                                              rows[K.EV_TID, gai]),
                              name=nid[oi[ga]].astype(np.int32), start=rows[K.EV_TS, gai],
                              end=rows[K.EV_TS, gai] + rows[K.EV_DUR, gai], idx=idx[oi[ga]])
                    loop.kept["ranges"] += int(ga.sum())
                tr = lo == "trace"
                if tr.any():
                    last = np.flatnonzero(tr)[-1]
                    i_last = int(idx[oi[last]])
                    if loop.window is None or i_last > loop.window[0]:
                        t0 = int(rows[K.EV_TS, oi[last]])
                        loop.window = (i_last, t0, t0 + int(rows[K.EV_DUR, oi[last]]))
                    loop.kept["markers"] += int(tr.sum())
                other = ~(sy | ga | tr)
                if other.any():
                    u, cnt = np.unique(ocid[other], return_counts=True)
                    for c, m in zip(u.tolist(), cnt.tolist(), strict=True):
                        loop.dropped[f"unsupported category '{self.cats[c]}'"] += m
            loop.parts.append((G, H, GR))
        # instant events: memory samples or markers
        ii = np.flatnonzero(is_i)
        if len(ii):
            fi = rows[K.EV_FLAGS, ii]
            nm = nid[ii]
            mem = ((fi & (K.F_ARGS | K.F_TS)) == (K.F_ARGS | K.F_TS)) & (nm >= 0)
            mem[mem] = self.memory[nm[mem]]
            if mem.any():
                mi = ii[mem]
                dt, di = rows[K.EV_DEVTYPE, mi], rows[K.EV_DEVID, mi]
                dev = np.where((dt != _NONE) & (dt != 0) & (di != _NONE), di, -1)
                mb = rows[K.EV_MEMBYTES, mi]
                ta, tr_ = rows[K.EV_TALLOC, mi], rows[K.EV_TRES, mi]
                loop.mem_parts.append(np.stack([
                    dev, rows[K.EV_TS, mi], np.where(mb != _NONE, mb, 0), np.where(ta != _NONE, ta, -1),
                    np.where(tr_ != _NONE, tr_, -1), idx[ii[mem]]], axis=1))
                loop.kept["memory"] += int(mem.sum())
            n_mark = int((~mem).sum())
            if n_mark:
                loop.kept["markers"] += n_mark
        # events kept whole (collectives, syncs, communication annotations)
        if keep:
            kj = np.sort(np.concatenate(keep))
            loop.keep.update(zip(idx[kj].tolist(), _decode_events(path, data, rows, kj, idx)))
        # events the scanner does not model: the general loop
        si = np.flatnonzero(slow)
        if len(si):
            loop.feed(zip(idx[si].tolist(), _decode_events(path, data, rows, si, idx)))
            loop.flush()
            self._name_flags()


def _empty_g() -> dict:
    z = np.zeros(0, np.int64)
    return dict(dev=z, stream=z, kind=z.astype(np.int8), name=z.astype(np.int32), start=z,
                dur=z, corr=z, ext=z, bytes=z, idx=z)


def _empty_h() -> dict:
    z = np.zeros(0, np.int64)
    return dict(pid=z, tid=z, code=z.astype(np.int8), name=z.astype(np.int32), start=z, end=z,
                corr=z, ext=z, idx=z)


def _empty_gr() -> dict:
    z = np.zeros(0, np.int64)
    return dict(dev=z, stream=z, name=z.astype(np.int32), start=z, end=z, idx=z)


def scanner_cached() -> bool:
    """Whether the scanner's kernel is compiled already (in this process or in numba's disk
    cache for this source), so that using it costs no compilation."""
    disp = K._scan_events
    if disp.signatures:
        return True
    try:  # numba's cache index (internal API); an empty index means "not cached"
        return bool(disp._cache._cache_file._load_index())
    except Exception:  # pragma: no cover - another numba layout: assume not cached
        return False


def parse_fast(path: Path, on_stage=None, on_bytes=None):
    """Read one Kineto file with the streaming scanner; None when it must be read the
    general way (see the module docstring). Raises TraceFormatError for bad events.

    ``on_stage(name)`` is called after reading ("read", "decode"); ``on_bytes(n)`` after
    each read of ``n`` bytes from disk (for a progress bar).
    """
    try:
        return _parse(Path(path), on_stage, on_bytes)
    except _Fallback:
        return None


def _parse(path: Path, on_stage, on_bytes):  # noqa: C901 - one streaming state machine
    reader = _Reader(path)
    out = np.empty((K.EV_FIELDS, ROWS), np.int64)
    src = _Source(path, on_bytes)
    phase = 0  # 0: before the array, 1: in it, 2: after it
    prefix = suffix = b""
    pos = state = 0
    n_ev = 0
    for data in src:
        if phase == 2:
            suffix += data
            continue
        buf = np.frombuffer(data, np.uint8)
        if phase == 0:
            a = find_array(buf, b"traceEvents")
            if a == -1:
                if len(data) > (256 << 20):
                    raise _Fallback  # a huge document head: let the general path decide
                src.carry = bytes(data)
                continue
            if a < 0:
                raise _Fallback
            prefix, pos, state, phase = bytes(data[:a]), a + 1, 0, 1
        while True:
            nt, ct = reader.names.table, reader.cat_ids.table
            for t in (nt, ct):
                if len(t[2]) - t[5][1] < len(buf) - pos:  # room for every string of the block
                    grow_table(t, len(buf) - pos)
            st, pos, state, k = K.scan_events(buf, pos, state, out, tuple(nt), tuple(ct))
            if k:
                reader.block(data, buf, out[:, :k], n_ev)
                n_ev += k
            if st == K.S_GROW:
                grow_table(reader.names.table)
                grow_table(reader.cat_ids.table)
                continue
            if st == K.S_FULL:
                continue
            break
        if st == K.S_ERROR:
            raise _Fallback
        if st == K.S_END:
            suffix, phase, src.carry = bytes(data[pos + 1:]), 2, b""
        else:
            src.carry, pos = bytes(data[pos:]), 0
    if phase != 2:
        raise _Fallback  # truncated, empty, or no events array
    if prefix.strip():
        try:
            doc = FILE_DECODER.decode(prefix + b"[]" + suffix)
        except msgspec.MsgspecError as exc:
            raise _Fallback from exc
        if doc.retimeExport is not None:
            raise _Fallback
    else:  # a bare list of events
        if suffix.strip():
            raise _Fallback
        doc = TraceFile(traceEvents=[])
    reader.loop.n_events = n_ev
    if on_stage:
        on_stage("read")
        on_stage("decode")
    return finish_part(path, doc, reader.loop)
