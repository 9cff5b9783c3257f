"""Streaming Kineto reader: the file is decompressed block by block and its events are
scanned by numba straight into columns (:func:`collectors.kineto._scan_kernels.scan_events`).

No Python object is made per event: the scanner writes one int64 row per event (the
event's byte span, ids of its ``name`` / ``cat``, ``pid``/``tid``, ``ts``/``dur`` as exact
integer ns, and the ``args`` fields the reader uses), and a second kernel
(:func:`collectors.kineto._rows_kernels.split_rows`, one pass per block) sorts the rows into
the same column parts that :class:`collectors.kineto.links.EventLoop` makes. Events
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
reused buffer, or mapped (``mapped=True``: in ingest's worker processes only, see
:func:`_map`); gzip is inflated with ISA-L (``isal``) when installed.
"""

from __future__ import annotations

import io
import mmap
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np

from . import _rows_kernels as R
from . import _scan_kernels as K
from ._scan_cold import find_array, rehash

try:  # ISA-L inflates gzip ~2.4x faster than zlib, with the same interface
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the stand-in
    _zlib = zlib
from .drift import invalid_field
from .links import EventLoop, finish_part
from .schema import (
    C_ANNOT,
    C_MEMSET,
    C_OTHER,
    C_RUNTIME,
    CAT_CODE,
    FILE_DECODER,
    Event,
    TraceFile,
    drop_cat_reason,
)

__all__ = ["parse_fast", "BLOCK_BYTES", "scanner_cached"]

#: decompressed bytes per block
BLOCK_BYTES = 4 << 20
#: rows per scanner call
ROWS = 1 << 16
_DEC_EV = msgspec.json.Decoder(Event)
_DEC_EVS = msgspec.json.Decoder(list[Event])


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

    A plain file is read into one reused buffer (no fresh 4 MB string per block) or, with
    ``mapped``, mapped (:meth:`_windows`), and a gzip block is joined to the carry there; what is yielded may then be a view that the
    next block overwrites: keep copies only. Views are read-only, as ``bytes`` blocks are,
    so the scanner is compiled (and loaded from numba's cache) for one buffer type only.
    """

    def __init__(self, path: Path, on_bytes, mapped: bool = False):
        self.path, self.on_bytes, self.mapped = path, on_bytes, mapped
        self.carry = b""

    def __iter__(self) -> Iterator:
        ba = bytearray(0)
        for blk in _blocks(self.path, self.on_bytes):
            if self.mapped and not isinstance(blk, bytes) and (mm := _map(blk)) is not None:
                yield from self._windows(mm)
                return
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


    def _windows(self, mm: mmap.mmap) -> Iterator:
        """A mapped plain file's blocks: the same ``carry`` + next ``BLOCK_BYTES`` as a read
        gives, as read-only views of the mapping (the carry is always the tail of the block
        before, so each block starts where its carry did in the file: nothing is copied)."""
        size, end = len(mm), 0
        mv = memoryview(mm)
        del mm  # the mapping lives as long as views of it (the scanner's arrays) do
        while end < size:
            start = end - len(self.carry)
            got = min(BLOCK_BYTES, size - end)
            end += got
            if self.on_bytes:
                self.on_bytes(got)
            yield mv[start:end]


def _map(fh) -> mmap.mmap | None:
    """The file ``fh`` mapped read-only, or None where it cannot be (empty, not a regular
    file): reading then copies it into a buffer instead.

    Mapping instead of reading saves the kernel's copy of every byte (54.6 MB per rank of
    bench/scale.py: ~7 ms of system CPU of a ~100 ms parse). A file truncated by another
    process while it is mapped makes the reading process fault (SIGBUS), which no handler
    can turn into an error message: so only ingest's worker processes map files
    (:func:`collectors.rankwise.ingest_kineto`), where the parent sees a dead worker and
    says so in one line; every other reader (a single file, ``retime.load``, Dask) reads."""
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


class _Names:
    """Ids of the scanner's intern table (raw strings) -> string ids, made on first use."""

    def __init__(self, intern):
        self.intern = intern
        self.table = intern_table()
        self.sid = np.zeros(0, np.int64)  # table id -> string id (-1: not decoded yet)

    def cover(self) -> None:
        """Make :attr:`sid` cover every id of the table."""
        n = int(self.table[5][0])
        if len(self.sid) < n:
            self.sid = np.concatenate([self.sid, np.full(max(n, 2 * len(self.sid)) - len(self.sid), -1,
                                                         np.int64)])

    def add(self, new: np.ndarray) -> None:
        """Decode and intern the table ids ``new`` (not mapped yet), in this order."""
        for t in new.tolist():
            raw = table_bytes(self.table, t)
            try:
                s = msgspec.json.decode(b'"' + raw + b'"', type=str)
            except msgspec.DecodeError as exc:
                raise _Fallback from exc  # bad escape / encoding: the general path says so
            self.sid[t] = self.intern(s)


def _decode_events(path: Path, data, rows: np.ndarray, js: np.ndarray, first_idx: int) -> list:
    """The events of rows ``js`` decoded by msgspec, all in one call (one JSON array of their
    bytes); if that fails, one by one, so the first bad event is reported as it would be alone."""
    s0, s1 = rows[K.EV_SPAN0, js], rows[K.EV_SPAN1, js]
    try:
        return _DEC_EVS.decode(R.gather_spans(np.frombuffer(data, np.uint8), s0, s1))
    except msgspec.MsgspecError:
        return [_decode_event(path, data, a, b, i) for a, b, i in
                zip(s0.tolist(), s1.tolist(), (js + first_idx).tolist(), strict=True)]


def _decode_event(path: Path, data: bytes, a: int, b: int, idx: int) -> Event:
    try:
        return _DEC_EV.decode(data[a:b])
    except msgspec.ValidationError as exc:
        msg = str(exc)
        fld = msg.split("$")[-1].split("`")[0] if "$" in msg else "?"
        raise invalid_field(path, idx, fld, msg.split(" - at ")[0]) from exc
    except msgspec.DecodeError as exc:
        raise _Fallback from exc


_OTHER_CATS = {"cuda_sync": R.X_SYNC, "gpu_user_annotation": R.X_GANNOT, "trace": R.X_TRACE}


class _Cats:
    """Category strings in order of first use and their classes in R.split_rows; called to
    intern one (as :class:`_Names` does)."""

    def __init__(self, cat_code: dict):
        self.cat_code = cat_code
        self.names: list[str] = []
        self.classes: list[int] = []

    def __call__(self, s: str) -> int:
        code = self.cat_code.get(s) if s in self.cat_code else CAT_CODE.get(s.lower(), C_OTHER)
        if not (code <= C_MEMSET or C_RUNTIME <= code <= C_ANNOT):  # neither GPU op nor host
            code = _OTHER_CATS.get(s.lower(), R.X_OTHER)
        self.names.append(s)
        self.classes.append(code)
        return len(self.names) - 1


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.loop = loop = EventLoop(path)
        loop.sorted = False
        self.names = _Names(loop.intern)
        self.cats = _Cats(loop.cat_code)
        self.cat_ids = _Names(self.cats)  # not a bound method of self: no reference cycle
        self.ccode = np.zeros(0, np.int64)  # category table id -> class (-1: not mapped)
        self.nflag = np.zeros(0, np.uint8)  # per string id: R.N_* bits

    def _name_flags(self) -> None:
        loop = self.loop
        names = loop.strings.names
        n0 = len(self.nflag)
        if n0 == len(names):
            return
        ck, cf = loop.comm_kernel, loop.comm_flag
        new = [(R.N_COMM_KERNEL if ck[i] else 0) | (R.N_GLOO if x.startswith("gloo:") else 0)
               | (R.N_COMM_RANGE if cf[i] else 0) | (R.N_MEMORY if x == "[memory]" else 0)
               for i, x in enumerate(names[n0:], n0)]
        self.nflag = np.concatenate([self.nflag, np.asarray(new, np.uint8)])

    def block(self, data: bytes, rows: np.ndarray, k: int, first_idx: int) -> None:
        """Turn one scanner call's rows (the first ``k`` of ``rows``: events ``first_idx``...)
        into column parts (:func:`collectors.kineto._rows_kernels.split_rows`)."""
        loop, path = self.loop, self.path
        names, cats = self.names, self.cat_ids
        names.cover()
        cats.cover()
        new_n, new_c = R.new_ids(rows, k, names.sid, cats.sid)
        if len(new_n):
            names.add(new_n)
        if len(new_c):
            cats.add(new_c)
        if len(self.ccode) != len(cats.sid) or len(new_c):
            cls = np.asarray(self.cats.classes + [-1], np.int64)
            self.ccode = cls[cats.sid]  # -1 (unmapped) picks the trailing -1
        self._name_flags()
        g, h, gr, mem, keep, syncs, slow, drop, cnt = R.split_rows(
            rows, k, first_idx, names.sid, self.ccode, self.nflag)
        kept = loop.kept
        if cnt[R.CNT_FLOWS]:
            kept["flows"] += int(cnt[R.CNT_FLOWS])
        if cnt[R.CNT_SYNCS]:
            loop.syncs.extend(syncs.tolist())
            kept["sync_events"] += int(cnt[R.CNT_SYNCS])
        if cnt[R.CNT_RANGES]:
            kept["ranges"] += int(cnt[R.CNT_RANGES])
        if cnt[R.CNT_TRACE]:
            j = int(cnt[R.CNT_LAST_TRACE])
            i_last = first_idx + j
            if loop.window is None or i_last > loop.window[0]:
                t0 = int(rows[K.EV_TS, j])
                loop.window = (i_last, t0, t0 + int(rows[K.EV_DUR, j]))
            kept["markers"] += int(cnt[R.CNT_TRACE])
        dr = np.flatnonzero(drop)
        if len(dr):
            for t in dr[np.argsort(cats.sid[dr], kind="stable")].tolist():
                loop.dropped[drop_cat_reason(self.cats.names[cats.sid[t]])] += int(drop[t])
        if g.shape[1] or h.shape[1] or gr.shape[1]:
            G = dict(dev=g[0], stream=g[1], kind=g[2].astype(np.int8), name=g[3].astype(np.int32),
                     start=g[4], dur=g[5], corr=g[6], ext=g[7], bytes=g[8], idx=g[9])
            H = dict(pid=h[0], tid=h[1], code=h[2].astype(np.int8), name=h[3].astype(np.int32),
                     start=h[4], end=h[5], corr=h[6], ext=h[7], idx=h[8])
            GR = dict(dev=gr[0], stream=gr[1], name=gr[2].astype(np.int32), start=gr[3],
                      end=gr[4], idx=gr[5])
            loop.parts.append((G, H, GR))
        if cnt[R.CNT_MEMORY]:
            loop.mem_parts.append(mem)
            kept["memory"] += int(cnt[R.CNT_MEMORY])
        if cnt[R.CNT_MARKERS]:
            kept["markers"] += int(cnt[R.CNT_MARKERS])
        # events kept whole (collectives, syncs, communication annotations)
        if len(keep):
            loop.keep.update(zip((keep + first_idx).tolist(),
                                 _decode_events(path, data, rows, keep, first_idx)))
        # events the scanner does not model: the general loop
        if len(slow):
            loop.feed(zip((slow + first_idx).tolist(),
                          _decode_events(path, data, rows, slow, first_idx)))
            loop.flush()
            self._name_flags()


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


def parse_fast(path: Path, on_stage=None, on_bytes=None, mapped: bool = False):
    """Read one Kineto file with the streaming scanner; None when it must be read the
    general way (see the module docstring). Raises TraceFormatError for bad events.

    ``on_stage(name)`` is called after reading ("read", "decode"); ``on_bytes(n)`` after
    each read of ``n`` bytes from disk (for a progress bar).
    """
    try:
        return _parse(Path(path), on_stage, on_bytes, mapped)
    except _Fallback:
        return None


def _parse(path: Path, on_stage, on_bytes, mapped):  # noqa: C901 - one streaming state machine
    reader = _Reader(path)
    out = np.empty((K.EV_FIELDS, ROWS), np.int64)
    src = _Source(path, on_bytes, mapped)
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
                reader.block(data, out, k, n_ev)
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
