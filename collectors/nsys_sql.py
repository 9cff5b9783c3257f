"""Nsight Systems SQLite access: table names, connections (Arrow via ADBC when installed,
else the standard library), typed fetches and small vectorized helpers used by
:mod:`collectors.nsys`."""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .collectives import comm_op_from_name
from .enums import CommOp
from .errors import TraceFormatError
from .kernel_classes import is_comm_kernel

try:  # Arrow-native SQLite reader (C): 5-10x faster than building Python row tuples
    from adbc_driver_sqlite import dbapi as _adbc
except ImportError:  # pragma: no cover - the stdlib path below is equivalent, only slower
    _adbc = None

REQUIRED_TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL")
EXPORT_COMMAND = ("nsys export --type sqlite --output REPORT.sqlite REPORT.nsys-rep "
                  "(profile with `nsys profile --trace cuda,nvtx ...`)")

_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
_NVTX = "NVTX_EVENTS"

# torch.autograd.profiler.emit_nvtx labels ops "name, seq = N, op_id = M, sizes = [...]"; keep
# the name (as Kineto's record_function names are) so ranges group by op, and so millions of
# unique labels do not each become a string (done in SQLite: C speed, less data moved)
_NVTX_NAME = ("case when instr(text, ', seq = ') > 0 then substr(text, 1, instr(text, ', seq = ') - 1) "
              "when instr(text, ', op_id = ') > 0 then substr(text, 1, instr(text, ', op_id = ') - 1) "
              "when instr(text, ', sizes = ') > 0 then substr(text, 1, instr(text, ', sizes = ') - 1) "
              "else coalesce(text, '') end")
_TID_MASK = 0xFFFFFF
_PUSHPOP, _STARTEND, _MARK = 59, 60, 34  # ENUM_NSYS_EVENT_TYPE ids
_SYNC_EVENT, _SYNC_WAIT, _SYNC_STREAM, _SYNC_CONTEXT = 1, 2, 3, 4  # ENUM_CUPTI_SYNC_TYPE

_COPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD",
              7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
             5: "Device Static", 6: "Managed Static", 7: "Unknown"}


def missing_tables(path: str | os.PathLike[str]) -> list[str]:
    """Tables of :data:`REQUIRED_TABLES` that the SQLite file ``path`` lacks."""
    with _connect(Path(path)) as con:
        have = _tables(con)
    return [t for t in REQUIRED_TABLES if t not in have]


def _uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro"


def _connect(path: Path) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(_uri(path), uri=True)
        con.execute("select 1 from sqlite_master limit 1")
    except sqlite3.Error as exc:
        raise TraceFormatError(f"{path}: not a readable SQLite file ({exc}); re-export it with "
                               f"`{EXPORT_COMMAND}`") from exc
    return con


class _Conn:
    """A read-only export: stdlib sqlite3 for small queries, ADBC (Arrow) for event tables."""

    def __init__(self, path: Path) -> None:
        self.sql = _connect(path)
        self._adbc = None
        if _adbc is not None:
            try:
                self._adbc = _adbc.connect(_uri(path))
            except Exception:  # noqa: BLE001 - any driver problem: use the stdlib path
                self._adbc = None

    def execute(self, sql: str):
        return self.sql.execute(sql)

    def arrow(self, sql: str) -> pa.Table:
        """Run ``sql`` into an Arrow table (columns named c0, c1, ...)."""
        if self._adbc is not None:
            try:
                with self._adbc.cursor() as cur:
                    cur.execute(sql)
                    t = cur.fetch_arrow_table()
                return t.rename_columns([f"c{i}" for i in range(t.num_columns)])
            except Exception:  # noqa: BLE001 - ADBC types a column from its first rows and
                pass  # fails on a later type change; the stdlib path reads any table
        cur = self.sql.execute(sql)
        ncols = len(cur.description)
        rows = cur.fetchall()
        cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(ncols)]
        return pa.table({f"c{i}": pa.array(c) for i, c in enumerate(cols)})

    def close(self) -> None:
        self.sql.close()
        if self._adbc is not None:
            self._adbc.close()


def _fetch(path: Path, sql: str) -> pa.Table:
    """``sql`` on a connection of its own (runs in a worker thread)."""
    con = _Conn(path)
    try:
        return con.arrow(sql)
    finally:
        con.close()


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("select name from sqlite_master where type in ('table','view')")}


def _columns(con, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'pragma table_info("{table}")')}


def _ints(con: _Conn, sql: str, ncols: int) -> np.ndarray:
    """Run ``sql`` (integer columns, NULLs coalesced) into an (n, ncols) int64 array."""
    t = con.arrow(sql)
    if t.num_rows == 0:
        return np.zeros((0, ncols), np.int64)
    return _int_columns(t, ncols)


def _int_columns(t: pa.Table, ncols: int) -> np.ndarray:
    """The first ``ncols`` columns of ``t`` as an (n, ncols) int64 array, one copy each."""
    out = np.empty((t.num_rows, ncols), np.int64)
    for i in range(ncols):
        col = t.column(i)
        if col.null_count or col.type != pa.int64():
            col = pc.fill_null(col, -1).cast(pa.int64())
        pos = 0
        for ch in col.chunks:  # zero-copy views of each chunk, copied once into place
            out[pos:pos + len(ch), i] = ch.to_numpy()
            pos += len(ch)
    return out


def _comm_op_of(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(is_comm, comm_op) for kernel names (small: one entry per distinct name); what is
    communication: :func:`collectors.kernel_classes.is_comm_kernel`."""
    is_nccl = np.array([is_comm_kernel(n) for n in names], bool)
    comm = np.array([int(comm_op_from_name(n.removeprefix("void ")) if c else CommOp.NONE)
                     for n, c in zip(names, is_nccl, strict=True)], np.int8)
    return is_nccl, comm


def _uinv(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` by hashing: O(n) for the few distinct values
    (lanes, names, ranks) of millions of events, instead of sorting them all."""
    codes, uniq = pd.factorize(x, sort=False)
    uniq = np.asarray(uniq)
    order = np.argsort(uniq, kind="stable")
    remap = np.empty(len(uniq), np.int64)
    remap[order] = np.arange(len(uniq))
    return uniq[order], remap[codes]


def _depth(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of ranges on their lane (0 = outermost), vectorized."""
    n = len(lane)
    if n == 0:
        return np.zeros(0, np.int16)
    t0 = int(min(start.min(), end.min()))
    span = int(max(start.max(), end.max())) - t0 + 1
    if (int(lane.max()) + 1) * span >= 2**62:  # pragma: no cover - absurd spans
        return np.zeros(n, np.int16)
    ln = lane.astype(np.int64)
    ks = ln * span + (start - t0)
    ke = np.sort(ln * span + (end - t0))
    order = np.argsort(ks, kind="stable")
    sk = ks[order]
    if (sk[1:] == sk[:-1]).any():  # equal starts on a lane: the longer range is the parent
        order = np.lexsort((start - end, ks))
    # (ranges started before i on its lane, in (lane, start, -end) order) minus (ranges on
    # its lane that ended at or before start_i); both sorts are lane-major, so the offset of a
    # lane in either is the number of ranges on lower lanes
    rank_in_order = np.empty(n, np.int64)
    rank_in_order[order] = np.arange(n)
    lane_first = np.concatenate([[0], np.cumsum(np.bincount(ln))])[ln]
    before = rank_in_order - lane_first
    closed = np.searchsorted(ke, ks, side="right") - lane_first
    return np.clip(before - closed, 0, 2**15 - 1).astype(np.int16)
