"""Export a Trace as Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

One process per rank (``pid`` = rank), one thread per lane (``tid`` = lane id). Timestamps
are microseconds relative to ``baseTimeNanoseconds`` (so they stay exact to the nanosecond
in a double). The file carries a ``retimeExport`` marker and each event's ``args`` hold
``rank``/``lane``/``lane_kind``/``op_id``, so ``retime ingest`` of an exported file restores
every op's rank, lane, name, start and duration.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import orjson

from .enums import CommOp, LaneKind, OpKind

__all__ = ["write_chrome", "chrome_events"]

_CAT = {
    OpKind.KERNEL: "kernel", OpKind.MEMCPY: "gpu_memcpy", OpKind.MEMSET: "gpu_memset",
    OpKind.COLLECTIVE: "kernel", OpKind.P2P: "kernel", OpKind.CPU_OP: "cpu_op",
    OpKind.RUNTIME: "cuda_runtime", OpKind.COMPUTE: "op", OpKind.SYNC: "cuda_sync",
}


def chrome_events(trace, start_ns=None, dur_ns=None) -> tuple[list[dict], int]:
    """Build the event list; ``start_ns``/``dur_ns`` override the trace's (replayed times)."""
    o = trace.ops
    st = o["start_ns"].to_numpy() if start_ns is None else np.asarray(start_ns, np.int64)
    du = o["dur_ns"].to_numpy() if dur_ns is None else np.asarray(dur_ns, np.int64)
    base = int(st.min()) // 1000 * 1000 if len(st) else 0
    names = trace.names()
    lanes = trace.lanes
    ev: list[dict] = []
    for r in np.unique(lanes["rank"].to_numpy()):
        ev.append({"ph": "M", "name": "process_name", "pid": int(r), "tid": 0,
                   "args": {"name": f"rank {int(r)}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": int(r), "tid": 0,
                   "args": {"sort_index": int(r)}})
    for ln in lanes.itertuples(index=False):
        kind = LaneKind(int(ln.lane_kind))
        ev.append({"ph": "M", "name": "thread_name", "pid": int(ln.rank), "tid": int(ln.lane),
                   "args": {"name": ln.name or f"{kind.name.lower()} {ln.native_id}",
                            "lane_kind": kind.name, "native_id": int(ln.native_id),
                            "device": int(ln.device)}})
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy()
    kind = o["kind"].to_numpy()
    coll = o["coll_id"].to_numpy()
    comm = o["comm_op"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    step = o["step"].to_numpy()
    corr = o["correlation"].to_numpy()
    rel = st - base
    for i in range(len(o)):
        k = OpKind(int(kind[i]))
        args = {"rank": int(rank[i]), "lane": int(lane[i]), "op_id": i, "kind": k.name}
        if coll[i] >= 0:
            args["coll_id"] = int(coll[i])
        if comm[i]:
            args["comm_op"] = CommOp(int(comm[i])).name
        if nbytes[i]:
            args["bytes"] = int(nbytes[i])
        if step[i] >= 0:
            args["step"] = int(step[i])
        if corr[i] >= 0:
            args["correlation"] = int(corr[i])
        ev.append({"ph": "X", "cat": _CAT[k], "name": names[i], "pid": int(rank[i]),
                   "tid": int(lane[i]), "ts": int(rel[i]) / 1000.0, "dur": int(du[i]) / 1000.0,
                   "args": args})
    return ev, base


def write_chrome(trace, path: str | os.PathLike[str], *, start_ns=None, dur_ns=None) -> int:
    """Write the trace (optionally with replayed times) to ``path`` (``.gz`` compresses).

    Returns the number of trace events written. Written atomically (temp file + rename).
    """
    ev, base = chrome_events(trace, start_ns, dur_ns)
    doc = {"schemaVersion": 1, "retimeExport": {"schema_version": 1,
                                                "world_size": trace.world_size},
           "baseTimeNanoseconds": base, "displayTimeUnit": "ns", "traceEvents": ev}
    data = orjson.dumps(doc)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=5)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(ev)
