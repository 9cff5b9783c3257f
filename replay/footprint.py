"""What a replay of a stored trace needs in memory, said from the store's metadata before
anything is loaded (issue 30: "the replay graph ... says up front what memory it needs").

The figure is the sum of parts whose sizes follow from the row counts alone:

* the trace columns the replay reads (:data:`IDENTITY_COLUMNS` for an identity replay, the
  keys' :func:`key_columns` for a what-if whose policies declare theirs, every column
  otherwise; :mod:`replay.projection` decides): their dtypes' widths per op, the edges (25
  bytes each) and, for a full load, the annotations (29 bytes each; an identity replay keeps
  only the ``ProfilerStep`` ones, a few per rank, once read) and the memory samples (read
  for ``-o``, which also reads the columns the replay left out once it has run);
* the replay graph (:class:`replay.graph_data.ReplayGraph`): 79 bytes per op (int64 times and
  lags, int32 indices, int8/bool flags; ``rank``, ``lane`` and the measured times are the
  trace's own arrays) and 14 per kept edge (int32 source, int64 lag, int8 kind, bool);
* an identity replay without ``-o`` builds it a window of the run at a time
  (:mod:`replay.window`): one window's graph and temporaries (:data:`WINDOW_OPS` ops, its
  share of the edges), and the arrays the windows share (:data:`RUN_BYTES_PER_OP`,
  :data:`RUN_BYTES_PER_EDGE`: the results, lane links, window of each op, masks);
* read from a rank-partitioned store a window at a time (:mod:`replay.window_store`: no
  trace is loaded), the run's per-op arrays (:data:`STORE_RUN_BYTES_PER_OP`) and a window's
  edges read back from disk (:data:`STORE_BYTES_PER_WINDOW_EDGE`) instead of the trace;
* the building's temporaries at their peak (:data:`BUILD_BYTES_PER_OP`,
  :data:`BUILD_BYTES_PER_EDGE`: the per-op sort keys, masks and the CSR re-layout, measured
  with tracemalloc on a 32-rank store) and the interpreter with its libraries.

A what-if's policies make their own copies (re-priced durations, re-laid-out graphs); the
full-trace figure does not try to bound them and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from retime.collectors.errors import ReplayError
from retime.collectors.trace import (
    EDGES_SCHEMA,
    MEMORY_SCHEMA,
    OPS_SCHEMA,
    RANGES_SCHEMA,
    read_meta,
)

__all__ = ["IDENTITY_COLUMNS", "WHATIF_COLUMNS", "RUN_BYTES_PER_OP", "scenario_columns",
           "key_columns", "Footprint", "footprint", "available_bytes", "check_footprint"]

#: ops columns an identity replay reads: the graph's (rank, lane, kind, name_id for blocking
#: calls, times, coll_id) and the step windows' (step; correlation for launch waits)
IDENTITY_COLUMNS = ("rank", "lane", "kind", "name_id", "start_ns", "dur_ns", "coll_id", "step",
                    "correlation")

#: ops columns every what-if reads (:func:`replay.whatif`: the identity's, and the
#: collectives' traffic for the step range and the network's levels); a policy adds its own
#: (:meth:`replay.policies.base.Policy.ops_columns`)
WHATIF_COLUMNS = IDENTITY_COLUMNS + ("comm_op", "bytes", "group_id", "peer")


def scenario_columns(policies, *, synth: bool = False) -> tuple[str, ...] | None:
    """The ops columns a what-if of ``policies`` reads, in schema order: the union of
    :data:`WHATIF_COLUMNS` and each policy's declared set; ``None`` (every column) when
    any policy declares all (on a synthesized store, ``synth``, each policy's
    :meth:`~replay.policies.base.Policy.synth_columns_for`)."""
    need = set(WHATIF_COLUMNS)
    for p in policies:
        cols = p.ops_columns(synth=synth)
        if cols is None:
            return None
        need |= set(cols)
    return tuple(c for c in OPS_SCHEMA if c in need)


def key_columns(keys, *, synth: bool = False) -> tuple[str, ...] | None:
    """:func:`scenario_columns` of dotted keys by name alone (``--cluster`` chooses its
    values only once the trace is loaded; what a policy reads depends on which of its
    keys are set, not on their values)."""
    from .policies.scenario import TABLES

    by: dict[str, set[str]] = {}
    for k in keys:
        table, _, name = str(k).partition(".")
        by.setdefault(table, set()).add(name)
    need = set(WHATIF_COLUMNS)
    for table, names in by.items():
        cls = TABLES.get(table)
        cols = (None if cls is None else cls.synth_columns_for(frozenset(names)) if synth
                else cls.columns_for(frozenset(names)))
        if cols is None:
            return None
        need |= set(cols)
    return tuple(c for c in OPS_SCHEMA if c in need)

_WIDTH = {"int64": 8, "float64": 8, "int32": 4, "int16": 2, "int8": 1, "bool": 1}
GRAPH_BYTES_PER_OP = 79
GRAPH_BYTES_PER_EDGE = 14
#: peak temporaries of build_graph above the finished graph (tracemalloc, 32 ranks of the
#: scale bench: 162 MB over 2.44 M ops and 2.61 M edges), rounded up
BUILD_BYTES_PER_OP = 48
BUILD_BYTES_PER_EDGE = 24
#: a windowed replay's per-op arrays over the whole run (:mod:`replay.window`): lane links
#: (2 x 4), window index (2), results (3 x 8), the blocking flag (1) and a window's mask (2:
#: its ops and halo are gathered as ids); per edge two masks (the measured times and edges
#: are the trace's own arrays). (37: 42 before the host flag went per lane and the window's
#: four masks over the run went)
RUN_BYTES_PER_OP = 37
RUN_BYTES_PER_EDGE = 2
#: the same read from a rank-partitioned store a window at a time (:mod:`replay.window_store`:
#: the trace is not loaded): per op of the run, the arrays the windows share (start 8;
#: duration, collective, lane links 4 x 4; rank, lane 2 x 2; kind, blocking flag 2; window
#: 2) and a window's mask (2); per edge of a window, its spilled bucket read back and put in
#: order (5 x 8, twice). (43 since durations and collective ids are int32, set after seeing
#: the scale bench's 0.84 GB at 128 ranks against 0.92 GB estimated with 51; 34 since ranks
#: and lanes are int16, the host flag per lane and the window's masks ids: 9 bytes less)
STORE_RUN_BYTES_PER_OP = 34
STORE_BYTES_PER_WINDOW_EDGE = 80

#: the interpreter with numpy, pandas, pyarrow and numba's cached kernels loaded (0.22 GB
#: after the imports, ~0.08 GB more once the replay's kernels are loaded; set to 0.3 GB
#: after comparing the estimate with whole commands at 32 and 128 ranks: 0.79 / 2.58 GB
#: estimated with 0.2 GB here against 0.91 / 2.49 GB measured)
BASE_BYTES = 300_000_000


@dataclass(frozen=True)
class Footprint:
    """Row counts of a store and the bytes a replay of it needs (see the module docstring)."""

    ops: int
    edges: int
    ranges: int
    ranks: int
    trace_bytes: int
    graph_bytes: int
    peak_bytes: int
    full: bool
    #: how many of the ops columns are read (the schema has ``len(OPS_SCHEMA)``)
    columns: int = len(OPS_SCHEMA)
    #: the graph is built a window at a time (``graph_bytes``: one window's)
    windowed: bool = False
    #: and read from the store a window at a time (``trace_bytes``: the run's arrays)
    streamed: bool = False

    def line(self, available: int | None) -> str:
        """One line for stderr."""
        have = (f"; {available / 1e9:.1f} GB available" if available is not None else "")
        return (f"replay: {self.ops:,} ops, {self.edges:,} edges on {self.ranks} rank(s): needs "
                f"about {self.peak_bytes / 1e9:.1f} GB (trace: "
                + (f"read from the store a window at a time, {self.trace_bytes / 1e9:.2f} GB "
                   "of per-op arrays" if self.streamed else
                   f"{self.columns} of {len(OPS_SCHEMA)} ops columns, "
                   f"{self.trace_bytes / 1e9:.2f} GB") + f", graph {self.graph_bytes / 1e9:.2f} GB"
                + (" per window, replayed a window at a time" if self.windowed else
                   " whole") + ", building it and the interpreter the rest"
                + ("" if not self.full else "; a what-if's policies add their own copies")
                + f"){have}")


def _rows(path: Path, meta: dict, table: str) -> int:
    if meta.get("layout", "single") == "rank":
        parts = meta.get("partitions") or {}
        return int(sum(int(n) for n in (parts.get(table) or {}).values()))
    f = path / f"{table}.parquet"
    return int(pq.ParquetFile(f).metadata.num_rows) if f.is_file() else 0


def footprint(path: str | os.PathLike[str], *, full: bool = False,
              columns: tuple[str, ...] | None = None,
              memory: bool | None = None, windowed: bool = False,
              streamed: bool = False) -> Footprint:
    """The memory a replay of the store ``path`` needs, from its metadata alone.

    ``full``: a what-if or ``-o``, not an identity replay (:data:`IDENTITY_COLUMNS` and no
    memory table). With ``columns`` (a what-if's :func:`scenario_columns`, or the columns
    ``-o`` reads before the replay) only those ops columns, every annotation and no memory
    table (unless ``memory``: ``-o`` writes it) are read; without, the whole trace.
    ``windowed``: the graph is built a window at a time (an identity replay without ``-o``);
    ``streamed``: and its windows are read from a rank-partitioned store (no trace loaded).
    """
    p = Path(path)
    meta = read_meta(p)
    n, e, r = _rows(p, meta, "ops"), _rows(p, meta, "edges"), _rows(p, meta, "ranges")
    cols = (columns if columns is not None else list(OPS_SCHEMA)) if full else IDENTITY_COLUMNS
    per_op = sum(_WIDTH[OPS_SCHEMA[c][0]] for c in cols)
    trace = n * per_op + e * sum(_WIDTH[t] for t, _ in EDGES_SCHEMA.values())
    if full:
        trace += r * sum(_WIDTH[t] for t, _ in RANGES_SCHEMA.values())
    if full and (columns is None if memory is None else memory):
        trace += _rows(p, meta, "memory") * sum(_WIDTH[t] for t, _ in MEMORY_SCHEMA.values())
    from .window import WINDOW_OPS
    w = min(n, WINDOW_OPS) if windowed else n
    we = (e * w) // max(n, 1)
    graph = w * GRAPH_BYTES_PER_OP + we * GRAPH_BYTES_PER_EDGE
    peak = BASE_BYTES + trace + graph + w * BUILD_BYTES_PER_OP + we * BUILD_BYTES_PER_EDGE
    if windowed and streamed:  # no whole trace: the run's arrays and a window's edges
        trace = n * STORE_RUN_BYTES_PER_OP + we * STORE_BYTES_PER_WINDOW_EDGE
        peak = BASE_BYTES + trace + graph + w * BUILD_BYTES_PER_OP + we * BUILD_BYTES_PER_EDGE
    elif windowed:
        peak += n * RUN_BYTES_PER_OP + e * RUN_BYTES_PER_EDGE
    ranks = meta.get("world_size") or len((meta.get("partitions") or {}).get("ops", {}))
    return Footprint(ops=n, edges=e, ranges=r, ranks=int(ranks or 0), trace_bytes=int(trace),
                     graph_bytes=int(graph), peak_bytes=int(peak), full=bool(full),
                     columns=len(cols), windowed=bool(windowed),
                     streamed=bool(windowed and streamed))


def available_bytes() -> int | None:
    """Memory the system can give a new process now (Linux ``MemAvailable``; None where it
    cannot tell)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    return int(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_footprint(path: str | os.PathLike[str], *, full: bool = False,
                    columns: tuple[str, ...] | None = None, memory: bool | None = None,
                    available: int | None = None, windowed: bool = False,
                    streamed: bool = False) -> tuple[Footprint, str]:
    """(the footprint, its stderr line); raise :class:`ReplayError` when it exceeds the
    available memory (``available``, default :func:`available_bytes`)."""
    fp = footprint(path, full=full, columns=columns, memory=memory, windowed=windowed,
                   streamed=streamed)
    avail = available_bytes() if available is None else available
    if avail is not None and fp.peak_bytes > avail:
        raise ReplayError(
            f"{path}: a replay of {fp.ops:,} ops and {fp.edges:,} edges needs about "
            f"{fp.peak_bytes / 1e9:.1f} GB, and {avail / 1e9:.1f} GB is available; free "
            "memory, run it on a larger machine, or ingest fewer steps (the graph grows with "
            "the ops)")
    return fp, fp.line(avail)
