"""Lazy scans of a stored trace's ops (pyarrow datasets): analysis of thousands of ranks
without loading the store whole.

``read_trace`` loads every table into memory. For a store of thousands of ranks the
functions here read ``ops.parquet`` as a pyarrow dataset instead: only the columns asked
for, only the row groups whose ``rank`` statistics can match a rank filter, and, for the
aggregations, one record batch at a time (memory bounded by the batch, not the store).

Layout note: ``Trace.save`` writes one ``ops.parquet`` whose rows are in rank order for
ingested traces (the Kineto merge sorts ranks), so a rank filter skips every row group
outside the ranks' range via the Parquet statistics. A store partitioned into one file per
rank is not written (yet); the scans take any row order and stay correct, only less
selective.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .errors import TraceFormatError
from .trace import OPS_SCHEMA

__all__ = ["scan_ops", "iter_ops", "rank_spans", "op_totals"]

_BATCH_ROWS = 1 << 20


def _dataset(path: str | os.PathLike[str]) -> ds.Dataset:
    p = Path(path)
    f = p / "ops.parquet"
    if not (p / "meta.json").is_file() or not f.is_file():
        raise TraceFormatError(f"{p}: not a retime trace directory (expected NAME.retime/ with "
                               "meta.json and ops.parquet); create one with `retime ingest`")
    try:
        return ds.dataset(f, format="parquet")
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") from exc


def _check_columns(d: ds.Dataset, columns: Sequence[str] | None, where: Path) -> list[str]:
    cols = list(columns) if columns is not None else list(d.schema.names)
    missing = [c for c in cols if c not in d.schema.names]
    if missing:
        raise TraceFormatError(f"{where}: ops has no column(s) {missing}; columns: "
                               f"{', '.join(d.schema.names)}")
    return cols


def _rank_filter(ranks: Iterable[int] | None) -> pc.Expression | None:
    if ranks is None:
        return None
    r = np.unique(np.asarray(list(ranks), dtype=np.int64))
    if len(r) and r[-1] - r[0] + 1 == len(r):  # a contiguous range: cheapest to evaluate
        return (pc.field("rank") >= int(r[0])) & (pc.field("rank") <= int(r[-1]))
    return pc.field("rank").isin(pa.array(r, pa.int32()))


def scan_ops(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
             columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Ops of the chosen ``ranks`` and ``columns`` of a stored trace, as a DataFrame.

    Reads only those columns and the row groups that can hold those ranks. Columns keep the
    in-memory dtypes of :data:`collectors.trace.OPS_SCHEMA`; rows keep store order.
    """
    d = _dataset(path)
    cols = _check_columns(d, columns, Path(path))
    tbl = d.to_table(columns=cols, filter=_rank_filter(ranks))
    df = tbl.to_pandas()
    for c in cols:
        if c in OPS_SCHEMA and OPS_SCHEMA[c][0] != "object":
            df[c] = df[c].astype(OPS_SCHEMA[c][0])
    return df


def iter_ops(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
             columns: Sequence[str] | None = None,
             batch_rows: int = _BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """Stream the ops of a stored trace as DataFrames of at most ``batch_rows`` rows."""
    d = _dataset(path)
    cols = _check_columns(d, columns, Path(path))
    for b in d.to_batches(columns=cols, filter=_rank_filter(ranks), batch_size=batch_rows):
        if b.num_rows:
            yield b.to_pandas()


def rank_spans(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
               batch_rows: int = _BATCH_ROWS) -> pd.DataFrame:
    """Per rank: ``start_ns``, ``end_ns`` and ``span_ns`` of its ops (first start to last
    end), streamed batch by batch; equals ``read_trace(path).step_times_ns()``."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for b in iter_ops(path, ranks=ranks, columns=["rank", "start_ns", "dur_ns"],
                      batch_rows=batch_rows):
        r = b["rank"].to_numpy()
        s = b["start_ns"].to_numpy(np.int64)
        e = s + b["dur_ns"].to_numpy(np.int64)
        u, inv = np.unique(r, return_inverse=True)
        bl = np.full(len(u), np.iinfo(np.int64).max, np.int64)
        bh = np.full(len(u), np.iinfo(np.int64).min, np.int64)
        np.minimum.at(bl, inv, s)
        np.maximum.at(bh, inv, e)
        for k, a, z in zip(u.tolist(), bl.tolist(), bh.tolist(), strict=True):
            lo[k] = min(lo.get(k, a), a)
            hi[k] = max(hi.get(k, z), z)
    rk = np.array(sorted(lo), dtype=np.int32)
    out = pd.DataFrame({"rank": rk, "start_ns": np.array([lo[k] for k in rk.tolist()], np.int64),
                        "end_ns": np.array([hi[k] for k in rk.tolist()], np.int64)})
    out["span_ns"] = out["end_ns"] - out["start_ns"]
    return out


def op_totals(path: str | os.PathLike[str], *, by: Sequence[str] = ("rank", "kind"),
              ranks: Iterable[int] | None = None,
              batch_rows: int = _BATCH_ROWS) -> pd.DataFrame:
    """Per group of ``by`` columns: ``ops`` (count), ``dur_ns`` (sum), ``bytes`` (sum) and
    ``flops`` (sum of the known ones), streamed batch by batch (memory: one batch plus the
    groups). ``by`` may name any ops columns (``rank``, ``kind``, ``step``, ``name_id``...)."""
    by = list(by)
    parts = []
    for b in iter_ops(path, ranks=ranks, columns=[*by, "dur_ns", "bytes", "flops"],
                      batch_rows=batch_rows):
        g = b.groupby(by, sort=False).agg(ops=("dur_ns", "size"), dur_ns=("dur_ns", "sum"),
                                         bytes=("bytes", "sum"), flops=("flops", "sum"))
        parts.append(g)
    if not parts:
        return pd.DataFrame({**{c: [] for c in by}, "ops": [], "dur_ns": [], "bytes": [],
                             "flops": []})
    tot = pd.concat(parts).groupby(level=list(range(len(by))), sort=True).sum()
    return tot.reset_index()
