"""Re-ingest Chrome JSON written by ``retime export --chrome`` (collectors/chrome.py).

Such a file holds every rank; each X event's ``args`` carry ``rank``, ``lane`` and ``kind``
and each ``thread_name`` M event describes one lane, so ops come back on the same rank and
lane with the same name, start and duration, and annotation ranges (X events with
``range_depth``) come back as ranges. What the export adds for viewing is counted and left
out: a replayed timeline's copy of the ops, the critical-path track, and the flow events
(arrows: the export draws only some dependencies, so the re-ingested trace has no edges).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from ..chrome import REPLAYED_PID
from ..enums import LaneKind, OpKind
from ..trace import StringTable
from .schema import RankPart

__all__ = ["build_export_part"]


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
                 int(round(e.dur * 1000)), int(a.bytes or 0), int(a.correlation)))
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
            comm_op=np.zeros(n, np.int8), external_id=np.full(n, -1, np.int64),
        )
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
    head = RankPart(path=str(path), rank=-1, rank_source="retime export", world_size=None,
                    backend=None, pg_config=[], devices={}, strings=[], lanes=[], ops={},
                    edges={}, ranges={}, memory={}, comm={}, accounting=acc,
                    export_rank_parts=parts)
    return head
