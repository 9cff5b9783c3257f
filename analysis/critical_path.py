"""Critical path across ranks, attributed by kind, lane and rank.

Two sources, one output format:

* a ReplayResult that carries ``crit_pred`` (the replay engine's critical-path predecessor of
  every op): the path is followed back from the op that ends last; the time between a
  predecessor's end and an op's start is the op's ``wait_ns``.
* a Trace (measured timings): the longest path of the dependency DAG, computed by a numba
  kernel in topological order. Nodes are ops weighted by ``dur_ns``; arcs are the trace's
  edges (weighted by ``lag_ns``), the implicit FIFO order of each lane (weight 0), and each
  collective instance (``coll_id``): a zero-length virtual node takes all members' incoming
  arcs and feeds every member, so all members start when the last one is ready (as the
  replay's fast path does). The topological order is the measured start order (collective
  members at their instance's last arrival); an arc that points backward in measured time
  cannot be a dependency that held and is dropped and counted (``attrs['dropped_arcs']``).

The returned path frame satisfies ``sum(dur_ns) + sum(wait_ns) == attrs['length_ns']``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import unique
from retime.collectors.enums import EdgeKind, OpKind
from retime.collectors.errors import RetimeError

from ._kernels import _backtrack, _longest_path
from ._util import as_trace, op_ends_ns

__all__ = ["critical_path", "attribute_critical_path", "dependency_arcs", "path_weights"]


#: wait categories on the path: the kind of the arc an op waited on
_LANE_ORDER = -1
_SYNC_RE = re.compile(r"Synchronize", re.I)


def dependency_arcs(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All dependency arcs between ops: explicit edges plus implicit lane FIFO order.

    Returns ``(src, dst, weight_ns, kind)`` int64 arrays; ``kind`` is the EdgeKind, or -1 for
    lane order (collective membership is not included).
    """
    o = trace.ops
    n = len(o)
    e = trace.edges
    # no copy of a column that already is int64: the concatenation below copies once
    src = [e["src"].to_numpy().astype(np.int64, copy=False)]
    dst = [e["dst"].to_numpy().astype(np.int64, copy=False)]
    w = [e["lag_ns"].to_numpy().astype(np.int64, copy=False)]
    k = [e["kind"].to_numpy().astype(np.int64, copy=False)]
    if n > 1:
        lane = o["lane"].to_numpy()
        start = o["start_ns"].to_numpy()
        order = np.lexsort((start, lane))  # stable: ties in op order
        same = lane[order[1:]] == lane[order[:-1]]
        src.append(order[:-1][same].astype(np.int64))
        dst.append(order[1:][same].astype(np.int64))
        w.append(np.zeros(int(same.sum()), np.int64))
        k.append(np.full(int(same.sum()), _LANE_ORDER, np.int64))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(w), np.concatenate(k)


def path_weights(trace) -> np.ndarray:
    """Node weight of every op on the longest path: its duration, except blocking host
    synchronization calls (runtime ``*Synchronize``), whose measured time is waiting for the
    device; the SYNC edge from the device op they waited for carries that dependency.
    (Collective members additionally weigh only their time after the last arrival, see
    :func:`critical_path`.)"""
    o = trace.ops
    dur = o["dur_ns"].to_numpy().astype(np.int64).copy()
    if len(trace.strings) and len(o):
        sync_name = np.array([bool(_SYNC_RE.search(s)) for s in trace.strings], bool)
        blocking = sync_name[o["name_id"].to_numpy()] & (o["kind"].to_numpy() == int(OpKind.RUNTIME))
        dur[blocking] = 0
    return dur


def _from_trace(t):
    """Longest path on measured timings.

    Returns (path op ids, node weight per path op, wait per path op, wait kind per path op,
    length, dropped arcs).
    """
    o = t.ops
    n = len(o)
    start = o["start_ns"].to_numpy().astype(np.int64)
    dur = path_weights(t)
    src, dst, w, kd = dependency_arcs(t)
    # collective instances with >= 2 members become virtual nodes n..n+k-1
    coll = o["coll_id"].to_numpy()
    key = start.copy()
    has = coll >= 0
    n_virt = n_intra = 0
    if has.any():
        ids = np.flatnonzero(has)
        _, inv, cnt = unique(coll[ids], return_inverse=True, return_counts=True)
        multi = cnt[inv] >= 2
        ids, inv = ids[multi], inv[multi]
        if len(ids):
            _, inv = unique(inv, return_inverse=True)
            n_virt = int(inv.max()) + 1
            vnode = np.full(n, -1, np.int64)
            vnode[ids] = n + inv
            last = np.full(n_virt, np.iinfo(np.int64).min, np.int64)
            np.maximum.at(last, inv, start[ids])
            # members run together from the last arrival on; clipping to the first member's
            # end keeps the order sane when rank clocks are skewed
            first_end = np.full(n_virt, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(first_end, inv, start[ids] + o["dur_ns"].to_numpy()[ids])
            last = np.minimum(last, first_end)
            key[ids] = np.maximum(start[ids], last[inv])
            # a member's measured time includes waiting for the last arriver; on the path
            # it weighs only the time after that arrival (the transfer)
            mend = start[ids] + o["dur_ns"].to_numpy()[ids]
            dur[ids] = np.maximum(mend - key[ids], 0)
            # redirect arcs into members to their virtual node; an intra-instance arc then
            # runs from a member back to its own virtual node, which sorts before every
            # member (key <= the member's, priority 0): it is dropped below as backward
            # and not counted (cheaper than copying every arc array without them)
            vd = vnode[dst]
            n_intra = int(np.count_nonzero((vd >= 0) & (vnode[src] == vd)))
            dst = np.where(vd >= 0, vd, dst)
            src = np.concatenate([src, n + inv])
            dst = np.concatenate([dst, ids])
            w = np.concatenate([w, np.zeros(len(ids), np.int64)])
            kd = np.concatenate([kd, np.full(len(ids), int(EdgeKind.COLLECTIVE), np.int64)])
            key = np.concatenate([key, last])
    n_all = n + n_virt
    dur_all = np.concatenate([dur, np.zeros(n_virt, np.int64)])
    prio = np.concatenate([np.ones(n, np.int64), np.zeros(n_virt, np.int64)])
    own = np.concatenate([start, key[n:]])
    # by (key, prio, own), ties by index (lexsort is stable); the 0/1 prio folded into key
    # where it fits: two sort passes instead of four on millions of ops
    if n_all and -(1 << 61) < int(key.min()) and int(key.max()) < (1 << 61):
        topo = np.lexsort((own, key * 2 + prio)).astype(np.int64)
    else:
        topo = np.lexsort((own, prio, key)).astype(np.int64)
    pos = np.empty(n_all, np.int64)
    pos[topo] = np.arange(n_all)
    fwd = pos[src] < pos[dst]
    dropped = int(len(fwd) - np.count_nonzero(fwd)) - n_intra
    # the kept arcs by (dst, src) as one index into the arrays: each array the kernel reads
    # is gathered once (millions of arcs), and the kinds only at the path's arcs
    fi = np.flatnonzero(fwd)
    f_src, f_dst = src[fi], dst[fi]
    order = (np.argsort(f_dst * n_all + f_src, kind="stable") if n_all < (1 << 31)
             else np.lexsort((f_src, f_dst)))  # by (dst, src): one pass where it fits
    arcs = fi[order]
    indptr = np.zeros(n_all + 1, np.int64)
    np.cumsum(np.bincount(f_dst, minlength=n_all), out=indptr[1:])
    es, best, best_arc = _longest_path(topo, indptr, np.ascontiguousarray(f_src[order]),
                                       np.ascontiguousarray(w[arcs]), dur_all)
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z, 0, dropped
    ef = es + dur_all
    last_op = int(np.argmax(ef[:n]))
    full = _backtrack(best, last_op)
    arc = best_arc[full]
    akind = (np.where(arc >= 0, kd[arcs[np.maximum(arc, 0)]], _LANE_ORDER) if len(arcs)
             else np.full(len(arc), _LANE_ORDER, np.int64))
    # a member reached through its collective's virtual node waited on the arc into it
    isv = full >= n
    akind[1:][isv[:-1]] = akind[:-1][isv[:-1]]
    keep = ~isv
    path, akind = full[keep], akind[keep]
    # An op may start before its predecessor on the path ends (a negative arc lag: a kernel
    # launch measured to start before its launch call returned). It then adds only its
    # part after the latest end so far, and waits 0: waits are never negative, and
    # sum(weight) + sum(wait) equals the length exactly (a telescoping sum of path ends).
    es_path = es[path]
    weight, wait, end = _path_parts(es_path, es_path + dur[path])
    length = int(end - es_path[0])
    return path, weight, wait, akind, length, dropped


def _path_parts(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(weight, wait, path end) of path ops with starts ``s`` and ends ``e`` in path order:
    ``wait`` = time from the latest end before the op to its start (>= 0), ``weight`` = the
    op's time after that latest end (>= 0); their sum over the path is end - s[0]."""
    if len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    prev_end = np.maximum.accumulate(e)
    before = np.concatenate([s[:1], prev_end[:-1]])
    wait = np.maximum(s - before, 0).astype(np.int64)
    weight = np.maximum(e - np.maximum(s, before), 0).astype(np.int64)
    return weight, wait, int(prev_end[-1])


def _from_replay(x, t) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    pred = np.ascontiguousarray(np.asarray(x.crit_pred), dtype=np.int64)
    start = np.asarray(x.start_ns, dtype=np.int64)
    end = np.asarray(x.end_ns, dtype=np.int64)
    n = len(start)
    if len(pred) != n:
        raise RetimeError(f"ReplayResult.crit_pred has {len(pred)} entries for {n} ops; "
                          "the replay result is inconsistent (re-run the replay)")
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    bad = (pred >= n) | (pred < -1)
    if bad.any():
        raise RetimeError(f"ReplayResult.crit_pred[{int(np.flatnonzero(bad)[0])}] is outside "
                          f"-1..{n - 1}; re-run the replay")
    last = int(np.argmax(end))
    path = _backtrack(pred, last)
    # an op may start before its predecessor ends (negative launch lags): it then adds only
    # its part after the latest end so far, so weights + waits add up to the length exactly
    s = start[path]
    weight, wait, path_end = _path_parts(s, end[path])
    return path, weight, wait, int(path_end - s[0])


def critical_path(x: Any) -> pd.DataFrame:
    """The critical path of a Trace (longest dependency path) or a ReplayResult (from
    ``crit_pred``), as one row per op on the path, in path order.

    Returns
    -------
    DataFrame with ``op_id``, ``rank``, ``lane``, ``kind`` (OpKind name), ``name``,
    ``start_ns`` (the op's start in ``x``), ``dur_ns`` (the op's weight on the path: its
    duration, 0 for blocking host synchronization calls on a measured trace; for an op that
    starts before its predecessor on the path ends, only its part after that end),
    ``path_start_ns`` (its start on the path, relative to the path start), ``wait_ns`` (lag
    or waiting before it; never negative) and ``wait_kind`` (EdgeKind name of the arc it waited on,
    ``LANE_ORDER`` for FIFO order on a lane, ``GAP`` for a replay).
    ``attrs``: ``length_ns`` (== sum of dur_ns and wait_ns), ``span_ns`` (first start to
    last end of all ops), ``source`` (``"replay"`` or ``"longest_path"``), ``dropped_arcs``.
    """
    t = as_trace(x)
    o = t.ops
    dropped = 0
    if getattr(x, "crit_pred", None) is not None and not _is_trace(x):
        path, d, wait, length = _from_replay(x, t)
        start = np.asarray(x.start_ns, dtype=np.int64)
        wait_kind = np.where(wait > 0, "GAP", "")
        source = "replay"
    else:
        path, d, wait, akind, length, dropped = _from_trace(t)
        start = o["start_ns"].to_numpy()
        # EdgeKind names by value; index -1 (lane order) picks the last entry
        labels = np.array([EdgeKind(i).name for i in range(len(EdgeKind))] + ["LANE_ORDER"],
                          dtype=object)
        wait_kind = np.where(wait != 0, labels[akind], "").astype(object)
        source = "longest_path"
    names = np.asarray(t.strings, dtype=object)
    kinds = o["kind"].to_numpy()[path]
    d = d.astype(np.int64)
    pstart = np.cumsum(wait + d) - d
    df = pd.DataFrame({
        "op_id": path.astype(np.int64),
        "rank": o["rank"].to_numpy()[path],
        "lane": o["lane"].to_numpy()[path],
        "kind": pd.Categorical.from_codes(kinds.astype(np.int64),
                                          categories=[OpKind(i).name for i in range(len(OpKind))]),
        "name": names[o["name_id"].to_numpy()[path]] if len(path) else np.zeros(0, object),
        "start_ns": start[path].astype(np.int64),
        "dur_ns": d,
        "path_start_ns": pstart.astype(np.int64),
        "wait_ns": wait.astype(np.int64),
        "wait_kind": np.asarray(wait_kind, dtype=object),
    })
    ends = op_ends_ns(t)
    df.attrs.update({
        "length_ns": int(length),
        "span_ns": int(ends.max() - o["start_ns"].min()) if len(o) else 0,
        "source": source,
        "dropped_arcs": int(dropped),
    })
    return df


def _is_trace(x: Any) -> bool:
    from retime.collectors.trace import Trace
    return isinstance(x, Trace)


def attribute_critical_path(cp: pd.DataFrame, *, by: str = "kind") -> pd.DataFrame:
    """Time on the critical path grouped ``by`` ``"kind"``, ``"lane"`` or ``"rank"``.

    Waiting time (dependency lags and gaps) gets rows ``WAIT:<arc kind>`` (by kind; ``ops``
    counts the ops that waited) or goes to the lane/rank of the op that waited. Columns:
    the key, ``ops``, ``time_ns``, ``share`` (of the path length).
    """
    if by not in ("kind", "lane", "rank"):
        raise RetimeError(f"attribute_critical_path(by={by!r}): choose kind, lane or rank")
    length = cp.attrs.get("length_ns") or int(cp["dur_ns"].sum() + cp["wait_ns"].sum())
    if by == "kind":
        g = cp.groupby("kind", observed=True).agg(ops=("op_id", "size"),
                                                   time_ns=("dur_ns", "sum")).reset_index()
        g["kind"] = g["kind"].astype(str)
        wt = cp[cp["wait_ns"] != 0]
        if len(wt):
            wg = wt.groupby("wait_kind").agg(ops=("op_id", "size"),
                                             time_ns=("wait_ns", "sum")).reset_index()
            wg["kind"] = "WAIT:" + wg["wait_kind"].astype(str)
            g = pd.concat([g, wg[["kind", "ops", "time_ns"]]], ignore_index=True)
    else:
        tmp = cp.assign(time_ns=cp["dur_ns"] + cp["wait_ns"])
        g = tmp.groupby(by).agg(ops=("op_id", "size"), time_ns=("time_ns", "sum")).reset_index()
    g["time_ns"] = g["time_ns"].astype(np.int64)
    g["share"] = g["time_ns"] / length if length else np.nan
    return g.sort_values("time_ns", ascending=False, kind="mergesort").reset_index(drop=True)
