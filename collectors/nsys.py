"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> :class:`Trace`.

What is read (every row of every event table read is kept or dropped with a counted reason in
``meta["accounting"][path]``; lookup tables such as ``StringIds``, ``ThreadNames``,
``PROCESSES``, ``TARGET_INFO_*`` and ``ENUM_*`` are metadata, not events):

``CUPTI_ACTIVITY_KIND_KERNEL``   GPU kernels -> ``KERNEL`` ops (``COLLECTIVE`` / ``P2P`` for NCCL)
``CUPTI_ACTIVITY_KIND_MEMCPY``   -> ``MEMCPY`` ops (``bytes``)
``CUPTI_ACTIVITY_KIND_MEMSET``   -> ``MEMSET`` ops (``bytes``)
``CUPTI_ACTIVITY_KIND_RUNTIME``  CUDA runtime/driver calls -> ``RUNTIME`` ops on CPU_THREAD lanes
``NVTX_EVENTS``                  push/pop and start/end ranges -> ``ranges`` (marks are dropped)
``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION``  blocking syncs -> ``SYNC`` edges
``CUPTI_ACTIVITY_KIND_CUDA_EVENT``       (optional) event records, to resolve event syncs

NVTX names: registered strings resolve through ``StringIds``; torch ``emit_nvtx`` labels
(``"aten::mm, seq = 3, op_id = 7, sizes = [...]"``) keep only the op name, as Kineto names do.

Speed: event tables are read into Arrow by the ADBC SQLite driver (``adbc-driver-sqlite``;
the stdlib ``sqlite3`` path is used when it is missing), the NVTX table on a second connection
in parallel; everything after that is vectorized numpy/pandas/Arrow (``bench/nsys_ingest.py``).

Tables nsys creates lazily (MEMSET, SYNCHRONIZATION, NVTX_EVENTS, CUDA_EVENT, TARGET_INFO_GPU,
even RUNTIME) may be absent; they are treated as empty.  ``StringIds`` and
``CUPTI_ACTIVITY_KIND_KERNEL`` are required (see :func:`missing_tables`).

Ranks: one per (process, device) pair that has GPU activity, numbered by (device, pid) within
a file, files concatenated in the order given.  A process's runtime calls and NVTX ranges
belong to the rank of its busiest device.  Processes without GPU activity (launchers, shells)
are dropped and counted.  ``globalTid``/``globalPid`` are nsys serialized ids: bits 24..47 hold
the pid, bits 0..23 the tid; ``globalTid & ~0xFFFFFF`` is the owning ``globalPid``.

Timestamps stay exact integer nanoseconds of the session clock; with several files each is
shifted by its ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` relative to the earliest file
(``meta["clock_offsets_ns"]``).

Edges (conventions shared with the Kineto reader):

- ``HOST_ORDER`` between consecutive runtime calls on one thread, ``lag_ns`` = measured gap
  clamped at 0.
- ``LAUNCH`` runtime call -> GPU op with the same ``correlationId`` in the same process,
  ``lag_ns = min(0, gpu_start - launch_end)``.
- ``SYNC`` for blocking synchronizations (stream / context / event synchronize; event *queries*
  never block and are dropped): from the last GPU op that finished before the call returned
  (on the synchronized stream; on the whole device for context syncs and for event syncs whose
  event record is unknown) to the next runtime call on the same thread, ``lag_ns`` 0.
  ``cudaStreamWaitEvent`` (GPU-side wait) becomes a SYNC edge from the last op launched on the
  recording stream before ``cudaEventRecord`` to the first op launched on the waiting stream
  after the wait, when ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` identifies the record; otherwise it
  is dropped as ``stream_wait_event_record_unknown``.

NCCL/RCCL kernels (name starting ``nccl``/``rccl``) become ``COLLECTIVE`` ops (``P2P`` for
send-only or recv-only kernels), ``comm_op`` from the name
(:func:`collectors.collectives.comm_op_from_name`).  Exports carry no communicator ids, so
every rank of the trace is one inferred group (``groups`` row 0) and
:func:`collectors.collectives.match_collectives` pairs the k-th op of each ``comm_op`` on every
rank (GPU start order) into one ``coll_id``; ``meta["collectives"]`` counts instances
(``matched``/``unmatched`` with reasons) and their ops, as for Kineto traces.
``meta["devices"]`` is ``{rank: {device: {...}}}`` with ``TARGET_INFO_GPU`` properties and
peak rates when the GPU is known.
"""

from __future__ import annotations

import os
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .collectives import match_collectives
from .devices import device_peaks
from .enums import CommOp, LaneKind, OpKind
from .errors import TraceFormatError
from .nsys_comm import primitives_from_nvtx, primitives_from_peers
from .nsys_edges import nsys_edges
from .nsys_sql import (  # noqa: F401 - missing_tables, REQUIRED_TABLES, EXPORT_COMMAND re-exported
    _COPY_KIND,
    _EVENT,
    _KERNEL,
    _MARK,
    _MEM_KIND,
    _MEMCPY,
    _MEMSET,
    _NVTX,
    _NVTX_NAME,
    _PUSHPOP,
    _RUNTIME,
    _STARTEND,
    _SYNC,
    _SYNC_CONTEXT,
    _SYNC_EVENT,
    _SYNC_STREAM,
    _SYNC_WAIT,
    _TID_MASK,
    EXPORT_COMMAND,
    REQUIRED_TABLES,
    _columns,
    _comm_op_of,
    _Conn,
    _depth,
    _fetch,
    _int_columns,
    _ints,
    _tables,
    _uinv,
    missing_tables,
)
from .progress import progress_bar
from .trace import StringTable, Trace

__all__ = ["read_nsys", "missing_tables", "REQUIRED_TABLES", "EXPORT_COMMAND"]

class _File:
    """Everything read from one export, before ranks of all files are combined."""

    def __init__(self, path: Path, rank0: int, strings: StringTable, bar) -> None:
        self.path = path
        self.acc: dict[str, Any] = {"events_read": 0, "kept": {}, "dropped": {}}
        con = _Conn(path)
        try:
            self._read(con, rank0, strings, bar)
        except sqlite3.Error as exc:
            raise TraceFormatError(f"{path}: SQLite error while reading the nsys export ({exc}); "
                                   f"re-export it with `{EXPORT_COMMAND}`") from exc
        finally:
            con.close()

    # -------------------------------------------------------------- accounting
    def _read_n(self, n: int) -> None:
        self.acc["events_read"] += int(n)

    def _keep(self, table: str, n: int) -> None:
        if n:
            self.acc["kept"][table] = self.acc["kept"].get(table, 0) + int(n)

    def _drop(self, reason: str, n: int) -> None:
        if n:
            self.acc["dropped"][reason] = self.acc["dropped"].get(reason, 0) + int(n)

    def _rank_of_process(self, gpid: np.ndarray) -> np.ndarray:
        """Primary rank of each globalPid as float64 (NaN: a process without GPU activity)."""
        k = self._proc_keys
        if len(k) <= 16:  # the usual case: a few processes, a few vector compares
            out = np.full(len(gpid), np.nan)
            for key, r in zip(k, self._proc_ranks, strict=True):
                out[gpid == key] = r
            return out
        pos = np.clip(np.searchsorted(k, gpid), 0, len(k) - 1)
        return np.where(k[pos] == gpid, self._proc_ranks[pos].astype(np.float64), np.nan)

    # -------------------------------------------------------------- reading
    def _read(self, con: _Conn, rank0: int, strings: StringTable, bar) -> None:
        have = _tables(con)
        miss = [t for t in REQUIRED_TABLES if t not in have]
        if miss:
            raise TraceFormatError(
                f"{self.path}: SQLite export lacks table(s) {', '.join(miss)} needed for GPU "
                f"kernels; export with `{EXPORT_COMMAND}`")
        self.session_utc_ns = None
        if "TARGET_INFO_SESSION_START_TIME" in have:
            r = con.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
            self.session_utc_ns = int(r[0]) if r and r[0] is not None else None
        # the NVTX table is usually the largest: fetch it on a second connection meanwhile
        nvtx = None
        if _NVTX in have:
            pool = ThreadPoolExecutor(1)
            nvtx = pool.submit(_fetch, self.path, f"select start, coalesce(end,-1), eventType, "
                               f"coalesce(globalTid,-1), coalesce(textId,-1), {_NVTX_NAME} "
                               f"from {_NVTX}")
            pool.shutdown(wait=False)
        sid = dict(con.execute("select id, value from StringIds"))

        # ---- GPU activity: kind, start, end, device, stream, corr, gpid, name_sid/aux, bytes
        parts = []
        kcols = _columns(con, _KERNEL)
        kname = "demangledName" if "demangledName" in kcols else "shortName"
        k = _ints(con, f"select start, end, deviceId, streamId, coalesce(correlationId,-1), "
                       f"coalesce(globalPid,-1), {kname} from {_KERNEL}", 7)
        self._read_n(len(k))
        parts.append((OpKind.KERNEL, k[:, :6], k[:, 6], np.zeros(len(k), np.int64), _KERNEL))
        bar.advance()
        if _MEMCPY in have:
            m = _ints(con, f"select start, end, deviceId, streamId, coalesce(correlationId,-1), "
                           f"coalesce(globalPid,-1), copyKind*64 + coalesce(srcKind,7)*8 + "
                           f"coalesce(dstKind,7), bytes from {_MEMCPY}", 8)
            self._read_n(len(m))
            parts.append((OpKind.MEMCPY, m[:, :6], m[:, 6], m[:, 7], _MEMCPY))
        if _MEMSET in have:
            cols = _columns(con, _MEMSET)
            mk = "coalesce(memKind,7)" if "memKind" in cols else "7"
            s = _ints(con, f"select start, end, deviceId, streamId, coalesce(correlationId,-1), "
                           f"coalesce(globalPid,-1), {mk}, bytes from {_MEMSET}", 8)
            self._read_n(len(s))
            parts.append((OpKind.MEMSET, s[:, :6], s[:, 6], s[:, 7], _MEMSET))
        bar.advance()

        # names: kernels by StringIds, memcpy/memset by kind codes
        kinds, cols, names, nbytes, table = [], [], [], [], []
        comm_all = []
        for kind, arr, aux, b, _tbl in parts:
            u, inv = _uinv(aux)
            if kind == OpKind.KERNEL:
                txt = [str(sid.get(int(x), f"kernel#{int(x)}")) for x in u]
                is_nccl, comm = _comm_op_of(txt)
                kk = np.where(is_nccl, int(OpKind.COLLECTIVE), int(OpKind.KERNEL)).astype(np.int8)
                p2p = np.isin(comm, [int(CommOp.SEND), int(CommOp.RECV)])
                kk[p2p] = int(OpKind.P2P)
                kinds.append(kk[inv])
                comm_all.append(comm[inv])
            elif kind == OpKind.MEMCPY:
                txt = [f"Memcpy {_COPY_KIND.get(int(x) // 64, 'Unknown')} "
                       f"({_MEM_KIND.get(int(x) // 8 % 8, 'Unknown')} -> "
                       f"{_MEM_KIND.get(int(x) % 8, 'Unknown')})" for x in u]
                kinds.append(np.full(len(arr), int(kind), np.int8))
                comm_all.append(np.zeros(len(arr), np.int8))
            else:
                txt = [f"Memset ({_MEM_KIND.get(int(x), 'Unknown')})" for x in u]
                kinds.append(np.full(len(arr), int(kind), np.int8))
                comm_all.append(np.zeros(len(arr), np.int8))
            ids = np.array([strings.intern(t) for t in txt], np.int32)
            names.append(ids[inv] if len(u) else np.zeros(0, np.int32))
            cols.append(arr)
            nbytes.append(b)
            table.append(np.full(len(arr), len(table), np.int8))
        tables = [p[4] for p in parts]
        g = np.concatenate(cols)
        gkind = np.concatenate(kinds)
        gname = np.concatenate(names)
        gbytes = np.concatenate(nbytes)
        gtable = np.concatenate(table)
        gcomm = np.concatenate(comm_all)
        bad = g[:, 1] < g[:, 0]
        for i, tbl in enumerate(tables):
            self._drop(f"{tbl.lower()}_end_before_start", int((bad & (gtable == i)).sum()))
        if bad.any():
            ok = ~bad
            g, gkind, gname, gbytes, gtable, gcomm = (x[ok] for x in (g, gkind, gname, gbytes,
                                                                     gtable, gcomm))
        for i, tbl in enumerate(tables):
            self._keep(tbl, int((gtable == i).sum()))

        # ---- ranks: (process, device) pairs, by (device, pid)
        pkey = ((g[:, 5] >> 24) << 8) | (g[:, 2] & 0xFF)
        pu, pinv = _uinv(pkey)
        pn = np.bincount(pinv, minlength=len(pu))
        cnt = pd.DataFrame({"gpid": (pu >> 8) << 24, "dev": pu & 0xFF, "n": pn})
        cnt["pid"] = (cnt["gpid"].to_numpy() >> 24) & _TID_MASK
        cnt["u"] = np.arange(len(cnt))
        cnt = cnt.sort_values(["dev", "pid", "gpid"], kind="stable").reset_index(drop=True)
        cnt["rank"] = np.arange(len(cnt), dtype=np.int64) + rank0
        self.n_ranks = len(cnt)
        self.pairs = cnt
        rank_of_u = np.empty(len(cnt), np.int64)
        rank_of_u[cnt["u"].to_numpy()] = cnt["rank"].to_numpy()
        grank = rank_of_u[pinv]
        # process -> primary rank (busiest device), looked up by sorted globalPid
        prim = cnt.sort_values(["n", "rank"], ascending=[False, True]).drop_duplicates("gpid")
        prim = prim.sort_values("gpid")
        self._proc_keys = prim["gpid"].to_numpy(np.int64)
        self._proc_ranks = prim["rank"].to_numpy(np.int64)
        self.gpu = pd.DataFrame({
            "rank": grank, "device": g[:, 2], "stream": g[:, 3], "corr": g[:, 4], "gpid": g[:, 5],
            "start": g[:, 0], "end": g[:, 1], "kind": gkind, "name_id": gname, "bytes": gbytes,
            "comm_op": gcomm}, copy=False)

        # ---- runtime calls
        if _RUNTIME in have:
            r = _ints(con, f"select start, end, coalesce(globalTid,-1), coalesce(correlationId,-1), "
                           f"nameId from {_RUNTIME}", 5)
        else:
            r = np.zeros((0, 5), np.int64)
        self._read_n(len(r))
        rgpid = r[:, 2] & ~np.int64(_TID_MASK)
        rrank = self._rank_of_process(rgpid)
        okr = ~np.isnan(rrank) & (r[:, 1] >= r[:, 0])
        self._drop("runtime_process_without_gpu_activity", int(np.isnan(rrank).sum()))
        self._drop("runtime_end_before_start", int((~np.isnan(rrank) & (r[:, 1] < r[:, 0])).sum()))
        if not okr.all():
            r, rgpid, rrank = r[okr], rgpid[okr], rrank[okr]
        rrank = rrank.astype(np.int64)
        self._keep(_RUNTIME, len(r))
        u, inv = _uinv(r[:, 4])
        ids = np.array([strings.intern(re.sub(r"_v\d+$", "", str(sid.get(int(x), f"api#{int(x)}"))))
                        for x in u], np.int32)
        self.rt = pd.DataFrame({"rank": rrank, "tid": r[:, 2], "gpid": rgpid, "corr": r[:, 3],
                                "start": r[:, 0], "end": r[:, 1],
                                "name_id": ids[inv] if len(u) else np.zeros(0, np.int32)}, copy=False)
        bar.advance()

        # ---- NVTX ranges; names are kept as an Arrow dictionary and interned in bulk later
        self.nv = pd.DataFrame({c: np.zeros(0, np.int64) for c in ("rank", "tid", "start", "end",
                                                                   "ncode")})
        self.nv_names = pa.array([], pa.string())
        if nvtx is not None:
            t = nvtx.result()
            n = t.num_rows
            self._read_n(n)
            if n:
                a = _int_columns(t, 5)
                is_range = np.isin(a[:, 2], [_PUSHPOP, _STARTEND])
                self._drop("nvtx_mark", int((a[:, 2] == _MARK).sum()))
                self._drop("nvtx_not_a_range", int((~is_range & (a[:, 2] != _MARK)).sum()))
                unended = is_range & (a[:, 1] < a[:, 0])
                self._drop("nvtx_unended_range", int(unended.sum()))
                nrank = self._rank_of_process(a[:, 3] & ~np.int64(_TID_MASK))
                noproc = is_range & ~unended & np.isnan(nrank)
                self._drop("nvtx_process_without_gpu_activity", int(noproc.sum()))
                keep = is_range & ~unended & ~noproc
                self._keep(_NVTX, int(keep.sum()))
                text = t.column(5).combine_chunks().cast(pa.string())
                if not keep.all():
                    text = text.filter(pa.array(keep))
                    a, nrank = a[keep], nrank[keep]
                # registered strings (textId) where the text is empty
                empty = pc.equal(text, "").to_numpy(zero_copy_only=False)
                if empty.any():
                    tids, tinv = np.unique(a[empty, 4], return_inverse=True)
                    tnames = pa.array([str(sid.get(int(x), "(unnamed NVTX range)")) if x >= 0
                                       else "(unnamed NVTX range)" for x in tids], pa.string())
                    full = np.zeros(len(a), np.int64)
                    full[empty] = tinv
                    text = pc.if_else(pa.array(empty), tnames.take(pa.array(full)), text)
                self.nv_names = text
                self.nv = pd.DataFrame({"rank": nrank.astype(np.int64), "tid": a[:, 3],
                                        "start": a[:, 0], "end": a[:, 1],
                                        "ncode": np.arange(len(a), dtype=np.int64)}, copy=False)
        bar.advance()

        # ---- synchronization + optional event records
        self.sync = np.zeros((0, 6), np.int64)
        if _SYNC in have:
            self.sync = _ints(con, f"select start, end, coalesce(correlationId,-1), "
                                   f"coalesce(globalPid,-1), syncType, streamId from {_SYNC}", 6)
            self._read_n(len(self.sync))
            ecol = _columns(con, _SYNC)
            self.sync_event = (_ints(con, f"select eventId from {_SYNC}", 1)[:, 0]
                               if "eventId" in ecol else np.full(len(self.sync), -1, np.int64))
        self.events = np.zeros((0, 4), np.int64)
        if _EVENT in have:
            self.events = _ints(con, f"select coalesce(correlationId,-1), coalesce(globalPid,-1), "
                                     f"eventId, streamId from {_EVENT}", 4)
            self._read_n(len(self.events))
            self._keep(_EVENT, len(self.events))  # used to resolve event syncs and waits
        bar.advance()

        # ---- devices, threads
        self.thread_names: dict[int, str] = {}
        if "ThreadNames" in have:
            for tid, nid in con.execute("select globalTid, nameId from ThreadNames"):
                if tid is not None:
                    # keyed by pid/tid bits (0..47), as lanes are
                    self.thread_names[int(tid) & ((1 << 48) - 1)] = str(sid.get(nid, ""))
        self.gpu_info: dict[int, dict[str, Any]] = {}
        if "TARGET_INFO_GPU" in have:
            cur = con.execute("select * from TARGET_INFO_GPU")
            cn = [d[0] for d in cur.description]
            for row in cur.fetchall():
                rec = dict(zip(cn, row, strict=True))
                dev = rec.get("id", rec.get("cuDevice"))
                if dev is not None:
                    self.gpu_info[int(dev)] = {k: v for k, v in rec.items()
                                               if isinstance(v, (int, float, str))}
        self.host = None
        if "TARGET_INFO_SYSTEM_ENV" in have:
            h = con.execute("select value from TARGET_INFO_SYSTEM_ENV where name='Hostname' "
                            "limit 1").fetchone()
            self.host = h[0] if h else None


def read_nsys(paths: list[str | os.PathLike[str]] | str | os.PathLike[str],
              progress: bool | None = None) -> Trace:
    """Read Nsight Systems SQLite exports into one Trace.

    Parameters
    ----------
    paths
        One or more ``.sqlite`` files from ``nsys export --type sqlite``; ranks of later files
        follow those of earlier ones.
    progress
        Show a progress bar on stderr (``None``: when stderr is a terminal).

    Returns
    -------
    Trace
        GPU ops on GPU_STREAM lanes, runtime calls on CPU_THREAD lanes, NVTX ranges, LAUNCH /
        HOST_ORDER / SYNC edges, NCCL kernels matched into ``coll_id``; see the module docstring.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ps: list[Path] = []
    for p in map(Path, paths):
        ps.extend(sorted(p.glob("*.sqlite")) if p.is_dir() else [p])
    if not ps:
        raise TraceFormatError("no nsys SQLite files given")
    strings = StringTable()
    files: list[_File] = []
    with progress_bar(5 * len(ps) + 2, "nsys", progress) as bar:
        rank0 = 0
        for p in ps:
            if not p.is_file():
                raise TraceFormatError(f"{p}: not a file; pass nsys SQLite exports")
            f = _File(p, rank0, strings, bar)
            rank0 += f.n_ranks
            files.append(f)
        if rank0 == 0:
            raise TraceFormatError(
                f"{ps[0]}: the export holds no GPU kernels, memcpys or memsets; profile with "
                "`nsys profile --trace cuda,nvtx ...` and export again")
        trace = _assemble(files, strings, ps)
        bar.advance(2)
    return trace


def _shifted(frames: list[pd.DataFrame], offsets: list[int]) -> pd.DataFrame:
    """Concatenate per-file frames with clock offsets applied and a ``file`` column (no copy
    for the common single-file case)."""
    for i, (f, o) in enumerate(zip(frames, offsets, strict=True)):
        f["file"] = np.full(len(f), i, np.int64)
        if o:
            f["start"] += o
            f["end"] += o
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _assemble(files: list[_File], strings: StringTable, ps: list[Path]) -> Trace:
    utc = [f.session_utc_ns for f in files]
    base = min((u for u in utc if u is not None), default=None)
    offsets = [0 if (u is None or base is None) else int(u - base) for u in utc]
    gpu = _shifted([f.gpu for f in files], offsets)
    rt = _shifted([f.rt for f in files], offsets)
    nv = _shifted([f.nv for f in files], offsets)

    # ---- lanes: GPU streams then CPU threads (integer keys, no merges: these are big)
    gkey = (gpu["rank"].to_numpy(np.int64) << 40) | (gpu["device"].to_numpy(np.int64) << 32) \
        | (gpu["stream"].to_numpy(np.int64) & 0xFFFFFFFF)
    gu, glane = _uinv(gkey)
    mask48 = np.int64((1 << 48) - 1)
    rkey = (rt["rank"].to_numpy(np.int64) << 48) | (rt["tid"].to_numpy(np.int64) & mask48)
    nkey = (nv["rank"].to_numpy(np.int64) << 48) | (nv["tid"].to_numpy(np.int64) & mask48)
    tu, tinv = _uinv(np.concatenate([rkey, nkey]))
    n_gl = len(gu)
    rank_file = {int(r): i for i, f in enumerate(files) for r in f.pairs["rank"]}
    t_rank = tu >> 48
    t_tid = tu & mask48
    tnames = [files[rank_file[int(r)]].thread_names.get(int(t), "") for r, t in
              zip(t_rank, t_tid, strict=True)]
    lanes = {
        "lane": np.arange(n_gl + len(tu), dtype=np.int32),
        "rank": np.concatenate([gu >> 40, t_rank]),
        "device": np.concatenate([(gu >> 32) & 0xFF, np.full(len(tu), -1)]),
        "lane_kind": np.concatenate([np.full(n_gl, int(LaneKind.GPU_STREAM)),
                                     np.full(len(tu), int(LaneKind.CPU_THREAD))]),
        "native_id": np.concatenate([gu & 0xFFFFFFFF, t_tid & _TID_MASK]),
        "name": [f"stream {s}" for s in (gu & 0xFFFFFFFF)]
        + [f"{n or 'thread'} {int(t) & _TID_MASK}" for n, t in zip(tnames, t_tid, strict=True)],
    }
    gpu["lane"] = glane.astype(np.int32)
    rt["lane"] = (n_gl + tinv[:len(rkey)]).astype(np.int32)
    nv["lane"] = (n_gl + tinv[len(rkey):]).astype(np.int32)

    # ---- ops: GPU then runtime, each sorted by (lane, start) so lane order is op order
    gpu = gpu.take(np.lexsort((gpu["start"].to_numpy(), gpu["lane"].to_numpy()))).reset_index(drop=True)
    rt = rt.take(np.lexsort((rt["start"].to_numpy(), rt["lane"].to_numpy()))).reset_index(drop=True)
    ng, nr = len(gpu), len(rt)
    gpu["op_id"] = np.arange(ng, dtype=np.int64)
    rt["op_id"] = np.arange(ng, ng + nr, dtype=np.int64)

    # ---- collectives: one inferred group of all ranks, matched by per-(comm_op) issue order
    # (the shared matcher of collectors.collectives, as for Kineto traces without Seq)
    coll_id = np.full(ng, -1, np.int64)
    all_ranks = sorted(int(r) for f in files for r in f.pairs["rank"])
    cmask = np.isin(gpu["kind"].to_numpy(), [int(OpKind.COLLECTIVE), int(OpKind.P2P)])
    names, nv_ids = _intern_nvtx(strings, files)
    nv_name = nv_ids[np.asarray([0] + [len(f.nv_names) for f in files]).cumsum()[
        nv["file"].to_numpy(np.int64)] + nv["ncode"].to_numpy(np.int64)] if len(nv) else nv_ids[:0]
    # a SendRecv kernel under nccl:all_to_all is an all-to-all (collectors/nsys_comm.py)
    comm_before = gpu["comm_op"].to_numpy().copy()
    gpu["comm_op"], n_relabel = primitives_from_nvtx(
        gpu["comm_op"].to_numpy(), cmask, gpu["rank"].to_numpy(), gpu["corr"].to_numpy(), rt,
        nv["rank"].to_numpy(), nv["tid"].to_numpy(), nv["start"].to_numpy(),
        nv["end"].to_numpy(), nv_name, names)
    # one whose launch call the export lacks: the primitive of its rank/stream/name peers
    rkeys = pd.MultiIndex.from_arrays([rt["rank"].to_numpy(), rt["corr"].to_numpy()])
    no_launch = ~pd.MultiIndex.from_arrays([gpu["rank"].to_numpy(),
                                            gpu["corr"].to_numpy()]).isin(rkeys)
    gpu["comm_op"], n_peer = primitives_from_peers(
        gpu["comm_op"].to_numpy(), comm_before, cmask, no_launch,
        gpu["rank"].to_numpy(), gpu["stream"].to_numpy(), gpu["name_id"].to_numpy())
    colls: dict[str, Any] = {"matched": 0, "unmatched": 0, "unmatched_reasons": {},
                             "ops_matched": 0, "ops_unmatched": 0}
    group_ids = np.full(ng, -1, np.int32)
    if cmask.any():
        ci = np.flatnonzero(cmask)
        n = len(ci)
        cid, colls = match_collectives(
            gpu["rank"].to_numpy()[ci], np.zeros(n, np.int64), np.full(n, len(all_ranks)),
            gpu["comm_op"].to_numpy()[ci], np.zeros(n, np.int64), np.full(n, -1, np.int64),
            gpu["start"].to_numpy()[ci], {0: set(all_ranks)}, end=gpu["end"].to_numpy()[ci])
        coll_id[ci] = cid
        group_ids[ci] = 0

    ops = {
        "rank": np.concatenate([gpu["rank"].to_numpy(), rt["rank"].to_numpy()]),
        "lane": np.concatenate([gpu["lane"].to_numpy(), rt["lane"].to_numpy()]),
        "kind": np.concatenate([gpu["kind"].to_numpy(), np.full(nr, int(OpKind.RUNTIME))]),
        "name_id": np.concatenate([gpu["name_id"].to_numpy(), rt["name_id"].to_numpy()]),
        "start_ns": np.concatenate([gpu["start"].to_numpy(), rt["start"].to_numpy()]),
        "dur_ns": np.concatenate([(gpu["end"] - gpu["start"]).to_numpy(),
                                  (rt["end"] - rt["start"]).to_numpy()]),
        "coll_id": np.concatenate([coll_id, np.full(nr, -1)]),
        "comm_op": np.concatenate([gpu["comm_op"].to_numpy(), np.zeros(nr, np.int8)]),
        "bytes": np.concatenate([gpu["bytes"].to_numpy(), np.zeros(nr, np.int64)]),
        "group_id": np.concatenate([group_ids, np.full(nr, -1)]),
        "correlation": np.concatenate([gpu["corr"].to_numpy(), rt["corr"].to_numpy()]),
    }
    edges = nsys_edges(files, gpu, rt, strings)
    ranges = {"rank": nv["rank"].to_numpy(), "lane": nv["lane"].to_numpy(),
              "name_id": nv_name, "start_ns": nv["start"].to_numpy(),
              "end_ns": nv["end"].to_numpy(),
              "depth": _depth(nv["lane"].to_numpy(), nv["start"].to_numpy(), nv["end"].to_numpy())}
    devices: dict[str, Any] = {}  # {rank: {device: {...}}}, as the Kineto reader writes
    for f in files:
        for row in f.pairs.itertuples():
            d: dict[str, Any] = {"pid": int(row.pid), "host": f.host}
            info = f.gpu_info.get(int(row.dev))
            if info:
                d.update({"name": info.get("name"), "memory_bytes": info.get("totalMemory"),
                          "sm_count": info.get("smCount"), "clock_hz": info.get("clockRate"),
                          "memory_bandwidth_bytes_per_s": info.get("memoryBandwidth"),
                          "compute_capability": f"{info.get('computeMajor')}.{info.get('computeMinor')}"
                          if info.get("computeMajor") is not None else None})
                d.update(device_peaks(info.get("name")))
            devices[str(int(row.rank))] = {str(int(row.dev)): d}
    meta = {
        "source_format": "nsys",
        "sources": [{"path": str(p), "format": "nsys"} for p in ps],
        "world_size": len(all_ranks),
        "devices": devices,
        "clock_offsets_ns": {str(p): o for p, o in zip(ps, offsets, strict=True)},
        "accounting": {str(f.path): f.acc for f in files},
        "collectives": colls | {"primitive_from_nvtx": n_relabel,
                                "primitive_from_peers": n_peer},
    }
    groups = ([{"group_id": 0, "name": "nccl:inferred-all-ranks", "ranks": all_ranks}]
              if cmask.any() else None)
    return Trace.build(ops=ops, lanes=lanes, strings=names, edges=edges, ranges=ranges,
                       groups=groups, meta=meta)


def _intern_nvtx(strings: StringTable, files: list[_File]) -> tuple[list[str], np.ndarray]:
    """Intern the NVTX names of all files (one per kept range) in bulk with Arrow hashing;
    return (symbol table, name id per range in file order)."""
    allnames = pa.concat_arrays([f.nv_names.cast(pa.string()) for f in files])
    if len(allnames) == 0:
        return list(strings.names), np.zeros(0, np.int32)
    enc = allnames.dictionary_encode()
    uniq = enc.dictionary
    pos = pc.fill_null(pc.index_in(uniq, value_set=pa.array(strings.names, pa.string())), -1)
    pos = pos.to_numpy(zero_copy_only=False).astype(np.int64)
    new = pos < 0
    ids_u = pos
    ids_u[new] = len(strings.names) + np.arange(int(new.sum()))
    names = strings.names + uniq.filter(pa.array(new)).to_pylist()
    return names, ids_u[enc.indices.to_numpy(zero_copy_only=False)].astype(np.int32)
