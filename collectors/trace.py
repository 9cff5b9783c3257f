"""The Trace: columnar tables of a (multi-rank) training run, and its on-disk store.

A Trace is a small set of pandas DataFrames plus a metadata dict (DESIGN.md §2):

``ops``     one row per timed activity on one lane (see :data:`OPS_SCHEMA`)
``lanes``   one row per FIFO execution queue (CPU thread, GPU stream, op stream)
``edges``   dependencies ``src -> dst`` with a kind (:class:`EdgeKind`) and minimum lag
``ranges``  annotations (record_function / NVTX / ProfilerStep) used for attribution
``groups``  process groups (``ranks`` is a list of ints)
``memory``  allocator samples (``[memory]`` instant events), possibly empty
``strings`` the symbol table ``name_id -> name``
``meta``    ``schema_version``, sources, world size, devices, clock offsets, accounting

Design decision: in memory the numeric columns are plain numpy dtypes (not Arrow-backed
pandas extension dtypes) so that the replay kernels get contiguous arrays with zero copies;
on disk every table is a Parquet file written by pyarrow.  A trace directory
``NAME.retime/`` holds ``ops.parquet``, ``lanes.parquet``, ``edges.parquet``,
``ranges.parquet``, ``groups.parquet``, ``memory.parquet``, ``strings.parquet`` and
``meta.json`` (``layout: "single"``).  A store of many ranks can instead be partitioned by
rank (``layout: "rank"``, :mod:`collectors.store`): the per-rank tables become one file per
rank, so workers write their own ranks and scans read only the ranks they need.  Either way
it is written to a temporary sibling directory and renamed into place, so an interrupted
save never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from .errors import TraceFormatError, TraceValidationError

__all__ = [
    "SCHEMA_VERSION",
    "OPS_SCHEMA",
    "LANES_SCHEMA",
    "EDGES_SCHEMA",
    "RANGES_SCHEMA",
    "GROUPS_COLUMNS",
    "MEMORY_SCHEMA",
    "Trace",
    "parquet_options",
    "StringTable",
    "read_trace",
    "read_meta",
    "empty_accounting",
]

#: version 2 adds ``layout`` ("single" or "rank") to ``meta.json``; version-1 stores are
#: single-file stores and still read
SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)

#: column -> (numpy dtype, default value used when a collector does not know it)
OPS_SCHEMA: dict[str, tuple[str, Any]] = {
    "op_id": ("int64", None),
    "rank": ("int32", None),
    "lane": ("int32", None),
    "kind": ("int8", None),
    "name_id": ("int32", None),
    "start_ns": ("int64", None),
    "dur_ns": ("int64", None),
    "step": ("int32", -1),
    "phase": ("int8", int(Phase.UNKNOWN)),
    "layer": ("int32", -1),
    "microbatch": ("int32", -1),
    "stage": ("int16", -1),
    "chunk": ("int16", -1),
    "coll_id": ("int64", -1),
    "comm_op": ("int8", int(CommOp.NONE)),
    "bytes": ("int64", 0),
    "group_id": ("int32", -1),
    "peer": ("int32", -1),
    "flops": ("float64", np.nan),
    "correlation": ("int64", -1),
    "external_id": ("int64", -1),
}

LANES_SCHEMA: dict[str, tuple[str, Any]] = {
    "lane": ("int32", None),
    "rank": ("int32", None),
    "device": ("int32", -1),
    "lane_kind": ("int8", None),
    "native_id": ("int64", -1),
    "name": ("object", ""),
}

EDGES_SCHEMA: dict[str, tuple[str, Any]] = {
    "src": ("int64", None),
    "dst": ("int64", None),
    "kind": ("int8", None),
    "lag_ns": ("int64", 0),
}

RANGES_SCHEMA: dict[str, tuple[str, Any]] = {
    "rank": ("int32", None),
    "lane": ("int32", None),
    "name_id": ("int32", None),
    "start_ns": ("int64", None),
    "end_ns": ("int64", None),
    "depth": ("int16", 0),
}

GROUPS_COLUMNS = ("group_id", "name", "ranks")

MEMORY_SCHEMA: dict[str, tuple[str, Any]] = {
    "rank": ("int32", None),
    "device": ("int32", -1),
    "ts_ns": ("int64", None),
    "bytes_delta": ("int64", 0),
    "allocated_bytes": ("int64", -1),
    "reserved_bytes": ("int64", -1),
}

_TABLES = ("ops", "lanes", "edges", "ranges", "groups", "memory", "strings")
#: tables a rank-partitioned store keeps whole (small: one row per lane, group, name)
_WHOLE_TABLES = ("lanes", "groups", "strings")


def empty_accounting() -> dict[str, Any]:
    """A fresh per-input accounting record: ``events_read == sum(kept) + sum(dropped)``."""
    return {"events_read": 0, "kept": {}, "dropped": {}}


class StringTable:
    """Interns names to dense ``int32`` ids (the Trace's ``strings`` table)."""

    __slots__ = ("_ids", "names")

    def __init__(self, names: list[str] | None = None) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        for n in names or ():
            self.intern(n)

    def intern(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = len(self.names)
            self._ids[name] = i
            self.names.append(name)
        return i

    def __len__(self) -> int:
        return len(self.names)


def _frame(schema: dict[str, tuple[str, Any]], data: dict[str, Any] | pd.DataFrame | None,
           table: str, n: int | None = None) -> pd.DataFrame:
    """Build a DataFrame in ``schema`` order, casting dtypes and filling defaults.

    Raises TraceValidationError naming every required column that is missing.
    """
    return pd.DataFrame(_columns(schema, data, table, n), copy=False)


def _columns(schema: dict[str, tuple[str, Any]], data: dict[str, Any] | pd.DataFrame | None,
             table: str, n: int | None = None) -> dict[str, np.ndarray]:
    """:func:`_frame`'s columns as numpy arrays (no DataFrame: the rank-wise ingest turns
    them into Arrow directly)."""
    if data is None:
        data = {}
    if isinstance(data, pd.DataFrame):
        cols = {c: data[c].to_numpy() for c in data.columns}
    else:
        cols = dict(data)
    if n is None:
        n = 0
        for c in cols.values():
            n = len(c)
            break
    missing = [c for c, (_, d) in schema.items() if d is None and c not in cols and n > 0]
    if missing:
        raise TraceValidationError(
            f"{table}: missing required column(s) {', '.join(missing)}; "
            f"provide them or use the defaults of collectors.trace.{table.upper()}_SCHEMA"
        )
    out: dict[str, Any] = {}
    for c, (dt, default) in schema.items():
        if c in cols:
            v = cols[c]
            if dt == "object":
                out[c] = np.asarray(v, dtype=object)
            else:
                out[c] = np.ascontiguousarray(v, dtype=dt)
        else:
            if dt == "object":
                out[c] = np.full(n, default if default is not None else "", dtype=object)
            else:
                out[c] = np.full(n, 0 if default is None else default, dtype=dt)
    return out


@dataclass
class Trace:
    """Columnar tables of one run. Build with :meth:`Trace.build`, save with :meth:`save`."""

    ops: pd.DataFrame
    lanes: pd.DataFrame
    edges: pd.DataFrame
    ranges: pd.DataFrame
    groups: pd.DataFrame
    memory: pd.DataFrame
    strings: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        *,
        ops: dict[str, Any] | pd.DataFrame,
        lanes: dict[str, Any] | pd.DataFrame,
        strings: list[str] | StringTable,
        edges: dict[str, Any] | pd.DataFrame | None = None,
        ranges: dict[str, Any] | pd.DataFrame | None = None,
        groups: pd.DataFrame | list[dict[str, Any]] | None = None,
        memory: dict[str, Any] | pd.DataFrame | None = None,
        meta: dict[str, Any] | None = None,
        validate: bool = True,
    ) -> Trace:
        """Assemble a Trace from column dicts (missing optional columns get defaults).

        ``op_id`` defaults to ``arange(N)``. Collectors call this once at the end.
        """
        if isinstance(ops, dict) and "op_id" not in ops:
            n = len(next(iter(ops.values()))) if ops else 0
            ops = {"op_id": np.arange(n, dtype=np.int64), **ops}
        if isinstance(strings, StringTable):
            strings = strings.names
        if groups is None:
            groups_df = pd.DataFrame({"group_id": np.zeros(0, np.int32),
                                      "name": np.zeros(0, object),
                                      "ranks": np.zeros(0, object)})
        else:
            groups_df = pd.DataFrame(groups) if not isinstance(groups, pd.DataFrame) else groups
            groups_df = pd.DataFrame({
                "group_id": np.asarray(groups_df["group_id"], dtype=np.int32),
                "name": np.asarray(groups_df["name"], dtype=object),
                "ranks": [list(map(int, r)) for r in groups_df["ranks"]],
            })
        m = {"schema_version": SCHEMA_VERSION}
        m.update(meta or {})
        t = cls(
            ops=_frame(OPS_SCHEMA, ops, "ops"),
            lanes=_frame(LANES_SCHEMA, lanes, "lanes"),
            edges=_frame(EDGES_SCHEMA, edges, "edges"),
            ranges=_frame(RANGES_SCHEMA, ranges, "ranges"),
            groups=groups_df,
            memory=_frame(MEMORY_SCHEMA, memory, "memory"),
            strings=list(strings),
            meta=m,
        )
        if validate:
            t.validate()
        return t

    # ------------------------------------------------------------------ properties
    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def ranks(self) -> np.ndarray:
        """Sorted unique ranks that have at least one lane."""
        return np.unique(self.lanes["rank"].to_numpy())

    @property
    def world_size(self) -> int:
        ws = self.meta.get("world_size")
        if ws:
            return int(ws)
        r = self.ranks
        return int(r.max()) + 1 if len(r) else 0

    def names(self) -> np.ndarray:
        """Op names as an object array aligned with ``ops`` (decoded from ``strings``)."""
        s = np.asarray(self.strings, dtype=object)
        return s[self.ops["name_id"].to_numpy()] if len(s) else np.zeros(0, object)

    def ops_frame(self) -> pd.DataFrame:
        """The pandas view of ``ops`` for notebooks: adds a categorical ``name`` column and
        readable ``kind``/``phase``/``comm_op`` categoricals. Codes stay as in the store."""
        df = self.ops.copy()
        cats = pd.Categorical.from_codes(df["name_id"].to_numpy(), categories=pd.Index(
            _dedupe(self.strings))) if len(self.strings) else pd.Categorical([])
        df.insert(4, "name", cats)
        df["kind_name"] = pd.Categorical.from_codes(
            df["kind"].to_numpy(), categories=[k.name for k in OpKind])
        return df

    def step_times_ns(self) -> pd.DataFrame:
        """Measured span (first start to last end) of each rank's ops: rank, start, end, span."""
        o = self.ops
        if len(o) == 0:
            return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": [], "span_ns": []})
        end = o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()
        g = pd.DataFrame({"rank": o["rank"].to_numpy(), "start_ns": o["start_ns"].to_numpy(),
                          "end_ns": end}).groupby("rank", sort=True)
        r = g.agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()
        r["span_ns"] = r["end_ns"] - r["start_ns"]
        return r

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check schema and references; raise one TraceValidationError naming every problem."""
        problems: list[str] = []
        for table, schema in (("ops", OPS_SCHEMA), ("lanes", LANES_SCHEMA),
                              ("edges", EDGES_SCHEMA), ("ranges", RANGES_SCHEMA),
                              ("memory", MEMORY_SCHEMA)):
            df = getattr(self, table)
            missing = [c for c in schema if c not in df.columns]
            if missing:
                problems.append(f"{table} lacks column(s) {', '.join(missing)}")
            for c, (dt, _) in schema.items():
                if c in df.columns and dt != "object" and str(df[c].dtype) != dt:
                    problems.append(f"{table}.{c} has dtype {df[c].dtype}, expected {dt}")
        for c in GROUPS_COLUMNS:
            if c not in self.groups.columns:
                problems.append(f"groups lacks column {c}")
        if problems:
            raise TraceValidationError("invalid trace: " + "; ".join(problems))
        o = self.ops
        n = len(o)
        if n:
            if not np.array_equal(o["op_id"].to_numpy(), np.arange(n)):
                problems.append("ops.op_id is not dense 0..N-1 in row order")
            if (o["dur_ns"].to_numpy() < 0).any():
                bad = int(np.flatnonzero(o["dur_ns"].to_numpy() < 0)[0])
                problems.append(f"ops.dur_ns is negative (first at op {bad})")
            nid = o["name_id"].to_numpy()
            if nid.min() < 0 or nid.max() >= len(self.strings):
                problems.append(f"ops.name_id outside strings (0..{len(self.strings) - 1})")
            lanes = self.lanes["lane"].to_numpy()
            bad_lane = ~np.isin(o["lane"].to_numpy(), lanes)
            if bad_lane.any():
                problems.append(f"ops.lane refers to unknown lane(s) "
                                f"{sorted(set(o['lane'].to_numpy()[bad_lane].tolist()))[:5]}")
            kinds = o["kind"].to_numpy()
            if kinds.min() < 0 or kinds.max() > max(OpKind):
                problems.append("ops.kind outside OpKind")
            # an op's rank must be its lane's rank
            lane_rank = pd.Series(self.lanes["rank"].to_numpy(), index=lanes)
            if not bad_lane.any():
                lr = lane_rank.reindex(o["lane"].to_numpy()).to_numpy()
                if (lr != o["rank"].to_numpy()).any():
                    problems.append("ops.rank differs from the rank of its lane")
        if len(self.lanes["lane"]) != len(np.unique(self.lanes["lane"].to_numpy())):
            problems.append("lanes.lane has duplicates")
        lk = self.lanes["lane_kind"].to_numpy()
        if len(lk) and (lk.min() < 0 or lk.max() > max(LaneKind)):
            problems.append("lanes.lane_kind outside LaneKind")
        e = self.edges
        if len(e):
            s, d = e["src"].to_numpy(), e["dst"].to_numpy()
            if s.min() < 0 or d.min() < 0 or s.max() >= n or d.max() >= n:
                problems.append(f"edges refer to op ids outside 0..{n - 1} (dangling edges)")
            k = e["kind"].to_numpy()
            if k.min() < 0 or k.max() > max(EdgeKind):
                problems.append("edges.kind outside EdgeKind")
            if (s == d).any():
                problems.append("edges contain self-loops")
        r = self.ranges
        if len(r) and (r["end_ns"].to_numpy() < r["start_ns"].to_numpy()).any():
            problems.append("ranges with end_ns < start_ns")
        if problems:
            raise TraceValidationError("invalid trace: " + "; ".join(problems))

    # ------------------------------------------------------------------ storage
    def save(self, path: str | os.PathLike[str], *, overwrite: bool = True,
             layout: str = "single") -> Path:
        """Write ``path`` (a ``NAME.retime`` directory) atomically; return the path.

        ``layout="single"`` writes one Parquet file per table; ``layout="rank"`` writes the
        per-rank tables (ops, edges, ranges, memory) as one file per rank under
        ``TABLE/rank=N/part-0.parquet`` (see :mod:`collectors.store`), which
        :func:`read_trace` reads back into the same Trace and the scans of
        :mod:`collectors.store` read rank by rank.
        """
        from .store import LAYOUTS, commit_store, new_store_dir, write_partitions

        if layout not in LAYOUTS:
            raise TraceFormatError(f"layout {layout!r} is not known; choose one of {LAYOUTS}")
        path = Path(path)
        if path.exists() and not overwrite:
            raise TraceFormatError(f"{path} exists; pass overwrite=True or choose another name")
        tmp = new_store_dir(path)
        try:
            meta = dict(self.meta)
            meta["schema_version"] = SCHEMA_VERSION
            meta["layout"] = layout
            whole = _TABLES if layout == "single" else _WHOLE_TABLES
            for name in whole:
                write_parquet(_arrow_table(self, name), tmp / f"{name}.parquet")
            if layout == "rank":
                meta["partitions"] = write_partitions(tmp, self)
            write_meta(tmp, meta)
            commit_store(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path


def _arrow_table(trace: Trace, name: str) -> pa.Table:
    """One table of ``trace`` as the Arrow table stored for it."""
    if name == "strings":
        return strings_table(trace.strings)
    if name == "groups":
        return groups_table(trace.groups)
    return pa.Table.from_pandas(getattr(trace, name), preserve_index=False)


def strings_table(strings: list[str]) -> pa.Table:
    return pa.table({"name_id": pa.array(np.arange(len(strings), dtype=np.int32)),
                     "name": pa.array(strings, type=pa.string())})


def groups_table(g: pd.DataFrame) -> pa.Table:
    return pa.table({
        "group_id": pa.array(g["group_id"].to_numpy(dtype=np.int32)),
        "name": pa.array([str(x) for x in g["name"]], type=pa.string()),
        "ranks": pa.array([list(map(int, x)) for x in g["ranks"]], type=pa.list_(pa.int32())),
    })


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How every table of a store is written (every writer passes these, so that all files
    of a store are alike): LZ4 (Parquet's LZ4_RAW), no dictionary pages, and delta encoding
    for the top-level 64-bit integer columns.

    Why: the columns are ids, times and counts with few repeats per page (op ids, start
    times, edge ends) or tiny ranges (kinds, phases): building dictionaries for them was the
    larger part of the write time and the dictionaries mostly fell back to plain pages anyway,
    while deltas of sorted or slowly varying integers pack to a few bits each. On one 54 MB
    Kineto rank's tables (bench/scale.py) this writes ~2.5x faster and the files are ~2x
    smaller; readers see the same Arrow columns.

    Column statistics (min/max per row group) are written only for the columns scans filter
    on (:data:`STAT_COLUMNS`: ``rank`` prunes a single-file store's row groups, ``kind`` and
    ``step`` filters are pushed down): the others were computed and never read (~5% of the
    write time of a rank's tables).

    LZ4 rather than zstd (level 1): a rank's tables write in ~0.84x the CPU time (4 ms of
    25 ms per 54 MB rank; about 3% of a whole ingest) and read back faster, for ~11% more
    bytes (the delta encoding already packs the integer columns); ``bench/store_write.py``.

    Only the 64-bit columns (ids, times, sizes) are delta-encoded: the narrower ones (ranks,
    lanes, name ids, kinds, steps, phases) hold few distinct values, and LZ4 packs their plain
    pages as well (a rank's tables 0.893 -> 0.923 MB) while they write faster (31.3 -> 25.7 ms
    of CPU per 54 MB rank, ~18%, medians of 25 alternating writes; ``bench/store_write.py``).
    """
    wide = [f.name for f in schema if pa.types.is_integer(f.type) and f.type.bit_width == 64]
    return {"compression": "lz4", "use_dictionary": False,
            "column_encoding": dict.fromkeys(wide, "DELTA_BINARY_PACKED"),
            "write_statistics": [c for c in STAT_COLUMNS if c in schema.names]}


#: the columns a store's Parquet files keep min/max statistics for (:func:`parquet_options`)
STAT_COLUMNS = ("rank", "kind", "step")


def write_parquet(tbl: pa.Table, f: Path) -> None:
    """Write one table of a store (:func:`parquet_options`)."""
    f.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(tbl, f, **parquet_options(tbl.schema))


def write_meta(root: Path, meta: dict[str, Any]) -> None:
    with open(root / "meta.json", "w", encoding="utf-8") as fh:
        json.dump(_jsonable(meta), fh, indent=1, sort_keys=True)


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of a store, its schema version checked (1 and 2 are read)."""
    if not path.is_dir() or not (path / "meta.json").is_file():
        raise TraceFormatError(
            f"{path}: not a retime trace directory (expected NAME.retime/ with meta.json); "
            "create one with `retime ingest FILES -o NAME.retime`")
    try:
        with open(path / "meta.json", encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TraceFormatError(f"{path / 'meta.json'}: unreadable ({exc}); re-ingest the trace") from exc
    ver = meta.get("schema_version")
    if ver not in READ_VERSIONS:
        raise TraceFormatError(
            f"{path}: schema_version {ver!r} is not supported (this retime reads "
            f"{', '.join(map(str, READ_VERSIONS))}); re-ingest the source files with this version")
    return meta


def read_trace(path: str | os.PathLike[str], *, columns: list[str] | None = None,
               fill_defaults: bool = True, skip: tuple[str, ...] = ()) -> Trace:
    """Load a ``NAME.retime`` directory written by :meth:`Trace.save` (either layout, and
    version-1 stores).

    ``columns`` restricts the ``ops`` columns read (missing ones get their defaults, or,
    with ``fill_defaults=False``, are left out: a partial Trace for code that reads only
    those columns, never saved). ``skip`` names per-rank tables (``ranges``, ``memory``)
    not to read (they come back empty). The returned ``meta`` is the in-memory one:
    ``schema_version`` is :data:`SCHEMA_VERSION` and the storage keys (``layout``,
    ``partitions``) are left out, so both layouts of one trace read back equal.
    """
    from .store import read_partitioned

    path = Path(path)
    meta = read_meta(path)
    layout = meta.pop("layout", "single")
    parts = meta.pop("partitions", None)
    meta["schema_version"] = SCHEMA_VERSION
    tables: dict[str, Any] = {}
    bad = [x for x in skip if x not in ("ranges", "memory")]
    if bad:
        raise TraceFormatError(f"read_trace(skip={bad}): only ranges and memory can be skipped")
    for name in _TABLES:
        cols = columns if (name == "ops" and columns) else None
        if name in skip:
            tables[name] = None
            continue
        if layout == "rank" and name not in _WHOLE_TABLES:
            tables[name] = read_partitioned(path, name, parts, cols)
            continue
        f = path / f"{name}.parquet"
        if not f.is_file():
            raise TraceFormatError(f"{path}: missing {name}.parquet; re-ingest the trace")
        try:
            tables[name] = pq.read_table(f, columns=cols).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise TraceFormatError(f"{f}: unreadable Parquet ({exc}); re-ingest the trace") from exc
    strings = [str(s) for s in tables.pop("strings")["name"].tolist()]
    g = tables["groups"]
    g["ranks"] = [list(map(int, x)) for x in g["ranks"]]
    ops = tables["ops"]
    if fill_defaults or not columns:
        ops = _frame(OPS_SCHEMA, ops, "ops", n=len(ops))
    else:  # only the columns asked for, in the schema's dtypes (no default-filled columns)
        ops = pd.DataFrame({c: np.ascontiguousarray(
            ops[c].to_numpy() if c in ops.columns else np.zeros(0), OPS_SCHEMA[c][0])
            for c in OPS_SCHEMA if c in columns}, copy=False)
    return Trace(
        ops=ops,
        lanes=_frame(LANES_SCHEMA, tables["lanes"], "lanes"),
        edges=_frame(EDGES_SCHEMA, tables["edges"], "edges"),
        ranges=_frame(RANGES_SCHEMA, tables["ranges"], "ranges"),
        groups=g,
        memory=_frame(MEMORY_SCHEMA, tables["memory"], "memory"),
        strings=strings,
        meta=meta,
    )


def _dedupe(names: list[str]) -> list[str]:
    """Categories must be unique; the string table already is, but guard old stores."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            out.append(f"{n} #{seen[n]}")
        else:
            seen[n] = 0
            out.append(n)
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return x
