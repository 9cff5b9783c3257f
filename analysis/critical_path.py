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

from typing import Any

import numpy as np
import pandas as pd

from collectors.enums import OpKind
from collectors.errors import RetimeError

from ._kernels import _backtrack, _longest_path
from ._util import as_trace, op_ends_ns

__all__ = ["critical_path", "attribute_critical_path", "dependency_arcs"]


def dependency_arcs(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All dependency arcs between ops: explicit edges plus implicit lane FIFO order.

    Returns ``(src, dst, weight_ns)`` int64 arrays (collective membership not included).
    """
    o = trace.ops
    n = len(o)
    e = trace.edges
    src = [e["src"].to_numpy().astype(np.int64)]
    dst = [e["dst"].to_numpy().astype(np.int64)]
    w = [e["lag_ns"].to_numpy().astype(np.int64)]
    if n > 1:
        lane = o["lane"].to_numpy()
        start = o["start_ns"].to_numpy()
        ids = np.arange(n, dtype=np.int64)
        order = np.lexsort((ids, start, lane))
        same = lane[order[1:]] == lane[order[:-1]]
        src.append(order[:-1][same].astype(np.int64))
        dst.append(order[1:][same].astype(np.int64))
        w.append(np.zeros(int(same.sum()), np.int64))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(w)


def _csr(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray):
    order = np.lexsort((src, dst))
    src, dst, w = src[order], dst[order], w[order]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, np.ascontiguousarray(src), np.ascontiguousarray(w)


def _from_trace(t) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Longest path on measured timings; returns (path op ids, wait per path op, es, length,
    dropped arcs)."""
    o = t.ops
    n = len(o)
    start = o["start_ns"].to_numpy().astype(np.int64)
    dur = o["dur_ns"].to_numpy().astype(np.int64)
    src, dst, w = dependency_arcs(t)
    # collective instances with >= 2 members become virtual nodes n..n+k-1
    coll = o["coll_id"].to_numpy()
    key = start.copy()
    has = coll >= 0
    n_virt = 0
    if has.any():
        ids = np.flatnonzero(has)
        uniq, inv, cnt = np.unique(coll[ids], return_inverse=True, return_counts=True)
        multi = cnt[inv] >= 2
        ids, inv = ids[multi], inv[multi]
        if len(ids):
            _, inv = np.unique(inv, return_inverse=True)
            n_virt = int(inv.max()) + 1
            vnode = np.full(n, -1, np.int64)
            vnode[ids] = n + inv
            last = np.full(n_virt, np.iinfo(np.int64).min, np.int64)
            np.maximum.at(last, inv, start[ids])
            # members run together from the last arrival on; clipping to the first member's
            # end keeps the order sane when rank clocks are skewed
            first_end = np.full(n_virt, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(first_end, inv, start[ids] + dur[ids])
            last = np.minimum(last, first_end)
            key[ids] = np.maximum(start[ids], last[inv])
            # redirect arcs into members to their virtual node (drop intra-instance arcs)
            vd = vnode[dst]
            intra = (vd >= 0) & (vnode[src] == vd)
            src, dst, w = src[~intra], dst[~intra], w[~intra]
            vd = vnode[dst]
            dst = np.where(vd >= 0, vd, dst)
            src = np.concatenate([src, n + inv])
            dst = np.concatenate([dst, ids])
            w = np.concatenate([w, np.zeros(len(ids), np.int64)])
            key = np.concatenate([key, last])
    n_all = n + n_virt
    dur_all = np.concatenate([dur, np.zeros(n_virt, np.int64)])
    prio = np.concatenate([np.ones(n, np.int64), np.zeros(n_virt, np.int64)])
    own = np.concatenate([start, key[n:]])
    topo = np.lexsort((np.arange(n_all), own, prio, key)).astype(np.int64)
    pos = np.empty(n_all, np.int64)
    pos[topo] = np.arange(n_all)
    fwd = pos[src] < pos[dst]
    dropped = int((~fwd).sum())
    indptr, psrc, pw = _csr(n_all, src[fwd], dst[fwd], w[fwd])
    es, best, best_w = _longest_path(topo, indptr, psrc, pw, dur_all)
    ef = es + dur_all
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), es, 0, dropped
    last_op = int(np.argmax(ef[:n]))
    path = _backtrack(best, last_op)
    path = path[path < n]  # virtual collective nodes are not ops
    length = int(ef[last_op] - es[path[0]])
    # the wait before an op is what its start on the path adds to its predecessor's end
    # (arc lag, a virtual node's incoming lag, or a clamped negative lag); it makes
    # sum(dur) + sum(wait) equal the length exactly
    es_path = es[path]
    wait = np.zeros(len(path), np.int64)
    wait[1:] = es_path[1:] - (es_path[:-1] + dur[path[:-1]])
    return path, wait, es, length, dropped


def _from_replay(x, t) -> tuple[np.ndarray, np.ndarray, int]:
    pred = np.ascontiguousarray(np.asarray(x.crit_pred), dtype=np.int64)
    start = np.asarray(x.start_ns, dtype=np.int64)
    end = np.asarray(x.end_ns, dtype=np.int64)
    n = len(start)
    if len(pred) != n:
        raise RetimeError(f"ReplayResult.crit_pred has {len(pred)} entries for {n} ops; "
                          "the replay result is inconsistent (re-run the replay)")
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    bad = (pred >= n) | (pred < -1)
    if bad.any():
        raise RetimeError(f"ReplayResult.crit_pred[{int(np.flatnonzero(bad)[0])}] is outside "
                          f"-1..{n - 1}; re-run the replay")
    last = int(np.argmax(end))
    path = _backtrack(pred, last)
    wait = np.zeros(len(path), np.int64)
    if len(path) > 1:
        wait[1:] = np.maximum(start[path[1:]] - end[path[:-1]], 0)
    return path, wait, int(end[last] - start[path[0]])


def critical_path(x: Any) -> pd.DataFrame:
    """The critical path of a Trace (longest dependency path) or a ReplayResult (from
    ``crit_pred``), as one row per op on the path, in path order.

    Returns
    -------
    DataFrame with ``op_id``, ``rank``, ``lane``, ``kind`` (OpKind name), ``name``,
    ``start_ns``, ``dur_ns`` (the op's timing in ``x``), ``path_start_ns`` (its start on the
    path, relative to the path start), ``wait_ns`` (dependency lag or waiting before it).
    ``attrs``: ``length_ns`` (== sum of dur_ns and wait_ns), ``span_ns`` (first start to
    last end of all ops), ``source`` (``"replay"`` or ``"longest_path"``), ``dropped_arcs``.
    """
    t = as_trace(x)
    o = t.ops
    dropped = 0
    if getattr(x, "crit_pred", None) is not None and not _is_trace(x):
        path, wait, length = _from_replay(x, t)
        start = np.asarray(x.start_ns, dtype=np.int64)
        dur = np.asarray(x.end_ns, dtype=np.int64) - start
        source = "replay"
    else:
        path, wait, _es, length, dropped = _from_trace(t)
        start = o["start_ns"].to_numpy()
        dur = o["dur_ns"].to_numpy()
        source = "longest_path"
    names = np.asarray(t.strings, dtype=object)
    kinds = o["kind"].to_numpy()[path]
    d = dur[path].astype(np.int64)
    pstart = np.cumsum(wait + d) - d
    df = pd.DataFrame({
        "op_id": path.astype(np.int64),
        "rank": o["rank"].to_numpy()[path],
        "lane": o["lane"].to_numpy()[path],
        "kind": pd.Categorical([OpKind(int(k)).name for k in kinds],
                               categories=[k.name for k in OpKind]),
        "name": names[o["name_id"].to_numpy()[path]] if len(path) else np.zeros(0, object),
        "start_ns": start[path].astype(np.int64),
        "dur_ns": d,
        "path_start_ns": pstart.astype(np.int64),
        "wait_ns": wait.astype(np.int64),
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
    from collectors.trace import Trace
    return isinstance(x, Trace)


def attribute_critical_path(cp: pd.DataFrame, *, by: str = "kind") -> pd.DataFrame:
    """Time on the critical path grouped ``by`` ``"kind"``, ``"lane"`` or ``"rank"``.

    Waiting time (dependency lags, waiting for a collective's last member) is its own row,
    ``WAIT`` (by kind) or attributed to the lane/rank of the op that waited. Columns:
    the key, ``ops``, ``time_ns``, ``share`` (of the path length).
    """
    if by not in ("kind", "lane", "rank"):
        raise RetimeError(f"attribute_critical_path(by={by!r}): choose kind, lane or rank")
    length = cp.attrs.get("length_ns") or int(cp["dur_ns"].sum() + cp["wait_ns"].sum())
    if by == "kind":
        g = cp.groupby("kind", observed=True).agg(ops=("op_id", "size"),
                                                   time_ns=("dur_ns", "sum")).reset_index()
        g["kind"] = g["kind"].astype(str)
        wait = int(cp["wait_ns"].sum())
        if wait:
            g = pd.concat([g, pd.DataFrame({"kind": ["WAIT"], "ops": [0], "time_ns": [wait]})],
                          ignore_index=True)
    else:
        tmp = cp.assign(time_ns=cp["dur_ns"] + cp["wait_ns"])
        g = tmp.groupby(by).agg(ops=("op_id", "size"), time_ns=("time_ns", "sum")).reset_index()
    g["time_ns"] = g["time_ns"].astype(np.int64)
    g["share"] = g["time_ns"] / length if length else np.nan
    return g.sort_values("time_ns", ascending=False, kind="mergesort").reset_index(drop=True)
