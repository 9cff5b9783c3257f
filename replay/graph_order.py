"""Topological order of a replay graph's super-nodes, and the error that names a cycle.

Split from :mod:`replay.graph`: a collective's members form one *super-node* (they start
together), :func:`_order_or_raise` orders the super-nodes by Kahn's algorithm with measured
start times as the tie-break (numba kernels in :mod:`replay._kernels`), and when some cannot
be ordered :func:`_cycle_message` finds one cycle and describes its ops.
"""

from __future__ import annotations

import numpy as np
from retime.collectors.errors import ReplayError

from ._kernels import _node_succ, _topo_order_by_time

_I64 = np.int64
_I32 = np.int32


def _node_of(n, coll_of, coll_ptr, members) -> np.ndarray:
    node_of = np.arange(n, dtype=_I32)
    if len(members):
        first = members[coll_ptr[:-1]]
        node_of[members] = first[coll_of[members]]
    return node_of


def _dep_pairs(node_of, lane_prev, pred_src, pred_ptr, wait_src, wait_ptr):
    """(src node, dst node) of every dependency between different super-nodes."""
    n = len(node_of)
    hp = lane_prev >= 0
    pdst = np.repeat(np.arange(n, dtype=_I64), np.diff(pred_ptr))
    wdst = np.repeat(np.arange(n, dtype=_I64), np.diff(wait_ptr))
    a = np.concatenate([node_of[lane_prev[hp]], node_of[pred_src], node_of[wait_src]])
    b = np.concatenate([node_of[np.flatnonzero(hp)], node_of[pdst], node_of[wdst]])
    k = a != b
    return a[k], b[k]


def _order_or_raise(node_of, lane_prev, pred_ptr, pred_src, wait_ptr, wait_src, trace,
                    start_ns, *, key, perm=None) -> np.ndarray:
    i32 = np.int32
    succ_ptr, succ_dst, indeg = _node_succ(
        node_of, np.ascontiguousarray(lane_prev, i32), np.ascontiguousarray(pred_ptr, i32),
        np.ascontiguousarray(pred_src, i32), np.ascontiguousarray(wait_ptr, i32),
        np.ascontiguousarray(wait_src, i32))
    order, count = _topo_order_by_time(node_of, succ_ptr, succ_dst, indeg,
                                       np.ascontiguousarray(key, _I64))
    del succ_ptr, succ_dst, indeg
    n_nodes = int((node_of == np.arange(len(node_of))).sum())
    if count < n_nodes:  # error path: the pairs again, to find and describe a cycle
        a, b = _dep_pairs(node_of, lane_prev, pred_src, pred_ptr, wait_src, wait_ptr)
        raise ReplayError(_cycle_message(node_of, a, b, order, trace, start_ns, perm))
    return order


def _cycle_message(node_of, a, b, order, trace, start_ns, perm=None) -> str:
    """Find one cycle among the nodes Kahn's algorithm could not order and describe it."""
    n = len(node_of)
    done = np.zeros(n, bool)
    done[order] = True
    left = ~done[b] & ~done[a]
    pa, pb = a[left], b[left]
    preds: dict[int, int] = {}
    for x, y in zip(pa.tolist(), pb.tolist(), strict=True):  # error path only
        preds.setdefault(y, x)
    u = next(iter(preds))
    seen: dict[int, int] = {}
    path: list[int] = []
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = preds[u]
    cyc = path[seen[u]:][::-1]
    def describe(v: int) -> str:
        if perm is not None:  # layout position -> op id
            v = int(perm[v])
        if trace is not None:
            row = trace.ops.iloc[v]
            nm = trace.strings[int(row["name_id"])] if trace.strings else "?"
            return (f"op {v} (rank {int(row['rank'])}, lane {int(row['lane'])}, {nm!r}, "
                    f"start {int(row['start_ns'])} ns)")
        return f"op {v} (start {int(start_ns[v])} ns)"

    parts = []
    for v in cyc[:12]:
        members = np.flatnonzero(node_of == v)
        if len(members) > 1:  # a collective: every member is on the cycle
            parts.append("collective [" + ", ".join(describe(int(m)) for m in members[:8])
                         + (" ..." if len(members) > 8 else "") + "]")
        else:
            parts.append(describe(v))
    more = f" ... ({len(cyc)} ops in all)" if len(cyc) > 12 else ""
    return ("dependency cycle, the replay cannot order these ops: " + " -> ".join(parts)
            + more + "; a collective matched in a different order on two ranks or an edge "
            "against lane order causes this: fix the ingest's matching or drop the edge")
