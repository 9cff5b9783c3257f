"""Re-ingest Chrome JSON written by ``retime export --chrome`` (collectors/chrome.py).

Such a file holds every rank; each X event's ``args`` carry ``rank``, ``lane`` and ``kind``
and each ``thread_name`` M event describes one lane, so ops come back on the same rank and
lane with the same name, start and duration, and annotation ranges (X events with
``range_depth``) come back as ranges. The ops' other columns ride in their ``args`` too
(``step``, ``coll_id``, ``comm_op``, ``phase``, ``group``, ``peer``, ...), and the
``retimeExport`` block of a schema-3 file carries the process groups, every dependency edge
(by ``op_id``) and the source ingest's collective counts: :func:`collectors.kineto.merge.
merge_parts` puts them back, so steps, collective instances (their ids and pairing) and
edges survive the round trip. What the export adds for viewing is counted and left out: a
replayed timeline's copy of the ops, the critical-path track, and the flow events (arrows).
A schema-2 file (older export) has no edges and no collective ids: those come back empty.
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np

from ..chrome import REPLAYED_PID
from ..enums import CommOp, LaneKind, OpKind
from ..trace import StringTable
from .schema import RankPart

__all__ = ["build_export_part", "restore_block", "is_export_file"]


def is_export_file(path: Path) -> bool:
    """Whether ``path`` was written by ``retime export --chrome`` (its ``retimeExport``
    marker comes first in the file): such a file is read whole, in memory."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4096)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    return b'"retimeExport"' in head


def build_export_part(path: Path, doc) -> RankPart:
    evs = doc.traceEvents
    base = int(doc.baseTimeNanoseconds or 0)
    kept: Counter = Counter()
    dropped: Counter = Counter()
    lane_info: dict[int, tuple] = {}
    rows: dict[int, list] = {}
    ranges: dict[int, list] = {}
    for e in evs:
        a = e.args
        if e.ph in ("s", "f", "t"):
            dropped["flow events (arrows for viewing; not re-ingested)"] += 1
        elif e.ph == "X" and a is not None and a.timeline == "replayed":
            dropped["replayed timeline (a copy of the ops and ranges for viewing)"] += 1
        elif e.ph == "X" and a is not None and a.path_op_id is not None:
            dropped["critical-path track (a copy of the ops for viewing)"] += 1
        elif (e.ph == "X" and a is not None and a.range_depth is not None and a.rank is not None
              and a.lane is not None):
            ranges.setdefault(int(a.rank), []).append(
                (int(a.lane), str(e.name), base + int(round(e.ts * 1000)),
                 base + int(round(e.ts * 1000)) + int(round(e.dur * 1000)),
                 int(a.range_depth)))
            kept["ranges"] += 1
        elif e.ph == "M":
            kept["metadata"] += 1
            # lanes of the measured ranks only (not the replayed copies, the critical-path
            # track or the extra tracks of overlapping slices)
            if (e.name == "thread_name" and a is not None and isinstance(e.tid, int)
                    and a.lane_kind is not None and isinstance(e.pid, int)
                    and e.pid < REPLAYED_PID):
                lk = LaneKind[a.lane_kind] if a.lane_kind in LaneKind.__members__ else LaneKind.GPU_STREAM
                lane_info[e.tid] = (int(e.pid), int(lk), int(a.device if a.device is not None else -1),
                                    int(a.native_id if a.native_id is not None else -1), a.name or "")
        elif e.ph == "X" and a is not None and a.rank is not None and a.lane is not None:
            k = OpKind[a.kind] if a.kind in OpKind.__members__ else OpKind.KERNEL
            rows.setdefault(int(a.rank), []).append(
                (int(a.lane), int(k), str(e.name), base + int(round(e.ts * 1000)),
                 int(round(e.dur * 1000)), int(a.bytes or 0), int(a.correlation),
                 *[_num(getattr(a, f), d) for f, _c, d in _CARRIED]))
            kept["ops"] += 1
        else:
            dropped["event not written by retime export"] += 1
    parts = []
    for rank in sorted(rows):
        r = rows[rank]
        st = StringTable()
        rr = ranges.get(rank, [])
        lanes_of_rank = sorted({x[0] for x in r} | {x[0] for x in rr}
                               | {ln for ln, v in lane_info.items() if v[0] == rank})
        lmap = {ln: j for j, ln in enumerate(lanes_of_rank)}
        lanes = [(lane_info.get(ln, (rank, int(LaneKind.GPU_STREAM), -1, -1, ""))[1],
                  lane_info.get(ln, (0, 0, -1, -1, ""))[2], lane_info.get(ln, (0, 0, -1, -1, ""))[3],
                  rank, lane_info.get(ln, (0, 0, -1, -1, f"lane {ln}"))[4]) for ln in lanes_of_rank]
        n = len(r)
        ops = dict(
            lane=np.asarray([lmap[x[0]] for x in r], np.int32),
            kind=np.asarray([x[1] for x in r], np.int8),
            name_id=np.asarray([st.intern(x[2]) for x in r], np.int32),
            start_ns=np.asarray([x[3] for x in r], np.int64),
            dur_ns=np.asarray([x[4] for x in r], np.int64),
            bytes=np.asarray([x[5] for x in r], np.int64),
            correlation=np.asarray([x[6] for x in r], np.int64),
            step=np.full(n, -1, np.int32), phase=np.full(n, -1, np.int8),
        )
        for j, (_f, col, _d) in enumerate(_CARRIED):
            ops[col] = np.asarray([x[7 + j] for x in r], _DTYPE.get(col, np.int64))
        if "edges" not in doc.retimeExport:
            del ops["src_op_id"]  # an older (schema-2) export: no edges to map by op id
        z = np.zeros(0, np.int64)
        parts.append(RankPart(
            path=str(path), rank=rank, rank_source="retime export", world_size=None, backend=None,
            pg_config=[], devices={}, strings=st.names, lanes=lanes, ops=ops,
            edges=dict(src=z, dst=z, kind=np.zeros(0, np.int8), lag_ns=z),
            ranges=dict(lane=np.asarray([lmap[x[0]] for x in rr], np.int32),
                        name_id=np.asarray([st.intern(x[1]) for x in rr], np.int32),
                        start_ns=np.asarray([x[2] for x in rr], np.int64),
                        end_ns=np.asarray([x[3] for x in rr], np.int64),
                        depth=np.asarray([x[4] for x in rr], np.int16)),
            memory=dict(device=z, ts_ns=z, bytes_delta=z, allocated_bytes=z, reserved_bytes=z),
            comm={"op": z, "comm_op": np.zeros(0, np.int8), "bytes": z, "group": [],
                  "group_size": z, "seq": z, "pg_ranks": []},
            accounting={}))
    acc = {"events_read": len(evs), "kept": dict(kept), "dropped": dict(dropped)}
    block = dict(doc.retimeExport)
    if "edges" in block:
        acc["kept"]["edges (retimeExport block)"] = len(block["edges"].get("src", []))
    head = RankPart(path=str(path), rank=-1, rank_source="retime export", world_size=None,
                    backend=None, pg_config=[], devices={}, strings=[], lanes=[], ops={},
                    edges={}, ranges={}, memory={}, comm={}, accounting=acc,
                    export_rank_parts=parts, export_block=block)
    return head


#: (args field, ops column, default) the export writes per op (collectors.chrome); the
#: original ``op_id`` comes back as ``src_op_id`` (merge maps the block's edges by it)
_CARRIED = (("op_id", "src_op_id", -1), ("step", "step", -1), ("coll_id", "coll_id", -1),
            ("comm_op", "comm_op", 0), ("phase", "phase", -1), ("layer", "layer", -1),
            ("microbatch", "microbatch", -1), ("stage", "stage", -1), ("chunk", "chunk", -1),
            ("group", "group_id", -1), ("peer", "peer", -1), ("flops", "flops", np.nan),
            ("external_id", "external_id", -1))
_DTYPE = {"step": np.int32, "comm_op": np.int8, "phase": np.int8, "layer": np.int32,
          "microbatch": np.int32, "stage": np.int16, "chunk": np.int16, "group_id": np.int32,
          "peer": np.int32, "flops": np.float64}


def _num(v, default):
    """An args value as the column's number: ``comm_op`` names map to their code."""
    if v is None:
        return default
    if isinstance(v, str):
        if v in CommOp.__members__:
            return int(CommOp[v])
        try:
            return float(v) if isinstance(default, float) else int(v)
        except ValueError:
            return default
    return float(v) if isinstance(default, float) else int(v)


def restore_block(ops: dict[str, np.ndarray], block: dict, n: int
                  ) -> tuple[dict[str, list], dict, dict[str, np.ndarray]]:
    """Put a schema-3 export's carried tables back (``ops`` is the merged op columns, in
    merge order; its ``src_op_id`` column is consumed): the groups, the collective counts and
    the edges, renumbered from the exported ``op_id`` to the merged op index. Edges whose op
    is missing from the file (it was edited) are dropped and counted in the stats."""
    src_id = np.asarray(ops.pop("src_op_id", np.full(n, -1)), np.int64)
    n_src = int(block.get("n_ops") or (src_id.max() + 1 if n else 0))
    at = np.full(max(n_src, int(src_id.max()) + 1 if n else 0), -1, np.int64)
    ok = src_id >= 0
    at[src_id[ok]] = np.flatnonzero(ok)
    e = block.get("edges") or {}
    src = np.asarray(e.get("src", []), np.int64)
    dst = np.asarray(e.get("dst", []), np.int64)
    inside = (src >= 0) & (src < len(at)) & (dst >= 0) & (dst < len(at))
    s2 = np.where(inside, at[np.clip(src, 0, max(len(at) - 1, 0))], -1) if len(at) else src
    d2 = np.where(inside, at[np.clip(dst, 0, max(len(at) - 1, 0))], -1) if len(at) else dst
    keep = (s2 >= 0) & (d2 >= 0)
    edges = {"src": s2[keep], "dst": d2[keep],
             "kind": np.asarray(e.get("kind", []), np.int8)[keep],
             "lag_ns": np.asarray(e.get("lag_ns", []), np.int64)[keep]}
    g = block.get("groups") or []
    groups = {"group_id": [int(x["group_id"]) for x in g], "name": [str(x["name"]) for x in g],
              "ranks": [list(map(int, x["ranks"])) for x in g]}
    stats = dict(block.get("collectives") or
                 {"matched": int(len(np.unique(ops["coll_id"][ops["coll_id"] >= 0]))),
                  "unmatched": 0, "unmatched_reasons": {}})
    if int((~keep).sum()):
        stats["export_edges_dropped"] = int((~keep).sum())
    return groups, stats, edges
