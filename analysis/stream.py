"""Streamed analysis of a stored trace: a few ranks at a time, never the whole store.

For a store of thousands of ranks (``retime ingest --scheduler`` writes one partitioned by
rank, :mod:`collectors.store`) these functions read the ops (only the columns they need)
and annotations of one batch of ranks at a time, run the in-memory analysis on that batch
and combine the results. Step windows, breakdowns and per-name kernel statistics are per
rank, so every result equals the in-memory function's on the whole trace:

========================  ============================================================
:func:`stream_step_times`  ``analysis._util.step_windows`` plus ``step_ns``
:func:`stream_breakdown`   :func:`analysis.breakdown.breakdown`
:func:`stream_kernel_stats`  :func:`analysis.kernels.kernel_stats` (top ops by time)
:func:`stream_collectives`   :func:`analysis.comm.collectives` (and ``comm_summary``)
:func:`stream_rank_wait`     :func:`analysis.comm.rank_wait`
========================  ============================================================

Memory: one batch of ranks (about ``batch_rows`` ops; the whole ``lanes``/``strings``/
``groups`` tables, which hold one row per lane, name and group) plus the results. The
collective statistics need every member of an instance at once, so they read the
communication ops only (a filter pushed down to the Parquet scan): memory in the number of
collective/p2p ops, not in the store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from retime.collectors.enums import OpKind
from retime.collectors.errors import RetimeError
from retime.collectors.kernel_classes import CLASS_NAMES, op_classes
from retime.collectors.steps import empty_steps
from retime.collectors.store import rank_batches, read_small_tables, scan_table, store_layout
from retime.collectors.trace import RANGES_SCHEMA, Trace, _frame, read_trace

from ._util import COMM_KINDS, memo_scope, step_windows
from .breakdown import breakdown
from .comm import collectives, comm_summary, rank_wait, unmatched_collectives
from .coverage import combine_unseen, unseen_work

__all__ = ["rank_batches", "iter_rank_traces", "stream_step_times", "stream_breakdown",
           "stream_kernel_stats", "stream_collectives", "stream_comm_summary",
           "stream_rank_wait", "should_stream", "store_analysis", "STREAM_ABOVE_OPS"]

_BATCH_ROWS = 1 << 21
#: ops columns each streamed analysis reads
_BREAKDOWN_COLS = ["rank", "lane", "kind", "name_id", "step", "start_ns", "dur_ns",
                   "correlation",  # correlation: launch waits of the first step's cut
                   "coll_id"]  # coll_id: a send/recv's peer (its wait is no transfer)


def p2p_later(path: str | os.PathLike[str]) -> pd.Series:
    """:func:`analysis.breakdown.p2p_peer_starts` of every rank of a stored trace (one scan
    of its point-to-point ops): a batch of ranks lacks the peers of its sends/receives."""
    from .breakdown import p2p_peer_starts
    return p2p_peer_starts(scan_table(Path(path), "ops", columns=["kind", "coll_id",
                                                                  "start_ns"],
                                      kinds=[int(OpKind.P2P)]))
_KERNEL_COLS = ["rank", "lane", "kind", "name_id", "dur_ns"]
_COMM_COLS = ["op_id", "rank", "kind", "coll_id", "comm_op", "group_id", "step", "bytes",
              "start_ns", "dur_ns"]


class _Small:
    """The whole small tables of a store (lanes, strings, groups) and its meta."""

    def __init__(self, path: Path) -> None:
        t = read_small_tables(path)
        self.meta, self.lanes, self.strings, self.groups = (t["meta"], t["lanes"],
                                                            t["strings"], t["groups"])

    def trace(self, ops: pd.DataFrame, ranges: pd.DataFrame | None = None) -> Trace:
        """A Trace of some ops (a subset of columns and ranks) for the analysis functions;
        not validated (op ids are not dense), never saved."""
        z = pd.DataFrame()
        r = ranges if ranges is not None else _frame(RANGES_SCHEMA, None, "ranges")
        return Trace(ops=ops.reset_index(drop=True), lanes=self.lanes, edges=z, ranges=r,
                     groups=self.groups, memory=z, strings=self.strings, meta=self.meta)


def iter_rank_traces(path: str | os.PathLike[str], *, columns: list[str] | None = None,
                     ranges: bool = False,
                     batch_rows: int = _BATCH_ROWS) -> Iterator[Trace]:
    """Yield one Trace per batch of ranks (:func:`rank_batches`): the batch's ops (only
    ``columns``; all by default), its ranges when ``ranges`` is true, and the store's whole
    lanes, strings and groups. Per-rank analysis functions run on each as on the whole."""
    p = Path(path)
    small = _Small(p)
    for batch in rank_batches(p, batch_rows=batch_rows):
        ops = scan_table(p, "ops", ranks=batch, columns=columns)
        rg = scan_table(p, "ranges", ranks=batch) if ranges else None
        yield small.trace(ops, rg)


def stream_step_times(path: str | os.PathLike[str], *,
                      batch_rows: int = _BATCH_ROWS) -> pd.DataFrame:
    """Per (rank, step): ``start_ns``, ``end_ns`` and ``step_ns`` of the step's window
    (:mod:`collectors.steps`; a rank without step attribution has one row, step -1,
    spanning all its ops); equals
    ``analysis._util.step_windows(read_trace(path))`` with ``step_ns`` added."""
    parts = [step_windows(t) for t in iter_rank_traces(
        path, columns=["rank", "lane", "kind", "step", "start_ns", "dur_ns", "correlation"],
        ranges=True,
        batch_rows=batch_rows)]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"rank": np.zeros(0, np.int32), "step": np.zeros(0, np.int32),
         "start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64)})
    out["step_ns"] = out["end_ns"] - out["start_ns"]
    return out


def stream_breakdown(path: str | os.PathLike[str], *, by: str = "step",
                     batch_rows: int = _BATCH_ROWS) -> pd.DataFrame:
    """:func:`analysis.breakdown.breakdown` of a stored trace, a batch of ranks at a time
    (same rows, same values)."""
    if by not in ("step", "rank"):
        raise RetimeError(f"breakdown(by={by!r}): choose 'step' or 'rank'")
    later = p2p_later(path)
    parts = [breakdown(t, by=by, p2p_later=later) for t in iter_rank_traces(
        path, columns=_BREAKDOWN_COLS, ranges=True, batch_rows=batch_rows)]
    if not parts:
        from .breakdown import PARTS
        cols = ["rank", "step", "start_ns", "end_ns", "step_ns", *PARTS, "busy_ns",
                "gpu_busy_frac"]
        return pd.DataFrame({c: [] for c in cols})
    return pd.concat(parts, ignore_index=True)


def _kernel_partial(t: Trace) -> pd.DataFrame:
    """Per name id of one batch's device ops: count, total, min, max, first kind."""
    from .kernels import _device_ops

    m = _device_ops(t)
    df = pd.DataFrame({"name_id": t.ops["name_id"].to_numpy()[m],
                       "kind": t.ops["kind"].to_numpy()[m],
                       "dur_ns": t.ops["dur_ns"].to_numpy()[m]})
    return df.groupby("name_id", sort=False).agg(
        count=("dur_ns", "size"), total_ns=("dur_ns", "sum"), min_ns=("dur_ns", "min"),
        max_ns=("dur_ns", "max"), kind=("kind", "first"))


def _kernel_final(parts: list[pd.DataFrame], strings: list[str],
                  top: int | None) -> pd.DataFrame:
    """Combine the batches' partials into :func:`analysis.kernels.kernel_stats`' frame."""
    cols = ["name", "kernel_class", "kind", "count", "total_ns", "mean_ns", "min_ns",
            "max_ns", "share", "cum_share"]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({c: [] for c in cols})
    s = pd.concat(parts).groupby(level=0, sort=False).agg(
        count=("count", "sum"), total_ns=("total_ns", "sum"), min_ns=("min_ns", "min"),
        max_ns=("max_ns", "max"), kind=("kind", "first")).reset_index()
    names = np.asarray(strings, dtype=object)
    nid = s["name_id"].to_numpy()
    kind = s["kind"].to_numpy()
    cls = np.asarray(CLASS_NAMES, dtype=object)[op_classes(kind, nid, list(names))]
    s["name"] = names[nid]
    s["kernel_class"] = cls.astype(object)
    s["kind"] = [OpKind(int(k)).name for k in kind]
    s["mean_ns"] = s["total_ns"] / s["count"]
    s["share"] = s["total_ns"] / s["total_ns"].sum()
    s = s.sort_values(["total_ns", "name"], ascending=[False, True], kind="mergesort")
    s["cum_share"] = s["share"].cumsum()
    if top is not None:
        s = s.head(top)
    return s[cols].reset_index(drop=True)


def stream_kernel_stats(path: str | os.PathLike[str], *, top: int | None = None,
                        batch_rows: int = _BATCH_ROWS) -> pd.DataFrame:
    """:func:`analysis.kernels.kernel_stats` (device ops by name, all ranks together) of a
    stored trace: counts, sums, minima and maxima combined over batches of ranks.

    ``mean_ns`` is ``total_ns / count`` (the in-memory function's pandas mean may differ in
    the last bit).
    """
    parts = [_kernel_partial(t) for t in iter_rank_traces(path, columns=_KERNEL_COLS,
                                                          batch_rows=batch_rows)]
    return _kernel_final(parts, _Small(Path(path)).strings, top)


def _comm_trace(path: str | os.PathLike[str],
                batch_rows: int = _BATCH_ROWS) -> tuple[Trace, np.ndarray]:
    p = Path(path)
    # rank batch by rank batch: one scan over thousands of files at once buffers far more
    # than the communication ops it keeps
    parts = [scan_table(p, "ops", ranks=b, columns=_COMM_COLS, kinds=COMM_KINDS)
             for b in rank_batches(p, batch_rows=batch_rows)]
    parts = [x for x in parts if len(x)]
    ops = (pd.concat(parts, ignore_index=True) if parts else
           scan_table(p, "ops", ranks=[], columns=_COMM_COLS))
    oid = ops["op_id"].to_numpy()
    if len(oid) > 1 and (oid[1:] < oid[:-1]).any():
        ops = ops.take(np.argsort(oid, kind="stable")).reset_index(drop=True)
    return _Small(p).trace(ops), ops["op_id"].to_numpy()


def stream_collectives(path: str | os.PathLike[str]) -> pd.DataFrame:
    """:func:`analysis.comm.collectives` of a stored trace from its communication ops only
    (``op_id`` is the store's op id, as in the in-memory result)."""
    return _collectives(*_comm_trace(path))


def _collectives(t: Trace, oid: np.ndarray) -> pd.DataFrame:
    c = collectives(t)
    if len(c):
        c["op_id"] = oid[c["op_id"].to_numpy().astype(np.int64)]
    return c


def stream_comm_summary(path: str | os.PathLike[str]) -> pd.DataFrame:
    """:func:`analysis.comm.comm_summary` of a stored trace (communication ops only)."""
    return comm_summary(stream_collectives(path))


def stream_rank_wait(path: str | os.PathLike[str]) -> pd.DataFrame:
    """:func:`analysis.comm.rank_wait` of a stored trace (communication ops only)."""
    return rank_wait(_comm_trace(path)[0])


#: the ops columns :func:`batch_partials` reads
PARTIAL_COLS = list(dict.fromkeys(_BREAKDOWN_COLS + _KERNEL_COLS))


def batch_partials(t: Trace, by: str, later: pd.Series) -> tuple[Any, ...]:
    """The per-rank parts of :func:`store_analysis` for one batch of ranks: step windows,
    breakdown, kernel partial, empty steps, unseen work (combined over batches there)."""
    # the batch's step windows once, not once per analysis (3 times: 10.7 of 23 s CPU at
    # 128 ranks); a scope per batch, so that it never holds an earlier one
    with memo_scope():
        return (step_windows(t), breakdown(t, by=by, p2p_later=later), _kernel_partial(t),
                empty_steps(t), unseen_work(t))


#: a single-file store with more ops than this is analyzed streamed by default
STREAM_ABOVE_OPS = 10_000_000


def should_stream(path: str | os.PathLike[str]) -> bool:
    """Auto choice of :func:`store_analysis`: stream a rank-partitioned store, or a
    single-file one of more than :data:`STREAM_ABOVE_OPS` ops (from the Parquet footer)."""
    p = Path(path)
    if store_layout(p) == "rank":
        return True
    return pq.ParquetFile(p / "ops.parquet").metadata.num_rows > STREAM_ABOVE_OPS


def store_analysis(path: str | os.PathLike[str], *, stream: bool | None = None,
                   by: str = "step", top: int = 20,
                   batch_rows: int = _BATCH_ROWS,
                   scheduler: Any = None) -> dict[str, pd.DataFrame]:
    """The standard analysis of a stored trace, streamed or in memory (same frames).

    Parameters
    ----------
    path : a ``NAME.retime`` store
    stream : stream rank batches (True), load the trace (False), or choose by the store's
        layout and size (None, :func:`should_stream`)
    by : breakdown per ``"step"`` or per ``"rank"``
    top : how many ops by total device time
    scheduler : a Dask scheduler address or ``distributed.Client``: the per-rank parts run
        on its workers, one task per rank (:mod:`analysis.stream_dask`); implies streaming

    Returns
    -------
    dict of DataFrames: ``step_times`` (per rank and step), ``breakdown``,
    ``breakdown_summary`` (:func:`analysis.breakdown.summarize_breakdown`), ``top_ops``
    (:func:`analysis.kernels.kernel_stats`), ``unclassified`` (the top device-op names of
    class ``other``: no rule of :mod:`collectors.kernel_classes` knows them), ``comm``
    (:func:`analysis.comm.comm_summary`), ``comm_unmatched``
    (:func:`analysis.comm.unmatched_collectives`), ``rank_wait``, ``empty_steps``
    (:func:`collectors.steps.empty_steps`: profiler steps without ops, left out); ``unseen``
    (a dict, :func:`analysis.coverage.unseen_work`); and ``mode`` (``"stream"`` or
    ``"memory"``) under ``"mode"``.
    """
    from .breakdown import summarize_breakdown
    from .kernels import kernel_stats

    if top < 1:
        raise RetimeError(f"top={top} must be >= 1")
    if scheduler is not None:
        stream = True
    if stream is None:
        stream = should_stream(path)
    if stream:
        # one pass over the rank batches for everything that is per rank
        sw, bd, kp, es, un = [], [], [], [], []
        later = p2p_later(path)
        if scheduler is not None:  # one Dask task per rank (analysis.stream_dask)
            from .stream_dask import dask_partials
            batches = dask_partials(path, scheduler, by=by, later=later)
        else:
            batches = (batch_partials(t, by, later) for t in iter_rank_traces(
                path, columns=PARTIAL_COLS, ranges=True, batch_rows=batch_rows))
        for parts in batches:
            for acc, x in zip((sw, bd, kp, es, un), parts, strict=True):
                acc.append(x)
        w = pd.concat(sw, ignore_index=True) if sw else stream_step_times(path)
        w["step_ns"] = w["end_ns"] - w["start_ns"]
        ks = _kernel_final(kp, _Small(Path(path)).strings, None)
        out = {"step_times": w,
               "breakdown": pd.concat(bd, ignore_index=True) if bd else stream_breakdown(path),
               "top_ops": ks.head(top).reset_index(drop=True),
               "empty_steps": pd.concat(es, ignore_index=True) if es else empty_steps(
                   _Small(Path(path)).trace(scan_table(Path(path), "ops", ranks=[])))}
        ct, oid = _comm_trace(path, batch_rows)  # one scan of the comm ops for both
        co = _collectives(ct, oid)
        out["unseen"] = combine_unseen(un)  # type: ignore[assignment]
        out["comm"] = comm_summary(co)
        out["comm_unmatched"] = unmatched_collectives(co)
        out["rank_wait"] = rank_wait(ct)
    else:
        t = read_trace(path)
        w = step_windows(t)
        w["step_ns"] = w["end_ns"] - w["start_ns"]
        ks = kernel_stats(t)
        co = collectives(t)
        out = {"step_times": w, "breakdown": breakdown(t, by=by),
               "top_ops": ks.head(top).reset_index(drop=True), "comm": comm_summary(co),
               "comm_unmatched": unmatched_collectives(co),
               "rank_wait": rank_wait(t), "empty_steps": empty_steps(t),
               "unseen": unseen_work(t)}
    # names the kernel-class table does not know (class "other"), so a user sees them
    u = ks[ks["kernel_class"] == "other"] if len(ks) else ks
    out["unclassified"] = u[["name", "kind", "count", "total_ns", "share"]].head(
        top).reset_index(drop=True) if len(u) else pd.DataFrame(
        {c: [] for c in ["name", "kind", "count", "total_ns", "share"]})
    out["breakdown_summary"] = summarize_breakdown(out["breakdown"])
    out["mode"] = "stream" if stream else "memory"  # type: ignore[assignment]
    out["by"] = by  # type: ignore[assignment]
    return out
