"""An identity replay of a rank-partitioned store a window at a time, without loading the
store (issue 30: replay memory bounded by one window, not by the run).

:mod:`replay.window` replays a run a window of measured time at a time; this module feeds it
from the store's rank files instead of a loaded :class:`collectors.trace.Trace`:

* **a cheap pass over the ops**, a rank file at a time: only what the windows' graphs take
  from the whole run stays in memory (measured start and duration, rank, lane, kind,
  collective, a blocking-call flag and the lane links: 32 bytes per op, 0.31 GB at 128
  ranks of the scale bench, against the 9 trace columns, the edges and the results the
  in-memory path holds);
* **the cut points** from the edges, read a rank file at a time (the forbidden intervals
  only are kept), then the edges are spilled to disk grouped by their destination's window;
* **each window's results** (replayed start, end, critical predecessor) are spilled to disk
  as the window is done; a later window reads back only its pinned ops';
* **the step windows and the unseen-work counts** (what ``retime replay`` prints besides
  the graph's statistics) are computed a batch of ranks at a time from the store's ops and
  ``ProfilerStep`` annotations, with the replayed times read back from the spilled results
  only when they differ from the measured ones (``--ideal``).

The spill goes to a temporary directory (``TMPDIR``), removed when the replay ends. The
results equal the in-memory windowed replay's, which equal the whole graph's
(``tests/test_replay_window.py``).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from retime.collectors.enums import OpKind
from retime.collectors.errors import TraceFormatError

from .window import (
    WINDOW_OPS,
    _coll_forbidden,
    _edge_forbidden,
    assemble_run,
    blocking_names,
    replay_loop,
    window_cuts,
    window_of,
)

__all__ = ["replay_store"]

_I64 = np.int64
_I32 = np.int32
#: ops per batch of ranks of the step-window pass (one rank at least): analyze's batch
#: (:mod:`analysis.stream`); the pass runs after the per-op arrays are freed. Batches of
#: 2**18 ops made 43 at 128 ranks, each paying the step windows' per-batch work (6.9 of
#: 43 s CPU under cProfile)
_BATCH_OPS = 1 << 21
#: the same, in the first pass (beside the run's per-op arrays: half the batch, so that its
#: temporaries stay under the windows' peak)
_STEP_BATCH_OPS = 1 << 20
#: ops columns the cheap pass reads (the op id places each row)
_RUN_COLUMNS = ["op_id", "rank", "lane", "kind", "name_id", "start_ns", "dur_ns", "coll_id"]
#: what the step windows read besides (:data:`replay.footprint.IDENTITY_COLUMNS`)
_STEP_EXTRA = ["step", "correlation"]


def _files(root: Path, meta: dict[str, Any], table: str) -> list[tuple[int, Path, int]]:
    from retime.collectors.store import _part_files, _partitions
    rows = _partitions(root, meta, table)
    ranks = sorted(rows)
    return [(r, f, rows[r]) for r, f in zip(ranks, _part_files(root, table, ranks),
                                             strict=True)]


def _read(f: Path, columns: list[str]) -> pa.Table:
    try:
        return pq.read_table(f, columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") from exc


def _schema(f: Path) -> pa.Schema:
    try:
        return pq.read_schema(f)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") from exc


def _col(t: pa.Table, name: str, dtype) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(), dtype)


def _read_run(root: Path, meta: dict[str, Any], lanes: pd.DataFrame, strings: list[str],
              steps: _StepPass | None = None):
    """The run's per-op arrays (op-id order) from the ops rank files, and the lane links;
    ``None`` where the in-memory path must decide (op ids not dense, negative lanes).
    ``steps`` is handed each rank file's columns as they are read."""
    files = _files(root, meta, "ops")
    n = sum(k for _, _, k in files)
    if n == 0:
        return None
    s = np.empty(n, _I64)
    # durations and collective ids in 4 bytes while they fit (widened at the first value
    # that does not; the windows widen what they take): 8 bytes per op less over the run
    d = np.empty(n, _I32)
    # ranks and lanes in 2 bytes while they fit (widened likewise): 4 bytes per op less
    rank = np.empty(n, np.int16)
    lane = np.empty(n, np.int16)
    kind = np.empty(n, np.int8)
    coll = np.empty(n, _I32)
    blocking = np.zeros(n, bool)
    seen = np.zeros(n, bool)
    lane_prev = np.full(n, -1, _I32)
    lane_next = np.full(n, -1, _I32)
    bn = blocking_names(strings)
    lane_file: dict[int, int] = {}
    shared_lanes = False
    for i, (rk, f, rows) in enumerate(files):
        t = _read(f, _RUN_COLUMNS if steps is None else _RUN_COLUMNS + _STEP_EXTRA)
        ids = _col(t, "op_id", _I64)
        if t.num_rows != rows or (len(ids) and (ids.min() < 0 or ids.max() >= n)) \
                or seen[ids].any():
            return None
        seen[ids] = True
        ls = _col(t, "start_ns", _I64)
        ll = _col(t, "lane", _I32)
        lk = _col(t, "kind", np.int8)
        if len(ll) and ll.min() < 0:
            return None
        s[ids] = ls
        d = _put(d, ids, _col(t, "dur_ns", _I64))
        rank = _put(rank, ids, _col(t, "rank", _I64))
        lane = _put(lane, ids, ll)
        kind[ids] = lk
        coll = _put(coll, ids, _col(t, "coll_id", _I64))
        if len(bn):
            blocking[ids] = bn[_col(t, "name_id", _I64)] \
                & ((lk == OpKind.RUNTIME) | (lk == OpKind.CPU_OP))
        if steps is not None:
            steps.add(rk, t)
        del t
        # lane links within the file (lane order: measured start, ties by op id); a lane
        # with ops in two files is linked over the whole run below
        for x in np.unique(ll).tolist():
            if lane_file.setdefault(x, i) != i:
                shared_lanes = True
        o = np.lexsort((ids, ls, ll))
        same = ll[o[1:]] == ll[o[:-1]]
        a, b = ids[o[:-1]][same], ids[o[1:]][same]
        lane_prev[b] = a
        lane_next[a] = b
        del ids, ls, ll, lk, o, same, a, b
    if not seen.all():
        return None
    del seen
    if steps is not None:
        steps.finish()
    if shared_lanes:
        from .graph_arrays import _lexsort_small
        order = _lexsort_small((s, lane))
        lane_prev[:] = -1
        lane_next[:] = -1
        same = lane[order[1:]] == lane[order[:-1]]
        lane_prev[order[1:][same]] = order[:-1][same]
        lane_next[order[:-1][same]] = order[1:][same]
        del order, same
    return assemble_run(lanes, s=s, d=d, rank=rank, lane=lane, kind=kind, coll=coll,
                        blocking=blocking, lane_prev=lane_prev, lane_next=lane_next)


def _put(out: np.ndarray, ids: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``out[ids] = v``, ``out`` widened to int64 first where ``v`` does not fit it."""
    if out.dtype != _I64 and len(v):
        info = np.iinfo(out.dtype)
        if v.min() < info.min or v.max() > info.max:
            out = out.astype(_I64)
    out[ids] = v
    return out


class _SpillEdges:
    """The run's edges spilled to disk grouped by their destination's window: one file of
    packed records per window (source, destination, kind, lag, edge row; ids in 4 bytes
    where the run's fit: 21 bytes per edge, not 40), appended a rank file at a time through
    a handle kept open per window (one file per window and rank file cost 2,580 opens and
    0.4 GB of writes at 128 ranks); ``bucket(k)`` as :class:`replay.window._MemEdges`'s."""

    #: windows beyond which a handle is opened for each write instead of kept open
    OPEN_MAX = 256

    def __init__(self, spill: Path, windows: int, n_ops: int, n_edges: int) -> None:
        ids = "<i4" if n_ops < (1 << 31) else "<i8"
        rows = "<i4" if n_edges < (1 << 31) else "<i8"
        self.rec = np.dtype([("s", ids), ("d", ids), ("k", "i1"), ("l", "<i8"), ("x", rows)])
        self.paths = [spill / f"e{j}.bin" for j in range(windows)]
        self._fh: dict[int, Any] = {}
        self._hit: tuple[int, tuple] | None = None

    def add(self, i: int, es, ed, ek, el, ix, win: np.ndarray) -> None:
        w = win[ed]
        o = np.argsort(w, kind="stable")
        w = w[o]
        cut = np.flatnonzero(w[1:] != w[:-1]) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(w)], strict=True):
            if b <= a:
                continue
            j = int(w[a])
            sel = o[a:b]
            x = np.empty(len(sel), self.rec)
            x["s"], x["d"], x["k"], x["l"], x["x"] = es[sel], ed[sel], ek[sel], el[sel], ix[sel]
            f = self._fh.get(j)
            if f is None:
                f = open(self.paths[j], "ab")  # noqa: SIM115 (closed in done())
                if len(self.paths) <= self.OPEN_MAX:
                    self._fh[j] = f
            x.tofile(f)
            if len(self.paths) > self.OPEN_MAX:
                f.close()

    def done(self) -> None:
        """Close the files (before the first ``bucket``)."""
        for f in self._fh.values():
            f.close()
        self._fh.clear()

    def bucket(self, k: int) -> tuple[np.ndarray, ...]:
        if self._hit is not None and self._hit[0] == k:
            return self._hit[1]
        f = self.paths[k]
        x = np.fromfile(f, self.rec) if f.is_file() else np.zeros(0, self.rec)
        ix = x["x"]
        if len(ix) > 1 and (ix[1:] < ix[:-1]).any():  # (a store whose edges carry _row)
            x = x[np.argsort(ix, kind="stable")]
        out = (x["s"].astype(_I64), x["d"].astype(_I64), x["k"].astype(np.int8),
               x["l"].astype(_I64), x["x"].astype(_I64))
        del x
        self._hit = (k, out)
        return out


class _SpillResults:
    """Each window's results spilled to disk, a file per column (op ids ascending, in 4
    bytes where the run's fit; start, end; the critical predecessor only with ``crit``,
    which only the tests' ``results=True`` reads back: 20 bytes per op written, not 32);
    ``get`` reads back the ops asked for."""

    def __init__(self, spill: Path, win: np.ndarray, crit: bool = True) -> None:
        self.dir = spill
        self.win = win
        self.crit = crit
        self.ids = _I32 if len(win) < (1 << 31) else _I64

    def put(self, k: int, ids, s, e, c) -> None:
        cols = {"i": np.asarray(ids, self.ids), "s": np.asarray(s, _I64),
                "e": np.asarray(e, _I64)}
        if self.crit:
            cols["c"] = np.asarray(c, _I64)
        if len(ids) > 1 and (ids[1:] < ids[:-1]).any():  # (replay_loop's come ascending)
            o = np.argsort(ids, kind="stable")
            cols = {q: x[o] for q, x in cols.items()}
        for q, x in cols.items():
            np.save(self.dir / f"r{k}{q}.npy", x)

    def get(self, ids: np.ndarray, crit: bool = False) -> tuple[np.ndarray, ...]:
        if crit and not self.crit:
            raise ValueError("the critical predecessors were not kept")
        ids = np.asarray(ids, _I64)
        out = [np.empty(len(ids), _I64) for _ in range(3 if crit else 2)]
        if not len(ids):
            return tuple(out)
        w = self.win[ids]
        for j in np.unique(w).tolist():
            at = np.flatnonzero(w == j)
            pos = np.searchsorted(np.load(self.dir / f"r{j}i.npy", mmap_mode="r"), ids[at])
            for q, y in zip("sec", out):
                y[at] = np.load(self.dir / f"r{j}{q}.npy", mmap_mode="r")[pos]
        return tuple(out)


def release_freed() -> None:
    """Hand the memory freed so far back to the system (glibc's heap, Arrow's pool): what
    the windows freed would otherwise stay in the process under the step-window pass (at 8
    ranks 0.44 GB of RSS after the windows of 0.25 GB live, and that pass's peak on top)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` from the process's own symbols, or None. (Not
    ``ctypes.util.find_library``: it forks ``ldconfig``, and a fork of a process holding a
    large run counts its pages twice in the process tree's RSS for a moment: 1.32 GB
    against 0.66 GB at 128 ranks in the scale bench.)"""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def replay_store(path: str | os.PathLike[str], *, ideal: bool = False,
                 window_ops: int = WINDOW_OPS, results: bool = False):
    """The identity replay of the rank-partitioned store at ``path`` a window at a time
    (see the module docstring), as a :class:`replay.engine.ReplayResult` with no trace and
    no graph: ``summary()`` is the whole replay's; ``meta["unseen"]`` holds
    :func:`analysis.coverage.unseen_work_by_rank`'s counts. The per-op results are kept
    (``start_ns``, ``end_ns``, ``crit_pred``) only with ``results=True`` (tests); otherwise
    those are empty.

    ``None`` where this path does not apply and the caller loads the trace (a single-file
    store, op ids that are not dense, negative lanes or dangling edges, a window with a
    dependency cycle): the in-memory path decides those, with its own messages.
    """
    from retime.collectors.store import read_small_tables
    from retime.collectors.trace import SCHEMA_VERSION

    root = Path(path)
    small = read_small_tables(root)
    meta = small["meta"]
    if meta.get("layout", "single") != "rank":
        return None
    mem_meta = {k: v for k, v in meta.items() if k not in ("layout", "partitions")}
    mem_meta["schema_version"] = SCHEMA_VERSION
    # the measured step windows and unseen-work counts from the pass that reads the ops for
    # the windows (an identity replay's replayed windows are the measured ones); a replay
    # whose times differ (--ideal, or not identity after all) reads the ops again for them
    steps = None if ideal else _StepPass(root, small, mem_meta)
    r = _read_run(root, meta, small["lanes"], small["strings"], steps)
    if r is None:
        return None
    n = len(r.s)
    edge_files = _files(root, meta, "edges")
    has_row = bool(edge_files) and "_row" in _schema(edge_files[0][1]).names
    ecols = ["src", "dst", "kind"] + (["_row"] if has_row else [])
    lo, hi = [], []
    for _, f, _ in edge_files:
        t = _read(f, ecols[:3])
        es, ed = _col(t, "src", _I64), _col(t, "dst", _I64)
        if len(es) and (min(es.min(), ed.min()) < 0 or max(es.max(), ed.max()) >= n):
            return None  # dangling edges: the whole build says so
        a, b = _edge_forbidden(r, es, ed, _col(t, "kind", np.int8))
        lo.append(a)
        hi.append(b)
        del t, es, ed
    a, b = _coll_forbidden(r)
    cuts = window_cuts(r.s, np.concatenate([*lo, a]), np.concatenate([*hi, b]),
                       window_ops=window_ops)
    del lo, hi, a, b
    win = window_of(cuts, r.s)
    spill = Path(tempfile.mkdtemp(prefix="retime-replay-"))
    try:
        # (edge rows in 4 bytes unless a store's own _row numbers them)
        edges = _SpillEdges(spill, len(cuts) + 1, n,
                            1 << 62 if has_row else sum(k for _, _, k in edge_files))
        try:
            _spill_edges(edges, edge_files, ecols, has_row, win)
        finally:
            edges.done()
        res = _SpillResults(spill, win, crit=results)
        # (the windows' temporaries are not handed back to the system after each window: the
        # next window faulted them all in again, 898 K minor page faults at 128 ranks; kept,
        # with the CLI's keep_freed_memory, 261 K, system time 14.6 -> 7.1 s, peak RSS 0.88
        # -> 0.95 GB; the step-window pass below still starts from a trimmed heap)
        out = replay_loop(r, cuts, win, edges, res, ideal)
        del edges
        if out is None:
            return None
        identity = out["identity"]
        del r
        release_freed()
        if identity and steps is not None:
            w, unseen = steps.result()
        else:
            del steps
            w, unseen = _by_rank_batch(root, small, mem_meta, None if identity else res)
        full = res.get(np.arange(n), crit=True) if results else None
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    from .engine import ReplayResult
    rmeta: dict[str, Any] = {"mode": "fast", "ideal": bool(ideal), "scenario": [],
                             "durations_modified": False}
    rmeta.update(out["stats"])
    rmeta.update(gaps=out["gaps"], windows=out["windows"], graph_bytes=out["graph_bytes"],
                 unseen=unseen)
    z = np.zeros(0, _I64)
    s_, e_, c_ = full if full is not None else (z, z, z)
    return ReplayResult(None, None, s_, e_, c_, meta=rmeta, step_windows=w)


def _spill_edges(edges: _SpillEdges, edge_files, ecols: list[str], has_row: bool,
                 win: np.ndarray) -> None:
    """The edges, a rank file at a time, into ``edges`` by their destination's window."""
    at = 0
    for i, (_, f, rows) in enumerate(edge_files):
        t = _read(f, ecols + ["lag_ns"])
        ix = _col(t, "_row", _I64) if has_row else np.arange(at, at + rows, dtype=_I64)
        at += rows
        edges.add(i, _col(t, "src", _I64), _col(t, "dst", _I64), _col(t, "kind", np.int8),
                  _col(t, "lag_ns", _I64), ix, win)
        del t, ix


class _StepPass:
    """The measured step windows and unseen-work counts of :func:`_by_rank_batch`, computed
    from the first pass's rank files as they are read (the same batches of ranks), so that
    an identity replay does not read the ops a second time."""

    def __init__(self, root: Path, small: dict[str, Any], meta: dict[str, Any]) -> None:
        from retime.collectors.store import rank_batches

        self.root, self.small, self.meta = root, small, meta
        self.last = {int(b[-1]): b for b in rank_batches(root, batch_rows=_STEP_BATCH_OPS)}
        self.cols: list[dict[str, np.ndarray]] = []
        self.ranks: list[int] = []
        self.parts: list[pd.DataFrame] = []
        self.counts: list[dict[str, int]] = []

    def add(self, rank: int, t: pa.Table) -> None:
        from retime.collectors.trace import OPS_SCHEMA

        from .footprint import IDENTITY_COLUMNS

        self.cols.append({c: _col(t, c, _I64 if c == "op_id" else OPS_SCHEMA[c][0])
                          for c in ("op_id", *IDENTITY_COLUMNS)})
        self.ranks.append(int(rank))
        b = self.last.get(int(rank))
        if b is not None:
            self._flush(b)

    def _flush(self, batch: np.ndarray) -> None:
        cols = self.cols[0] if len(self.cols) == 1 else {
            c: np.concatenate([x[c] for x in self.cols]) for c in self.cols[0]}
        self.cols, self.ranks = [], []
        part, count = _batch_windows(self.root, self.small, self.meta, batch, cols, None)
        self.parts.append(part)
        self.counts.append(count)

    def finish(self) -> None:
        if sum(len(x["op_id"]) for x in self.cols):  # (ranks after the last batch: none
            self._flush(np.array(self.ranks, np.int64))  # with ops in the metadata)
        self.cols, self.ranks = [], []

    def result(self):
        return _assemble(self.parts, self.counts)


def _batch_windows(root: Path, small: dict[str, Any], meta: dict[str, Any], batch, cols,
                   res):
    """One batch of ranks' step windows (measured and replayed) and unseen-work counts;
    ``cols``: the batch's ops columns (``op_id`` and :data:`IDENTITY_COLUMNS`) in store
    order."""
    from retime.analysis.coverage import unseen_work
    from retime.collectors.steps import step_range_mask, step_windows
    from retime.collectors.store import scan_table
    from retime.collectors.trace import EDGES_SCHEMA, MEMORY_SCHEMA, OPS_SCHEMA, Trace, _frame

    from .footprint import IDENTITY_COLUMNS

    ids = cols["op_id"]
    order = np.argsort(ids, kind="stable") if len(ids) > 1 and (ids[1:] < ids[:-1]).any() \
        else None
    if order is not None:
        ids = ids[order]
    ops = pd.DataFrame({c: np.ascontiguousarray(
        cols[c] if order is None else cols[c][order], OPS_SCHEMA[c][0])
        for c in OPS_SCHEMA if c in IDENTITY_COLUMNS}, copy=False)
    del cols, order
    rg = scan_table(root, "ranges", ranks=batch)
    if "_row" in rg.columns:
        rg = rg.take(np.argsort(rg["_row"].to_numpy(), kind="stable")).drop(columns="_row")
    rg = rg[step_range_mask(rg, small["strings"])].reset_index(drop=True)
    sub = Trace(ops=ops, lanes=small["lanes"], edges=_frame(EDGES_SCHEMA, None, "edges"),
                ranges=rg, groups=small["groups"],
                memory=_frame(MEMORY_SCHEMA, None, "memory"), strings=small["strings"],
                meta=meta)
    ms = ops["start_ns"].to_numpy()
    me = ms + ops["dur_ns"].to_numpy()
    mw = step_windows(sub, ms, me)
    if res is None:
        rw = mw
    else:
        rs, re_ = res.get(ids)
        rw = step_windows(sub, rs, re_)
    part = pd.DataFrame({
        "rank": mw["rank"].to_numpy(), "step": mw["step"].to_numpy(),
        "measured_start_ns": mw["start_ns"].to_numpy(),
        "measured_end_ns": mw["end_ns"].to_numpy(),
        "replayed_start_ns": rw["start_ns"].to_numpy(),
        "replayed_end_ns": rw["end_ns"].to_numpy()})
    count = unseen_work(sub, pd.DataFrame({
        "rank": mw["rank"].to_numpy(), "step": mw["step"].to_numpy(),
        "start_ns": mw["start_ns"].to_numpy(), "end_ns": mw["end_ns"].to_numpy()}))
    return part, count


def _by_rank_batch(root: Path, small: dict[str, Any], meta: dict[str, Any], res):
    """The step windows (measured and replayed, as :meth:`ReplayResult.step_windows`) and
    the unseen-work counts, a batch of ranks at a time from the store; ``res`` (the spilled
    results) where the replayed times differ from the measured ones."""
    from retime.collectors.store import rank_batches, scan_ops

    from .footprint import IDENTITY_COLUMNS

    parts, counts = [], []
    for batch in rank_batches(root, batch_rows=_BATCH_OPS):
        o = scan_ops(root, ranks=batch, columns=["op_id", *IDENTITY_COLUMNS])
        cols = {c: o[c].to_numpy() for c in o.columns}
        del o
        part, count = _batch_windows(root, small, meta, batch, cols, res)
        parts.append(part)
        counts.append(count)
        del cols
    return _assemble(parts, counts)


def _assemble(parts: list[pd.DataFrame], counts: list[dict[str, int]]):
    from retime.analysis.coverage import combine_unseen
    from retime.collectors.steps import _empty

    w = pd.concat(parts, ignore_index=True) if parts else None
    if w is None:
        e = _empty()
        w = pd.DataFrame({"rank": e["rank"].to_numpy(), "step": e["step"].to_numpy(),
                          **{c: np.zeros(0, _I64) for c in (
                              "measured_start_ns", "measured_end_ns", "replayed_start_ns",
                              "replayed_end_ns")}})
    w["measured_ns"] = w["measured_end_ns"] - w["measured_start_ns"]
    w["replayed_ns"] = w["replayed_end_ns"] - w["replayed_start_ns"]
    return w, combine_unseen(counts)
