"""Export traces as Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

Layout of the file:

* one process per rank (``pid`` = rank, named ``rank R``) and one thread per lane (``tid`` =
  lane id, named after the lane); ops are complete events (``ph: X``);
* annotation ranges (``record_function``, NVTX, ``ProfilerStep#``) as slices on their threads,
  so a CPU thread shows the step, the module and the operator nesting;
* dependencies as flow events (arrows): kernel launches, synchronizations, data and
  point-to-point edges, and for every collective instance an arrow from the member that
  arrived last to each other member (what the others waited for). Consecutive ops on one
  thread (``HOST_ORDER``) get no arrow: they already sit side by side;
* the critical path marked twice: its ops carry ``critical_path: true`` (and the category
  ``critical_path``), and a process named ``critical path`` at the top holds a copy of the
  path, op after op, on one track;
* a replayed timeline (a what-if) beside the measured one: its ranks are processes named
  ``rank R (replayed: SCENARIO)`` after the measured ranks, so either can be pinned, folded
  or filtered in the viewer.

Trace-event rules the writer keeps (and the tests check): complete events on one thread
nest (a slice that would partly overlap another moves to an extra ``(overlapping)`` track of
its lane); every flow id has one start (``s``) and one end (``f``, ``bp: e``), each at a
timestamp inside its op's slice on the op's thread and outside the op's children, so it
binds to that slice. Timestamps are microseconds from ``baseTimeNanoseconds`` (exact to the
nanosecond in a double). The ``retimeExport`` marker and the ops' ``args`` (``rank``,
``lane``, ``kind``, ``op_id``, and every other op column that is not at its default:
``step``, ``coll_id``, ``comm_op``, ``phase``, ``group``, ``peer``, ...) let ``retime ingest``
read the measured ops and the ranges back; for the measured run the ``retimeExport`` block
(schema 3) also carries what no event holds (:func:`export_payload`: groups, every edge by
``op_id``, the memory table, the collective counts and the run's meta), so the round trip
keeps steps, collective instances and edges.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .enums import CommOp, EdgeKind, LaneKind, OpKind
from .trace import _jsonable

__all__ = ["write_chrome", "chrome_events", "Timeline", "REPLAYED_PID", "CRITICAL_PID"]

_CAT = {
    OpKind.KERNEL: "kernel", OpKind.MEMCPY: "gpu_memcpy", OpKind.MEMSET: "gpu_memset",
    OpKind.COLLECTIVE: "kernel", OpKind.P2P: "kernel", OpKind.CPU_OP: "cpu_op",
    OpKind.RUNTIME: "cuda_runtime", OpKind.COMPUTE: "op", OpKind.SYNC: "cuda_sync",
}
#: pid offset of a replayed timeline's ranks, and the pid of the critical-path tracks
REPLAYED_PID = 1_000_000
CRITICAL_PID = 2_000_000
_OVERFLOW_TID = 1 << 30  # extra tracks of a lane: _OVERFLOW_TID + lane * 64 + level
_FLOW_EDGES = (EdgeKind.LAUNCH, EdgeKind.SYNC, EdgeKind.DATA, EdgeKind.COLLECTIVE, EdgeKind.P2P)


@dataclass(frozen=True)
class Timeline:
    """One timeline to export: a trace, optionally with replayed times (``start_ns`` /
    ``dur_ns`` per op), a ``label`` (``measured``, or the what-if's scenario) and the op ids
    on its critical path."""

    trace: Any
    start_ns: np.ndarray | None = None
    dur_ns: np.ndarray | None = None
    label: str = "measured"
    critical_op_ids: np.ndarray | None = None
    replayed: bool = False


def _levels(tid: np.ndarray, s: np.ndarray, e: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per slice (in ``order``: by thread, start, longest first), the track level on its
    thread at which it nests: 0 for the thread itself, 1.. for overflow tracks."""
    level = np.zeros(len(s), np.int64)
    stacks: list[list[int]] = []
    cur = None
    for i in order.tolist():
        if tid[i] != cur:
            cur = tid[i]
            stacks = [[]]
        si, ei = s[i], e[i]
        for lv, st in enumerate(stacks):
            while st and e[st[-1]] <= si:
                st.pop()
            if not st or ei <= e[st[-1]]:
                st.append(i)
                level[i] = lv
                break
        else:
            stacks.append([i])
            level[i] = len(stacks) - 1
    return level


def _free_points(track: np.ndarray, s: np.ndarray, e: np.ndarray, order: np.ndarray
                 ) -> np.ndarray:
    """Per slice, a time inside it and outside its direct children (the middle of its
    largest such gap): a flow event there binds to this slice. ``order`` sorts by track,
    start, longest first; slices on a track nest."""
    pt = (s + (e - s) // 2).astype(np.int64)
    parent = np.full(len(s), -1, np.int64)
    stack: list[int] = []
    cur = None
    for i in order.tolist():
        if track[i] != cur:
            cur = track[i]
            stack = []
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    has_child = parent >= 0
    if not has_child.any():
        return pt
    kids: dict[int, list[int]] = {}
    for c in np.flatnonzero(has_child).tolist():
        kids.setdefault(int(parent[c]), []).append(c)
    for p, cs in kids.items():
        cs.sort(key=lambda c: s[c])
        best, best_len = None, -1
        cursor = s[p]
        for c in cs:
            if s[c] - cursor > best_len:
                best, best_len = (cursor, s[c]), s[c] - cursor
            cursor = max(cursor, e[c])
        if e[p] - cursor > best_len:
            best, best_len = (cursor, e[p]), e[p] - cursor
        if best is not None and best_len > 0:
            pt[p] = best[0] + best_len // 2
    return pt


def _events_of(tl: Timeline, base: int, pid_offset: int, flow_id0: int, flows: bool
               ) -> tuple[list[dict], int]:
    """Events of one timeline (metadata, ranges, ops, flows, critical track)."""
    t = tl.trace
    o = t.ops
    n = len(o)
    st = o["start_ns"].to_numpy() if tl.start_ns is None else np.asarray(tl.start_ns, np.int64)
    du = o["dur_ns"].to_numpy() if tl.dur_ns is None else np.asarray(tl.dur_ns, np.int64)
    names = t.names()
    strings = np.asarray(t.strings, dtype=object)
    lanes = t.lanes
    lane_name = {int(ln.lane): (ln.name or f"{LaneKind(int(ln.lane_kind)).name.lower()} "
                                f"{ln.native_id}") for ln in lanes.itertuples(index=False)}
    lane_rank = dict(zip(lanes["lane"].to_numpy().tolist(), lanes["rank"].to_numpy().tolist()))
    suffix = f" ({tl.label})" if tl.replayed else ""
    ev: list[dict] = []
    for r in np.unique(lanes["rank"].to_numpy()):
        pid = pid_offset + int(r)
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"rank {int(r)}{suffix}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}})
    for ln in lanes.itertuples(index=False):
        kind = LaneKind(int(ln.lane_kind))
        ev.append({"ph": "M", "name": "thread_name", "pid": pid_offset + int(ln.rank),
                   "tid": int(ln.lane),
                   "args": {"name": lane_name[int(ln.lane)], "lane_kind": kind.name,
                            "native_id": int(ln.native_id), "device": int(ln.device)}})
    # slices: ranges then ops, on (lane, level) tracks
    rg = t.ranges
    nr = len(rg)
    if nr and tl.replayed and tl.start_ns is not None:
        nr = 0  # ranges of the measured run do not belong on a replayed timeline
    r_lane = rg["lane"].to_numpy()[:nr].astype(np.int64)
    r_s = rg["start_ns"].to_numpy()[:nr].astype(np.int64)
    r_e = np.maximum(rg["end_ns"].to_numpy()[:nr].astype(np.int64), r_s)
    lane = np.concatenate([r_lane, o["lane"].to_numpy().astype(np.int64)])
    s = np.concatenate([r_s, st.astype(np.int64)])
    e = np.concatenate([r_e, st.astype(np.int64) + du.astype(np.int64)])
    is_op = np.concatenate([np.zeros(nr, bool), np.ones(n, bool)])
    # ties: longer first, then a range before an op (the range encloses it)
    order = np.lexsort((is_op, -(e - s), s, lane))
    level = _levels(lane, s, e, order)
    track = lane * 64 + level
    torder = np.lexsort((is_op, -(e - s), s, track))
    point = _free_points(track, s, e, torder)
    tid = np.where(level == 0, lane, _OVERFLOW_TID + lane * 64 + level)
    for lv_lane, lv in {(int(a), int(b)) for a, b in zip(lane[level > 0], level[level > 0])}:
        ev.append({"ph": "M", "name": "thread_name", "pid": pid_offset + int(lane_rank[lv_lane]),
                   "tid": _OVERFLOW_TID + lv_lane * 64 + lv,
                   "args": {"name": f"{lane_name[lv_lane]} (overlapping {lv})"}})
    rel_s = s - base
    for j in range(nr):
        ev.append({"ph": "X", "cat": "user_annotation", "name": str(strings[rg["name_id"].iat[j]]),
                   "pid": pid_offset + int(rg["rank"].iat[j]), "tid": int(tid[j]),
                   "ts": int(rel_s[j]) / 1000.0, "dur": int(e[j] - s[j]) / 1000.0,
                   "args": {"rank": int(rg["rank"].iat[j]), "lane": int(r_lane[j]),
                            "range_depth": int(rg["depth"].iat[j]),
                            **({"timeline": "replayed"} if tl.replayed else {})}})
    crit = np.zeros(n, bool)
    if tl.critical_op_ids is not None and len(tl.critical_op_ids):
        crit[np.asarray(tl.critical_op_ids, np.int64)] = True
    rank = o["rank"].to_numpy()
    kind = o["kind"].to_numpy()
    coll = o["coll_id"].to_numpy()
    comm = o["comm_op"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    step = o["step"].to_numpy()
    corr = o["correlation"].to_numpy()
    extra = _extra_columns(o)
    for i in range(n):
        k = OpKind(int(kind[i]))
        args: dict[str, Any] = {"rank": int(rank[i]), "lane": int(lane[nr + i]), "op_id": i,
                                "kind": k.name}
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
        for key, col, default in extra:
            if col[i] != default:
                args[key] = col[i].item()
        if crit[i]:
            args["critical_path"] = True
        if tl.replayed:
            args["timeline"] = "replayed"
        ev.append({"ph": "X", "cat": _CAT[k] + (",critical_path" if crit[i] else ""),
                   "name": names[i], "pid": pid_offset + int(rank[i]), "tid": int(tid[nr + i]),
                   "ts": int(rel_s[nr + i]) / 1000.0, "dur": int(du[i]) / 1000.0, "args": args})
    fid = flow_id0
    if flows and n:
        src, dst, kinds = _flow_pairs(t, st)
        op_tid = tid[nr:]
        op_pt = point[nr:] - base
        for a, b, kd in zip(src.tolist(), dst.tolist(), kinds.tolist()):
            name = EdgeKind(kd).name.lower() if kd >= 0 else "collective"
            ev.append({"ph": "s", "id": fid, "cat": "dependency", "name": name,
                       "pid": pid_offset + int(rank[a]), "tid": int(op_tid[a]),
                       "ts": int(op_pt[a]) / 1000.0})
            ev.append({"ph": "f", "bp": "e", "id": fid, "cat": "dependency", "name": name,
                       "pid": pid_offset + int(rank[b]), "tid": int(op_tid[b]),
                       "ts": int(op_pt[b]) / 1000.0})
            fid += 1
    if crit.any():
        ev += _critical_track(tl, names, rank, st, du, base, pid_offset)
    return ev, fid


#: op columns written to an op's ``args`` (when not the default) beyond the ones above, so
#: that ``retime ingest`` gets them back: (args key, ops column, default)
_EXTRA_ARGS = (("phase", "phase", -1), ("layer", "layer", -1), ("microbatch", "microbatch", -1),
               ("stage", "stage", -1), ("chunk", "chunk", -1), ("group", "group_id", -1),
               ("peer", "peer", -1), ("External id", "external_id", -1))


def _extra_columns(o) -> list[tuple[str, np.ndarray, int]]:
    """(args key, column, default) of :data:`_EXTRA_ARGS` columns the ops table has and that
    hold a value other than the default."""
    out = []
    for key, c, default in _EXTRA_ARGS:
        if c in o.columns:
            col = o[c].to_numpy()
            if (col != default).any():
                out.append((key, col, default))
    if "flops" in o.columns:
        f = o["flops"].to_numpy(np.float64)
        if np.isfinite(f).any():
            out.append(("flops", np.where(np.isfinite(f), f, -1.0), -1.0))
    return out


#: meta keys that describe this ingest (the re-ingest writes its own), not the run
_NOT_CARRIED = ("accounting", "sources", "skipped_files", "schema_version", "layout",
                "partitions", "collectives")


def export_payload(trace) -> dict[str, Any]:
    """What the ``retimeExport`` block carries beyond the events, so that ``retime ingest``
    rebuilds the trace whole: the process groups, every dependency edge (by ``op_id``; the
    flow arrows draw only some), the memory table, the ingest's collective-matching counts
    and the run's meta (format, parallel layout, job, devices: what the what-ifs read)."""
    e = trace.edges
    g = trace.groups
    return {
        "n_ops": int(trace.n_ops),
        "groups": [{"group_id": int(a), "name": str(b), "ranks": [int(x) for x in r]}
                   for a, b, r in zip(g["group_id"], g["name"], g["ranks"])],
        "edges": {k: e[k].to_numpy().astype(np.int64).tolist()
                  for k in ("src", "dst", "kind", "lag_ns")},
        "memory": {k: trace.memory[k].to_numpy().astype(np.int64).tolist()
                   for k in trace.memory.columns},
        "collectives": trace.meta.get("collectives"),
        # the run's description (format, layout, job, devices, ...) the what-ifs read
        "meta": _jsonable({k: v for k, v in trace.meta.items() if k not in _NOT_CARRIED}),
    }


def _flow_pairs(t, start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, edge kind or -1) of the arrows: non-host-order edges, and per collective
    instance the last arriver -> each other member."""
    e = t.edges
    k = e["kind"].to_numpy()
    keep = np.isin(k, [int(x) for x in _FLOW_EDGES])
    src = [e["src"].to_numpy()[keep].astype(np.int64)]
    dst = [e["dst"].to_numpy()[keep].astype(np.int64)]
    kinds = [k[keep].astype(np.int64)]
    coll = t.ops["coll_id"].to_numpy()
    m = np.flatnonzero(coll >= 0)
    if len(m):
        order = m[np.lexsort((-start[m], coll[m]))]  # per instance, the latest start first
        c = coll[order]
        first = np.r_[True, c[1:] != c[:-1]]
        last_of = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        mem = ~first
        src.append(order[last_of[mem]])
        dst.append(order[mem])
        kinds.append(np.full(int(mem.sum()), -1, np.int64))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(kinds)


def _critical_track(tl: Timeline, names, rank, st, du, base: int, pid_offset: int
                    ) -> list[dict]:
    """A process with the critical path's ops in path order on one track (ops that overlap
    their predecessor go to a second track)."""
    ids = np.asarray(tl.critical_op_ids, np.int64)
    ids = ids[np.argsort(st[ids], kind="stable")]
    pid = CRITICAL_PID + (1 if tl.replayed else 0)
    label = f"critical path ({tl.label})"
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
          {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
           "args": {"sort_index": -2 + (1 if tl.replayed else 0)}}]
    s = st[ids].astype(np.int64)
    e = s + du[ids].astype(np.int64)
    tid0 = np.zeros(len(ids), np.int64)
    lv = _levels(tid0, s, e, np.lexsort((-(e - s), s)))
    for level in np.unique(lv):
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": int(level) + 1,
                   "args": {"name": "path" if level == 0 else f"path (overlapping {level})"}})
    for j, i in enumerate(ids.tolist()):
        ev.append({"ph": "X", "cat": "critical_path", "name": f"r{int(rank[i])} {names[i]}",
                   "pid": pid, "tid": int(lv[j]) + 1, "ts": int(s[j] - base) / 1000.0,
                   "dur": int(e[j] - s[j]) / 1000.0,
                   "args": {"path_of_rank": int(rank[i]), "path_op_id": int(i)}})
    return ev


def chrome_events(trace, start_ns=None, dur_ns=None, *, critical_op_ids=None,
                  flows: bool = True, also: tuple[Timeline, ...] = ()) -> tuple[list[dict], int]:
    """Build the event list; ``start_ns``/``dur_ns`` override the trace's times (a replayed
    trace); ``also`` adds timelines (e.g. a what-if's replay) after it. Returns (events,
    base time in ns)."""
    main = Timeline(trace, start_ns, dur_ns, "measured" if start_ns is None else "replayed",
                    critical_op_ids)
    tls = [main, *also]
    firsts = []
    for tl in tls:
        o = tl.trace.ops
        if len(o):
            firsts.append(int(np.min(o["start_ns"].to_numpy() if tl.start_ns is None
                                     else tl.start_ns)))
        if len(tl.trace.ranges) and not tl.replayed:
            firsts.append(int(tl.trace.ranges["start_ns"].min()))
    base = min(firsts) // 1000 * 1000 if firsts else 0
    ev: list[dict] = []
    fid = 1
    for i, tl in enumerate(tls):
        out, fid = _events_of(tl, base, REPLAYED_PID if tl.replayed and i else 0, fid, flows)
        ev += out
    return ev, base


def write_chrome(trace, path: str | os.PathLike[str], *, start_ns=None, dur_ns=None,
                 critical_op_ids=None, flows: bool = True, also: tuple[Timeline, ...] = ()
                 ) -> int:
    """Write the trace (optionally with replayed times, and more timelines in ``also``) to
    ``path`` (``.gz`` compresses). Returns the number of trace events written. Written
    atomically (temp file + rename)."""
    ev, base = chrome_events(trace, start_ns, dur_ns, critical_op_ids=critical_op_ids,
                             flows=flows, also=also)
    block = {"schema_version": 3, "world_size": trace.world_size}
    if start_ns is None and dur_ns is None:  # the measured run: carry what rebuilds it
        block.update(export_payload(trace))
    doc = {"schemaVersion": 1, "retimeExport": block,
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
