"""Topological order of a replay graph's super-nodes, and the error that names a cycle.

Split from :mod:`replay.graph`: a collective's members form one *super-node* (they start
together), :func:`_order_or_raise` orders the super-nodes by Kahn's algorithm with measured
start times as the tie-break (numba kernels in :mod:`replay._kernels`), and when some cannot
be ordered :func:`_cycle_message` finds one cycle and describes its ops.
"""

from __future__ import annotations

import numpy as np

from retime.collectors.arrays import isin, unique
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


class CycleError(ReplayError):
    """A dependency cycle; keeps the super-node graph (op ids) to decide what to relax."""

    def __init__(self, msg: str, node_of: np.ndarray, a: np.ndarray, b: np.ndarray,
                 order: np.ndarray) -> None:
        super().__init__(msg)
        self.node_of, self.a, self.b, self.order = node_of, a, b, order


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
        raise CycleError(_cycle_message(node_of, a, b, order, trace, start_ns, perm),
                         node_of, a, b, order)
    return order


def _one_cycle(a: np.ndarray, b: np.ndarray) -> list[int]:
    """One cycle among the edges ``a[i] -> b[i]`` (every node left has a predecessor), as
    found by walking predecessors: ``cyc[i]`` is preceded by ``cyc[i + 1]``."""
    preds: dict[int, int] = {}
    for x, y in zip(a.tolist(), b.tolist(), strict=True):  # error path only
        preds.setdefault(y, x)
    u = next(iter(preds))
    seen: dict[int, int] = {}
    path: list[int] = []
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = preds[u]
    return path[seen[u]:]


def _cycle_message(node_of, a, b, order, trace, start_ns, perm=None) -> str:
    """Find one cycle among the nodes Kahn's algorithm could not order and describe it."""
    n = len(node_of)
    done = np.zeros(n, bool)
    done[order] = True
    left = ~done[b] & ~done[a]
    cyc = _one_cycle(a[left], b[left])[::-1]
    def describe(v: int) -> str:
        if perm is not None:  # layout position -> op id
            v = int(perm[v])
        if trace is not None:
            row = trace.ops.iloc[v]
            nm = trace.strings[int(row["name_id"])] if trace.strings else "?"
            nm = nm if len(nm) <= 32 else nm[:31] + "\u2026"
            return f"op {v} (rank {int(row['rank'])}, {nm!r})"
        return f"op {v} (start {int(start_ns[v])} ns)"

    parts = []
    for v in cyc[:3]:
        members = np.flatnonzero(node_of == v)
        if len(members) > 1:  # a collective: every member is on the cycle
            mm = members if perm is None else perm[members]
            if trace is not None:
                ranks = sorted(set(trace.ops["rank"].to_numpy()[mm].tolist()))
                nm = trace.strings[int(trace.ops["name_id"].to_numpy()[mm[0]])] \
                    if trace.strings else "?"
                nm = nm if len(nm) <= 32 else nm[:31] + "\u2026"
                on = " + ".join(f"rank {r}" for r in ranks[:4]) + (" ..." if len(ranks) > 4
                                                                    else "")
                parts.append(f"collective {nm!r} on {on} (ops "
                             f"{', '.join(map(str, mm[:2].tolist()))})")
            else:
                parts.append(f"collective of ops {', '.join(map(str, mm[:4].tolist()))}")
        else:
            parts.append(describe(v))
    more = f" -> ... ({len(cyc)} in all)" if len(cyc) > 3 else ""
    return ("dependency cycle: " + " -> ".join(parts) + more + " (a collective matched in "
            "different orders on two ranks, or an edge against lane order); replay without "
            "--strict relaxes the cross-rank links on it")


def choose_relaxations(exc: CycleError, rank: np.ndarray, start: np.ndarray,
                       end: np.ndarray, coll: np.ndarray, edge_src: np.ndarray,
                       edge_dst: np.ndarray) -> tuple[list[int], np.ndarray] | None:
    """The cross-rank links to relax so that the super-node graph of ``exc`` orders: a
    greedy cut, one link per cycle, taken where the measurement contradicts the link most
    (a collective whose members end furthest apart; an edge whose destination started
    longest before its source ended). Returns (coll ids to dissolve, mask of edges to drop),
    or None when a cycle holds no cross-rank link (an op's own rank orders it both ways)."""
    from retime.collectors._kernels import acyclic_nodes

    node_of = exc.node_of
    n = len(node_of)
    done = np.zeros(n, bool)
    done[exc.order] = True
    left = ~done[exc.a] & ~done[exc.b]
    a, b = exc.a[left].astype(np.int64), exc.b[left].astype(np.int64)
    # cross-rank edges, keyed by their super-node pair
    es, ed = np.asarray(edge_src, np.int64), np.asarray(edge_dst, np.int64)
    xr = rank[es] != rank[ed]
    xkey = node_of[es[xr]].astype(np.int64) * n + node_of[ed[xr]]
    xviol = end[es[xr]] - start[ed[xr]]
    # collective super-nodes: member end spread and rank count
    ci = np.flatnonzero(coll >= 0)
    ci = ci[np.argsort(node_of[ci], kind="stable")]
    cut = np.flatnonzero(np.diff(node_of[ci])) + 1
    members: dict[int, np.ndarray] = {}
    for m in np.split(ci, cut) if len(ci) else []:
        if len(m) > 1 and (rank[m] != rank[m[0]]).any():
            members[int(node_of[m[0]])] = m
    drop_pairs: set[int] = set()
    dissolve: set[int] = set()
    while len(a):
        nodes, inv = unique(np.r_[a, b], return_inverse=True)
        ia, ib = inv[:len(a)], inv[len(a):]
        ok = acyclic_nodes(len(nodes), ia, ib)
        if ok.all():
            break
        keep = ~ok[ia] & ~ok[ib]
        a, b = a[keep], b[keep]
        cyc = _one_cycle(a, b)  # cyc[i] is preceded by cyc[i + 1]
        best, what = None, None
        for i, v in enumerate(cyc):
            if v in members and v not in dissolve:
                m = members[v]
                w = int(end[m].max() - end[m].min())
                if best is None or w > best:
                    best, what = w, ("coll", v)
            p = cyc[(i + 1) % len(cyc)]
            k = p * n + v
            sel = xkey == k
            if sel.any():
                w = int(xviol[sel].max())
                if best is None or w > best:
                    best, what = w, ("edge", k)
        if what is None:
            return None
        if what[0] == "coll":
            dissolve.add(what[1])
            k2 = (a != what[1]) & (b != what[1])
            a, b = a[k2], b[k2]
        else:
            drop_pairs.add(what[1])
            k2 = a * n + b
            a, b = a[k2 != what[1]], b[k2 != what[1]]
    coll_ids = sorted({int(coll[members[v][0]]) for v in dissolve})
    drop = np.zeros(len(es), bool)
    if drop_pairs:
        full = node_of[es].astype(np.int64) * n + node_of[ed]
        drop = isin(full, list(drop_pairs)) & (rank[es] != rank[ed])
    return coll_ids, drop
