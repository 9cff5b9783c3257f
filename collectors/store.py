"""The on-disk store: rank-partitioned layout, and lazy scans (pyarrow datasets) for
analysis of thousands of ranks without loading the store whole.

Two layouts of ``NAME.retime/`` (``meta.json`` ``layout``; schema version 2, version-1
stores are single-file stores):

``single``  one Parquet file per table (``ops.parquet``, ``edges.parquet``, ...).
``rank``    ``lanes``/``groups``/``strings`` whole; the per-rank tables as one file per rank::

                ops/rank=N/part-0.parquet      the rank's ops (every column, ``rank`` too)
                edges/rank=N/part-0.parquet    the edges whose ``src`` op is on rank N
                ranges/rank=N/part-0.parquet   memory/rank=N/part-0.parquet

            ``meta.json`` ``partitions`` maps table -> rank -> rows; a rank without rows in a
            table has no file there. Rows are in store order within a rank and ranks in
            ascending order; a table whose rows were not rank-ordered carries a ``_row``
            column (ops: ``op_id``) from which :func:`read_trace` restores the order, so
            both layouts read back into the same Trace.

Writers: :meth:`Trace.save` (``layout="rank"``) partitions a Trace in memory;
``retime ingest --scheduler`` has every Dask worker write its own ranks with
:func:`write_rank_tables` into the store's temporary directory (:func:`new_store_dir`), and
the client commits it (:func:`commit_store`) once every rank is written: no partial output.

Scans (:func:`scan_ops`, :func:`scan_table`, :func:`iter_ops`, :func:`rank_spans`,
:func:`op_totals`) read only the columns asked for and only the ranks asked for: whole files
of a partitioned store, row groups whose ``rank`` statistics can match in a single-file one
(ingested traces are rank-ordered), and the aggregations one record batch at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .errors import TraceFormatError
from .trace import (
    EDGES_SCHEMA,
    LANES_SCHEMA,
    MEMORY_SCHEMA,
    OPS_SCHEMA,
    RANGES_SCHEMA,
    Trace,
    _frame,
    read_meta,
    write_parquet,
)

__all__ = ["LAYOUTS", "PARTITIONED_TABLES", "store_layout", "store_ranks", "new_store_dir",
           "commit_store", "part_file", "write_rank_tables", "write_partitions",
           "write_store_by_rank",
           "read_partitioned", "rank_rows", "rank_batches", "read_small_tables", "scan_ops", "scan_table", "iter_ops", "rank_spans", "op_totals"]

LAYOUTS = ("single", "rank")
PARTITIONED_TABLES = ("ops", "edges", "ranges", "memory")
_SCHEMAS = {"ops": OPS_SCHEMA, "edges": EDGES_SCHEMA, "ranges": RANGES_SCHEMA,
            "memory": MEMORY_SCHEMA}
_BATCH_ROWS = 1 << 20


# ---------------------------------------------------------------------------- writing
def new_store_dir(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary sibling directory of ``path`` to write a store into."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    um = os.umask(0)
    os.umask(um)
    os.chmod(tmp, 0o777 & ~um)  # mkdtemp makes 0700; a store is an ordinary directory
    return tmp


def commit_store(tmp: Path, path: str | os.PathLike[str]) -> Path:
    """Move a completely written store ``tmp`` to ``path`` (replacing an old store)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def part_file(root: str | os.PathLike[str], table: str, rank: int) -> Path:
    """Where rank ``rank``'s rows of ``table`` live in a rank-partitioned store."""
    return Path(root) / table / f"rank={int(rank)}" / "part-0.parquet"


def _arrow(df: pd.DataFrame) -> pa.Table:
    """A per-rank table's frame (numeric numpy columns) as Arrow, column by column: several
    times faster than ``Table.from_pandas`` on the small frames of one rank, and every
    partition file of a store gets the same plain schema."""
    return pa.table({c: pa.array(df[c].to_numpy()) for c in df.columns})


def write_rank_tables(root: str | os.PathLike[str], rank: int,
                      tables: dict[str, pd.DataFrame | pa.Table]) -> dict[str, int]:
    """Write one rank's rows of the per-rank tables (frames in the store schema) under
    ``root``; empty tables get no file. Returns rows written per table."""
    rows = {}
    for name, df in tables.items():
        if name not in PARTITIONED_TABLES:
            raise TraceFormatError(f"table {name!r} is not partitioned by rank; "
                                   f"choose one of {PARTITIONED_TABLES}")
        tbl = df if isinstance(df, pa.Table) else _arrow(df)
        rows[name] = tbl.num_rows
        if tbl.num_rows:
            write_parquet(tbl, part_file(root, name, rank))
    return rows


def _partition_keys(trace: Trace) -> dict[str, np.ndarray]:
    o_rank = trace.ops["rank"].to_numpy()
    src = trace.edges["src"].to_numpy()
    e_rank = o_rank[np.clip(src, 0, max(len(o_rank) - 1, 0))] if len(src) else src[:0]
    return {"ops": o_rank, "edges": e_rank, "ranges": trace.ranges["rank"].to_numpy(),
            "memory": trace.memory["rank"].to_numpy()}


def write_partitions(root: Path, trace: Trace) -> dict[str, dict[str, int]]:
    """Write the per-rank tables of ``trace`` as one file per rank under ``root``; return
    ``meta.json``'s ``partitions`` (table -> rank -> rows)."""
    out: dict[str, dict[str, int]] = {}
    for name, key in _partition_keys(trace).items():
        df = getattr(trace, name)
        key = np.asarray(key, dtype=np.int64)
        if len(key) > 1 and (key[1:] < key[:-1]).any():
            order = np.argsort(key, kind="stable")
            if name != "ops":  # ops restore their order from op_id
                df = df.assign(_row=np.arange(len(df), dtype=np.int64))
            df = df.take(order)
            key = key[order]
        tbl = _arrow(df)
        ranks, first = np.unique(key, return_index=True)
        bounds = np.r_[first, len(key)]
        out[name] = {}
        for i, r in enumerate(ranks.tolist()):
            a, b = int(bounds[i]), int(bounds[i + 1])
            write_parquet(tbl.slice(a, b - a), part_file(root, name, r))
            out[name][str(r)] = b - a
    return out


def write_store_by_rank(path: str | os.PathLike[str],
                        ranks: Iterable[tuple[int, dict[str, pd.DataFrame]]], *,
                        lanes: pd.DataFrame, groups: pd.DataFrame, strings: list[str],
                        meta: dict[str, Any]) -> Path:
    """Write a rank-partitioned store one rank at a time (memory: one rank), atomically.

    ``ranks`` yields ``(rank, {"ops": frame, "edges": ..., "ranges": ..., "memory": ...})``
    with global ids (op ids dense over the whole store, ascending with the rank); missing
    tables are empty. The small tables are written whole. Nothing is validated across ranks:
    :func:`read_trace` and ``Trace.validate`` do that when the store is loaded.
    """
    from .trace import SCHEMA_VERSION, _arrow_table, write_meta

    tmp = new_store_dir(path)
    try:
        parts: dict[str, dict[str, int]] = {}
        for r, tables in ranks:
            for name, n in write_rank_tables(tmp, r, {
                    k: _frame(_SCHEMAS[k], v, k) for k, v in tables.items()}).items():
                if n:
                    parts.setdefault(name, {})[str(int(r))] = int(n)
        small = Trace(ops=pd.DataFrame(), lanes=_frame(LANES_SCHEMA, lanes, "lanes"),
                      edges=pd.DataFrame(), ranges=pd.DataFrame(), groups=groups,
                      memory=pd.DataFrame(), strings=list(strings))
        for name in ("lanes", "groups", "strings"):
            write_parquet(_arrow_table(small, name), tmp / f"{name}.parquet")
        write_meta(tmp, {**meta, "schema_version": SCHEMA_VERSION, "layout": "rank",
                         "partitions": parts})
        return commit_store(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------- reading
def store_layout(path: str | os.PathLike[str]) -> str:
    """``"single"`` or ``"rank"`` (version-1 stores are ``"single"``)."""
    return str(read_meta(Path(path)).get("layout", "single"))


def _partitions(path: Path, meta: dict[str, Any], table: str) -> dict[int, int]:
    parts = meta.get("partitions")
    if not isinstance(parts, dict) or not isinstance(parts.get(table, {}), dict):
        raise TraceFormatError(f"{path}: meta.json of a rank-partitioned store lacks "
                               "'partitions'; re-ingest the trace")
    return {int(r): int(n) for r, n in parts.get(table, {}).items()}


def _part_files(path: Path, table: str, ranks: Iterable[int]) -> list[Path]:
    files = []
    for r in sorted(ranks):
        f = part_file(path, table, r)
        if not f.is_file():
            raise TraceFormatError(f"{path}: missing {f.relative_to(path)} (rank {r}); the "
                                   "store is incomplete, re-ingest the trace")
        files.append(f)
    return files


def read_partitioned(path: Path, table: str, parts: dict[str, Any] | None,
                     columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One per-rank table of a rank-partitioned store, whole, in store row order.

    Memory: each column is allocated once at its final size (the row counts are in
    ``meta.json``) and filled one rank file at a time, so the peak is the table plus one
    rank's file, not the table three times over (Arrow pieces, their concatenation, the
    pandas copy). Rows out of order are put in order one column at a time.
    """
    counts = _partitions(path, {"partitions": parts}, table)
    files = _part_files(path, table, counts)
    if not files:
        return pd.DataFrame()
    cols = None
    if columns is not None:
        cols = list(dict.fromkeys([*columns, "op_id"] if table == "ops" else columns))
    total = sum(counts.values())
    key = "op_id" if table == "ops" else "_row"
    try:
        schema = pq.read_schema(files[0])
        names = [c for c in schema.names if cols is None or c in cols]
        if cols is not None and len(names) < len(cols):
            raise TraceFormatError(f"{path}/{table}: no column(s) "
                                   f"{sorted(set(cols) - set(names))}; re-ingest the trace")
        if not all(pa.types.is_integer(schema.field(c).type) or
                   pa.types.is_floating(schema.field(c).type) or
                   pa.types.is_boolean(schema.field(c).type) for c in names):
            return _read_concat(path, table, files, cols, total, key)
        out = {c: np.empty(total, schema.field(c).type.to_pandas_dtype()) for c in names}
        at = 0
        for f in files:
            tbl = pq.read_table(f, columns=names)
            n = tbl.num_rows
            if at + n > total or any(tbl.column(c).null_count for c in names):
                del tbl
                out.clear()
                return _read_concat(path, table, files, cols, total, key)
            for c in names:
                out[c][at:at + n] = tbl.column(c).to_numpy()
            at += n
            del tbl
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{path}/{table}: unreadable Parquet ({exc}); "
                               "re-ingest the trace") from exc
    if at != total:
        raise TraceFormatError(f"{path}/{table}: {at} rows, meta.json says {total}; "
                               "re-ingest the trace")
    if key in out:
        k = out[key]
        if len(k) > 1 and (k[1:] < k[:-1]).any():
            order = np.argsort(k, kind="stable")
            for c in names:  # one column's copy at a time
                out[c] = out[c][order]
            del order
        if key == "_row":
            del out["_row"]
    return pd.DataFrame(out, copy=False)


def _read_concat(path: Path, table: str, files: list[Path], cols: list[str] | None,
                 total: int, key: str) -> pd.DataFrame:
    """:func:`read_partitioned` for tables with nulls or non-numeric columns: concatenate
    the rank files as Arrow and convert (the table about three times over at the peak)."""
    try:
        pieces = [pq.read_table(f, columns=cols) for f in files]
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{path}/{table}: unreadable Parquet ({exc}); "
                               "re-ingest the trace") from exc
    df = pa.concat_tables(pieces).to_pandas()
    if len(df) != total:
        raise TraceFormatError(f"{path}/{table}: {len(df)} rows, meta.json says "
                               f"{total}; re-ingest the trace")
    if key in df.columns:
        k = df[key].to_numpy()
        if len(k) > 1 and (k[1:] < k[:-1]).any():
            df = df.take(np.argsort(k, kind="stable")).reset_index(drop=True)
        if key == "_row":
            df = df.drop(columns="_row")
    return df


def rank_rows(path: str | os.PathLike[str]) -> dict[int, int]:
    """Ops per rank (ranks with ops), from the partition metadata of a partitioned store or
    from the ``rank`` column alone of a single-file one."""
    p = Path(path)
    meta = read_meta(p)
    if meta.get("layout", "single") == "rank":
        return dict(sorted(_partitions(p, meta, "ops").items()))
    d, _ = _dataset(p, "ops")
    col = d.to_table(columns=["rank"]).column("rank").to_numpy() if d is not None else []
    u, n = np.unique(np.asarray(col, dtype=np.int64), return_counts=True)
    return {int(r): int(k) for r, k in zip(u.tolist(), n.tolist(), strict=True)}


def rank_batches(path: str | os.PathLike[str], *,
                 batch_rows: int = _BATCH_ROWS) -> list[np.ndarray]:
    """The store's ranks (those with ops) cut into consecutive batches of about
    ``batch_rows`` ops each (one rank per batch at least)."""
    if batch_rows < 1:
        raise TraceFormatError(f"batch_rows={batch_rows} must be >= 1")
    rows = rank_rows(path)
    ranks = np.array(sorted(rows), dtype=np.int64)
    out: list[np.ndarray] = []
    cur: list[int] = []
    n = 0
    for r in ranks.tolist():
        if cur and n + rows[r] > batch_rows:
            out.append(np.array(cur, np.int64))
            cur, n = [], 0
        cur.append(r)
        n += rows[r]
    if cur:
        out.append(np.array(cur, np.int64))
    return out


def read_small_tables(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole small tables of a store (either layout): ``meta`` (as stored), ``lanes``
    and ``groups`` frames and the ``strings`` list, as :func:`read_trace` returns them."""
    p = Path(path)
    meta = read_meta(p)
    out: dict[str, Any] = {"meta": meta}
    for name in ("lanes", "groups", "strings"):
        f = p / f"{name}.parquet"
        if not f.is_file():
            raise TraceFormatError(f"{p}: missing {name}.parquet; re-ingest the trace")
        try:
            out[name] = pq.read_table(f).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") from exc
    out["lanes"] = _frame(LANES_SCHEMA, out["lanes"], "lanes")
    out["strings"] = [str(s) for s in out["strings"]["name"].tolist()]
    out["groups"]["ranks"] = [list(map(int, x)) for x in out["groups"]["ranks"]]
    return out


def store_ranks(path: str | os.PathLike[str]) -> np.ndarray:
    """Sorted ranks that have ops in the store (read from metadata, not from the ops)."""
    p = Path(path)
    meta = read_meta(p)
    if meta.get("layout", "single") == "rank":
        return np.array(sorted(_partitions(p, meta, "ops")), dtype=np.int64)
    col = pq.read_table(p / "ops.parquet", columns=["rank"]).column("rank").to_numpy()
    return np.unique(col).astype(np.int64)


def _dataset(path: str | os.PathLike[str], table: str = "ops",
             ranks: Iterable[int] | None = None) -> tuple[ds.Dataset | None, pc.Expression | None]:
    """The dataset of ``table`` (only the files of ``ranks`` in a partitioned store) and the
    rank filter still to apply (single-file stores)."""
    p = Path(path)
    meta = read_meta(p)
    try:
        if meta.get("layout", "single") == "rank":
            have = _partitions(p, meta, table)
            want = sorted(have) if ranks is None else sorted(
                set(int(r) for r in ranks) & set(have))
            files = _part_files(p, table, want)
            return (ds.dataset([str(f) for f in files], format="parquet") if files else None,
                    None)
        f = p / f"{table}.parquet"
        if not f.is_file():
            raise TraceFormatError(f"{p}: missing {table}.parquet; re-ingest the trace")
        d = ds.dataset(f, format="parquet")
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(f"{p}/{table}: unreadable Parquet ({exc}); "
                               "re-ingest the trace") from exc
    if ranks is not None and "rank" not in d.schema.names:
        raise TraceFormatError(f"{p}: {table} has no rank column to select ranks by")
    return d, _rank_filter(ranks)


def _check_columns(d: ds.Dataset | None, table: str, columns: Sequence[str] | None,
                   where: Path) -> list[str]:
    names = list(d.schema.names) if d is not None else list(_SCHEMAS[table])
    names = [c for c in names if c != "_row"]
    cols = list(columns) if columns is not None else names
    missing = [c for c in cols if c not in names]
    if missing:
        raise TraceFormatError(f"{where}: {table} has no column(s) {missing}; columns: "
                               f"{', '.join(names)}")
    return cols


def _rank_filter(ranks: Iterable[int] | None) -> pc.Expression | None:
    if ranks is None:
        return None
    r = np.unique(np.asarray(list(ranks), dtype=np.int64))
    if len(r) and r[-1] - r[0] + 1 == len(r):  # a contiguous range: cheapest to evaluate
        return (pc.field("rank") >= int(r[0])) & (pc.field("rank") <= int(r[-1]))
    return pc.field("rank").isin(pa.array(r, pa.int32()))


def _and(a: pc.Expression | None, b: pc.Expression | None) -> pc.Expression | None:
    return b if a is None else (a if b is None else a & b)


def _kind_filter(kinds: Iterable[int] | None) -> pc.Expression | None:
    if kinds is None:
        return None
    return pc.field("kind").isin(pa.array(sorted({int(k) for k in kinds}), pa.int8()))


def _typed(df: pd.DataFrame, table: str, cols: list[str]) -> pd.DataFrame:
    schema = _SCHEMAS[table]
    for c in cols:
        if c in schema and schema[c][0] != "object" and str(df[c].dtype) != schema[c][0]:
            df[c] = df[c].astype(schema[c][0])
    return df


def _empty(table: str, cols: list[str]) -> pd.DataFrame:
    schema = _SCHEMAS[table]
    return pd.DataFrame({c: np.zeros(0, dtype=schema[c][0]) for c in cols})


def scan_table(path: str | os.PathLike[str], table: str, *,
               ranks: Iterable[int] | None = None, columns: Sequence[str] | None = None,
               kinds: Iterable[int] | None = None) -> pd.DataFrame:
    """Rows of one per-rank table (``ops``, ``ranges``, ``memory``; ``edges`` of a
    partitioned store) for the chosen ``ranks``, ``columns`` and (ops) ``kinds``.

    Columns keep the in-memory dtypes of the table's schema; rows keep store order.
    """
    if table not in PARTITIONED_TABLES:
        raise TraceFormatError(f"scan_table: {table!r} is not a per-rank table; choose one "
                               f"of {PARTITIONED_TABLES}")
    d, flt = _dataset(path, table, ranks)
    cols = _check_columns(d, table, columns, Path(path))
    if d is None:
        return _empty(table, cols)
    tbl = d.to_table(columns=cols, filter=_and(flt, _kind_filter(kinds)))
    return _typed(tbl.to_pandas(), table, cols)


def scan_ops(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
             columns: Sequence[str] | None = None,
             kinds: Iterable[int] | None = None) -> pd.DataFrame:
    """Ops of the chosen ``ranks``, ``columns`` and ``kinds`` of a stored trace.

    Reads only those columns and the files / row groups that can hold those ranks. Columns
    keep the in-memory dtypes of :data:`collectors.trace.OPS_SCHEMA`; rows keep store order.
    """
    return scan_table(path, "ops", ranks=ranks, columns=columns, kinds=kinds)


def iter_ops(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
             columns: Sequence[str] | None = None,
             batch_rows: int = _BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """Stream the ops of a stored trace as DataFrames of at most ``batch_rows`` rows."""
    d, flt = _dataset(path, "ops", ranks)
    cols = _check_columns(d, "ops", columns, Path(path))
    if d is None:
        return
    for b in d.to_batches(columns=cols, filter=flt, batch_size=batch_rows):
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
