"""Rank-wise Kineto ingest: each rank parsed, spooled and written on its own; the cross-rank
work runs on compact skeletons (issue 30: memory bounded by a few ranks, not by N).

The merged Trace of many ranks is never built. Three stages:

1. **parse** each file (:func:`collectors.kineto.parse_kineto_file`, in ``jobs`` processes)
   into a ``RankPart``; keep only its *skeleton* (:func:`skeleton`: the collective/p2p ops
   cross-rank matching needs, lanes, names, metadata and accounting) and spool the part
   itself to a file in the store's temporary directory (pickled numpy columns: written and
   read back at disk-cache speed), then drop it;
2. **merge** the skeletons with :func:`collectors.kineto.merge.merge_parts`: process groups,
   collective matching, the string table, lanes and ``meta`` (accounting included) exactly as
   a whole-trace merge computes them, since they depend on those ops only; derive each rank's
   *plan* (:func:`plans`: global op and lane offsets, name-id map, the ``coll_id`` and
   ``group_id`` of its communication ops);
3. **write** each rank (:func:`rank_tables`: its tables with global ids) from its spool file:
   one file per rank and table (``layout="rank"``, in ``jobs`` processes) or one row group per
   rank appended to each table's Parquet file (``layout="single"``, in rank order; with
   ``jobs > 1`` a writer thread per table file), then delete the spool file.

Peak memory: one part per process, plus the skeletons (communication ops only) and one
rank's tables. :func:`collectors.trace.read_trace` of the store equals ``read(paths)``
(tests/test_ingest_rankwise.py). :mod:`collectors.distributed` runs the same stages on Dask.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import pickle
import shutil
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import RetimeError, TraceFormatError
from .kineto import RankPart, kineto_files, merge_parts, parse_kineto_file
from .kineto.reader import file_progress, warm_scanner
from .progress import progress_bar
from .trace import (
    EDGES_SCHEMA,
    MEMORY_SCHEMA,
    OPS_SCHEMA,
    RANGES_SCHEMA,
    SCHEMA_VERSION,
    Trace,
    _arrow_table,
    _columns,
    _frame,
    parquet_options,
    write_meta,
    write_parquet,
)

__all__ = ["skeleton", "plans", "rank_tables", "write_rank", "parse_and_spool", "write_spooled",
           "spooled_writes", "ingest_kineto", "default_jobs", "check_not_empty", "SPOOL"]

_SCHEMAS = {"ops": OPS_SCHEMA, "edges": EDGES_SCHEMA, "ranges": RANGES_SCHEMA,
            "memory": MEMORY_SCHEMA}
SPOOL = ".spool"


# ---------------------------------------------------------------- skeletons and plans
def flat(part: RankPart) -> list[RankPart]:
    """The rank parts of one file (an exported file holds several)."""
    return part.export_rank_parts or [part]


def _skeleton_one(p: RankPart) -> tuple[RankPart, int]:
    comm_op = np.asarray(p.comm["op"], dtype=np.int64)
    ops = {k: np.asarray(v)[comm_op] for k, v in p.ops.items()}
    comm = dict(p.comm)
    comm["op"] = np.arange(len(comm_op), dtype=np.int64)
    # copies, not views: an empty slice would keep the part's whole column alive
    empty = lambda d: {k: np.asarray(v)[:0].copy() for k, v in d.items()}  # noqa: E731
    sk = dataclasses.replace(p, ops=ops, comm=comm, edges=empty(p.edges),
                             ranges=empty(p.ranges), memory=empty(p.memory),
                             export_rank_parts=[])
    return sk, len(p.ops["start_ns"])


def skeleton(part: RankPart) -> tuple[RankPart, list[int]]:
    """The part with only its collective/p2p ops (and each flat sub-part's op count): enough
    for :func:`merge_parts` to match collectives and build the small tables and meta."""
    subs = [_skeleton_one(p) for p in flat(part)]
    if part.export_rank_parts:
        sk = dataclasses.replace(part, export_rank_parts=[s[0] for s in subs])
    else:
        sk = subs[0][0]
    return sk, [s[1] for s in subs]


def plans(skel: Trace, skeletons: list[tuple[RankPart, list[int]]]
          ) -> list[tuple[int, int, int, dict[str, Any]]]:
    """Per flat sub-part, in rank order: (rank, part index, sub index, plan), from the trace
    :func:`merge_parts` made of the skeletons."""
    subs = []
    for i, (sk, counts) in enumerate(skeletons):
        for j, (p, n) in enumerate(zip(flat(sk), counts, strict=True)):
            subs.append((p.rank, i, j, p, n))
    subs.sort(key=lambda x: x[0])  # merge_parts orders ranks the same way
    sid = {s: k for k, s in enumerate(skel.strings)}
    coll = skel.ops["coll_id"].to_numpy()
    grp = skel.ops["group_id"].to_numpy()
    out = []
    op_off = lane_off = sk_off = 0
    for rank, i, j, p, n in subs:
        k = len(p.comm["op"])
        out.append((rank, i, j, {"rank": rank, "op_off": op_off, "lane_off": lane_off,
                                 "gmap": np.array([sid[s] for s in p.strings], dtype=np.int32),
                                 "coll_id": coll[sk_off:sk_off + k].copy(),
                                 "group_id": grp[sk_off:sk_off + k].copy()}))
        op_off += n
        lane_off += len(p.lanes)
        sk_off += k
    return out


def rank_tables(part: RankPart, sub: int, plan: dict[str, Any]) -> dict[str, pa.Table]:
    """Flat sub-part ``sub`` of ``part`` with global ids (``plan``) as the store's per-rank
    Arrow tables: the same columns :func:`merge_parts` builds for that rank."""
    p = flat(part)[sub]
    op_off, lane_off, gmap = plan["op_off"], plan["lane_off"], plan["gmap"]
    # the rank merge_parts settled (a lone file's bare number is not a rank), not the part's
    rank = plan.get("rank", p.rank)
    n = len(p.ops["start_ns"])
    ops: dict[str, Any] = {"op_id": np.arange(op_off, op_off + n, dtype=np.int64)}
    for k, v in p.ops.items():
        if k == "lane":
            v = v + lane_off
        elif k == "name_id":
            v = gmap[v] if len(v) else v
        ops[k] = v
    ops["rank"] = np.full(n, rank, np.int32)
    comm_op = np.asarray(p.comm["op"], dtype=np.int64)
    coll_id = np.full(n, -1, np.int64)
    group_id = np.full(n, -1, np.int32)
    coll_id[comm_op] = plan["coll_id"]
    group_id[comm_op] = plan["group_id"]
    ops["coll_id"], ops["group_id"] = coll_id, group_id
    edges = {k: (v + op_off if k in ("src", "dst") else v) for k, v in p.edges.items()}
    nr = len(p.ranges["start_ns"])
    ranges = {"rank": np.full(nr, rank, np.int32), "lane": p.ranges["lane"] + lane_off,
              "name_id": gmap[p.ranges["name_id"]] if nr else p.ranges["name_id"],
              **{k: p.ranges[k] for k in ("start_ns", "end_ns", "depth")}}
    nm = len(p.memory["ts_ns"])
    memory = {"rank": np.full(nm, rank, np.int32),
              **{k: p.memory[k] for k in ("device", "ts_ns", "bytes_delta", "allocated_bytes",
                                          "reserved_bytes")}}
    cols = {"ops": _columns(OPS_SCHEMA, ops, "ops", n=n),
            "edges": _columns(EDGES_SCHEMA, edges, "edges"),
            "ranges": _columns(RANGES_SCHEMA, ranges, "ranges"),
            "memory": _columns(MEMORY_SCHEMA, memory, "memory")}
    # straight to Arrow (as store._arrow makes from a frame, without building the frame)
    return {k: pa.table({c: pa.array(v) for c, v in t.items()}) for k, t in cols.items()}


def write_rank(part: RankPart, sub: int, plan: dict[str, Any], root: str) -> dict[str, int]:
    """Write flat sub-part ``sub`` of ``part`` into the rank-partitioned store directory
    ``root``; rows written per table."""
    from .store import write_rank_tables

    return write_rank_tables(root, plan.get("rank", flat(part)[sub].rank),
                             rank_tables(part, sub, plan))


# ---------------------------------------------------------------- local ingest
def parse_and_spool(path: str, spool: str, on_stage=None, on_bytes=None, mapped: bool = False
                    ) -> tuple[tuple[RankPart, list[int]], str]:
    """Stage 1 (in a worker with ``jobs > 1``): parse, spool the part, return its skeleton
    (``on_stage``/``on_bytes``/``mapped``: :func:`parse_kineto_file`'s)."""
    part = parse_kineto_file(path, on_stage=on_stage, on_bytes=on_bytes, mapped=mapped)
    with open(spool, "wb") as fh:
        pickle.dump(part, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return skeleton(part), spool


def _load(spool: str) -> RankPart:
    with open(spool, "rb") as fh:
        return pickle.load(fh)


def write_spooled(spool: str, jobs: list[tuple[int, dict[str, Any]]], root: str
                   ) -> list[dict[str, int]]:
    """Stage 3 of the rank layout (in a worker): write a spooled part's ranks, drop it."""
    part = _load(spool)
    out = [write_rank(part, sub, plan, root) for sub, plan in jobs]
    os.unlink(spool)
    return out


def spooled_writes(plan: list, spools: list[str], root: str
                   ) -> tuple[list[tuple[str, list, str]], list[list[int]]]:
    """Stage 3's tasks of the rank layout: per spooled part, the arguments of
    :func:`write_spooled` (its flat sub-parts' plans), and the ranks it writes, in order."""
    by_part: dict[int, list[tuple[int, int, dict]]] = {}
    for rank, i, j, pl in plan:
        by_part.setdefault(i, []).append((rank, j, pl))
    order = sorted(by_part)
    args = [(spools[i], [(j, pl) for _, j, pl in by_part[i]], root) for i in order]
    return args, [[rank for rank, _, _ in by_part[i]] for i in order]


def default_jobs() -> int:
    """Cores this process may use: the default number of ingest processes."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


def _empty_table(name: str) -> pa.Table:
    from .store import _arrow

    return _arrow(_frame(_SCHEMAS[name], None, name))


def check_not_empty(paths: list[Path], n_ops: int, meta: dict) -> None:
    """Raise TraceFormatError when the inputs hold no timed activity: a store of 0 ops
    would only give 0 ms step times and empty reports further on."""
    if n_ops:
        return
    acc = meta.get("accounting") or {}
    acc = [a for a in acc.values() if isinstance(a, dict)] if isinstance(acc, dict) else []
    read_ = sum(int(a.get("events_read", 0)) for a in acc)
    dropped: dict[str, int] = {}
    for a in acc:
        for why, n in (a.get("dropped") or {}).items():
            dropped[why] = dropped.get(why, 0) + int(n)
    where = ", ".join(str(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    if not dropped:
        raise TraceFormatError(
            f"{where}: no timed activity to ingest (0 ops from {read_} event(s) read); "
            "profile at least one active step (torch.profiler's schedule) and export again")
    top = sorted(dropped.items(), key=lambda kv: -kv[1])[:3]
    raise TraceFormatError(
        f"{where}: no timed activity to ingest (0 ops from {read_} event(s) read; dropped: "
        + ", ".join(f"{why} x{n}" for why, n in top) + (", ..." if len(dropped) > 3 else "")
        + "); point at the run's PyTorch profiler JSON, nsys SQLite export or op-level "
        "Parquet folder")


def ingest_kineto(paths: list[str | os.PathLike[str]], output: str | os.PathLike[str], *,
                  layout: str = "single", jobs: int | None = None,
                  progress: bool | None = None) -> dict[str, Any]:
    """Ingest Kineto files (one per rank, or folders of them) into a store at ``output``,
    rank by rank (see the module docstring); nothing is left behind on an error.

    Parameters
    ----------
    paths : Kineto file(s) and/or folder(s)
    output : the ``NAME.retime`` directory (replaced if it exists)
    layout : ``"single"`` (one Parquet file per table, a row group per rank) or ``"rank"``
    jobs : parse (and, with ``layout="rank"``, write) ranks in this many processes
        (default: :func:`default_jobs`, the cores this process may use)
    progress : progress bars on stderr (default: when stderr is a terminal)

    Returns
    -------
    dict with ``meta`` (as :func:`read_trace` returns it), ``ranks``, ``world_size``,
    ``ops``, ``edges``, ``ranges`` (row counts) and ``output``.
    """
    from .store import commit_store, new_store_dir

    files, skipped = kineto_files([Path(p) for p in paths])
    output = Path(output)
    tmp = new_store_dir(output)
    # the modules' objects (numba's types, pandas, pyarrow) out of the collector's view while
    # this runs: the full collections the skeletons' objects trigger then scan only new
    # objects (one fewer took 0.13 s of the parent's CPU on 128 ranks); forked workers inherit it
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        (tmp / SPOOL).mkdir()
        spools = [str(tmp / SPOOL / f"part-{i}.pkl") for i in range(len(files))]
        skels: list[tuple[RankPart, list[int]]] = []
        jobs = default_jobs() if jobs is None else jobs
        ex = None
        if jobs > 1 and len(files) > 1:
            warm_scanner(files[0], tmp / SPOOL)  # the workers fork with the kernels loaded
            ex = ProcessPoolExecutor(max_workers=min(jobs, len(files)))
        try:
            if len(files) == 1:  # one (possibly huge) file: MB read, then the build stages
                with file_progress(files[0], progress) as bar:
                    skels.append(parse_and_spool(
                        str(files[0]), spools[0], on_stage=lambda _s: bar.advance(),
                        on_bytes=lambda n: bar.advance(n / 1e6))[0])
            else:
                with progress_bar(len(files), "parsing traces", progress) as bar:
                    # workers map plain files (no copy of each byte; scan._map says why
                    # only they do)
                    it = (ex.map(functools.partial(parse_and_spool, mapped=True),
                                 [str(f) for f in files], spools) if ex else
                          (parse_and_spool(str(f), s)
                           for f, s in zip(files, spools, strict=True)))
                    for sk, _ in it:
                        skels.append(sk)
                        bar.advance()
            skel = merge_parts([s[0] for s in skels], skipped)
            plan = plans(skel, skels)
            rows = _write_all(tmp, layout, plan, spools, ex, progress,
                              side=lambda: _write_small(tmp, skel), write_threads=jobs > 1)
            check_not_empty(files, sum(rows.get("ops", {}).values()), skel.meta)
        except BrokenProcessPool as exc:
            raise RetimeError(
                f"{output}: an ingest worker process died (killed for memory, or an input "
                "file was truncated or rewritten while it was read); nothing was written: "
                "re-run once the files are complete, or with fewer --jobs") from exc
        finally:
            if ex is not None:
                ex.shutdown(cancel_futures=True)
        shutil.rmtree(tmp / SPOOL)
        meta = {**skel.meta, "schema_version": SCHEMA_VERSION, "layout": layout}
        if layout == "rank":
            meta["partitions"] = rows
        write_meta(tmp, meta)
        commit_store(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if freeze:
            gc.unfreeze()
    tot = {name: sum(rows.get(name, {}).values()) for name in ("ops", "edges", "ranges")}
    out_meta = {k: v for k, v in meta.items() if k not in ("layout", "partitions")}
    return {"meta": out_meta, "ranks": [int(r) for r in skel.ranks],
            "world_size": skel.world_size, **tot, "output": str(output)}


def _write_small(tmp: Path, skel: Trace) -> None:
    """The store's tables that are not per rank (from the merged skeletons)."""
    for name in ("lanes", "groups", "strings"):
        write_parquet(_arrow_table(skel, name), tmp / f"{name}.parquet")


def _write_all(tmp: Path, layout: str, plan: list, spools: list[str],
               ex: ProcessPoolExecutor | None, progress: bool | None, side=None,
               write_threads: bool = False) -> dict[str, dict[str, int]]:
    """Stage 3: every rank's tables into ``tmp``; rows per table and rank. ``side()`` runs
    here too: while the workers write ranks (``layout="rank"`` with ``ex``), else first.
    ``write_threads`` (``layout="single"``): a writer thread per table file."""
    rows: dict[str, dict[str, int]] = {}
    if side is not None and not (layout == "rank" and ex):
        side()
        side = None

    def count(rank: int, rw: dict[str, int]) -> None:
        for name, n in rw.items():
            if n:
                rows.setdefault(name, {})[str(rank)] = int(n)

    if layout == "rank":
        args, ranks_of = spooled_writes(plan, spools, str(tmp))
        with progress_bar(len(args), "writing ranks", progress) as bar:
            res = ex.map(write_spooled, *zip(*args, strict=True)) if ex else (
                write_spooled(*a) for a in args)
            if side is not None:  # the tasks are queued: the parent writes meanwhile
                side()
            for ranks, rws in zip(ranks_of, res, strict=True):
                for rank, rw in zip(ranks, rws, strict=True):
                    count(rank, rw)
                bar.advance()
        return rows
    # single layout: one row group per rank appended in rank order, one part loaded at a
    # time (an exported file's sub-parts may interleave with other files' ranks: the part
    # stays loaded until its last rank is written). Each table's file has a writer thread of
    # its own: pyarrow encodes without the GIL, so the four files' row groups encode side by
    # side, and rank k+1's part is loaded and its tables built while rank k's are encoded
    # (at most two ranks' tables alive). Each file gets the same row groups in the same
    # order as a serial write: the files are byte-identical (tests/test_ingest_rankwise.py).
    last = {}
    for k, (_, i, _, _) in enumerate(plan):
        last[i] = k
    writers = {}
    for name in _SCHEMAS:
        schema = _empty_table(name).schema
        writers[name] = pq.ParquetWriter(tmp / f"{name}.parquet", schema,
                                         **parquet_options(schema))
    threads = {name: ThreadPoolExecutor(1, thread_name_prefix=f"write-{name}")
               for name in _SCHEMAS} if write_threads else None
    prev = None  # the previous rank's row groups being written
    try:
        cur: dict[int, RankPart] = {}
        with progress_bar(len(plan), "writing ranks", progress) as bar:
            for k, (rank, i, j, pl) in enumerate(plan):
                if i not in cur:
                    cur[i] = _load(spools[i])
                tables = rank_tables(cur[i], j, pl)
                if prev is not None:
                    for fut in prev:
                        fut.result()
                    bar.advance()
                futs = []
                rw = {}
                for name, tbl in tables.items():
                    rw[name] = tbl.num_rows
                    if not tbl.num_rows:
                        continue
                    if threads is None:
                        writers[name].write_table(tbl)
                    else:
                        futs.append(threads[name].submit(writers[name].write_table, tbl))
                count(rank, rw)
                del tables
                if last[i] == k:
                    del cur[i]
                    os.unlink(spools[i])
                if threads is None:
                    bar.advance()
                else:
                    prev = futs
            if prev is not None:
                for fut in prev:
                    fut.result()
                bar.advance()
    finally:
        if threads is not None:
            for t in threads.values():
                t.shutdown(wait=True, cancel_futures=True)
        for w in writers.values():
            w.close()
    return rows
