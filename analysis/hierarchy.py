"""Hierarchical attribution: step -> phase -> module/annotation -> operator -> kernel.

The tree comes from the trace's own annotations. Every range (``record_function`` /
``nn.Module`` / Python function / operator, NVTX) and every leaf operator on a CPU thread is
an *instance*; an instance's parent is the innermost instance on its thread that encloses
it. An outermost instance hangs below its ``step`` and ``phase`` node (from the op
attribution of the first host op inside it). A GPU op hangs below the innermost instance
around its launch call (``LAUNCH`` edge), or below its step and phase when nothing encloses
the launch or it has none. Instances and GPU ops with the same name under the same node
merge into one node (``count`` says how many). Synthesized runs (no ranges) use their
layer numbers and names: step -> phase -> ``layer N`` -> module (the name's first
component, ``attn`` of ``attn.qkv.fwd``) -> kernel.

Times per node (ns, summed over ranks):

* ``device_excl_ns`` — GPU ops (kernels, copies, sets, collectives, op-level compute)
  directly below the node: only kernel nodes have it. ``device_incl_ns`` = the subtree's
  sum. The root's ``device_incl_ns`` is the trace's total device time and the
  ``device_excl_ns`` of all nodes add up to it exactly.
* ``host_excl_ns`` — an instance's duration minus its direct children (ranges and leaf
  operators; runtime calls are not nodes and stay in their parent's exclusive time);
  ``host_incl_ns`` = the subtree's sum, so the root's is the time of the outermost host
  instances and every node's exclusive parts add up to it exactly.
* ``launches`` / ``launch_ns`` — launch calls (runtime calls with a ``LAUNCH`` edge) inside
  the subtree, and their time: the launch overhead at that level.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import EdgeKind, LaneKind, OpKind, Phase

from ._util import as_trace

__all__ = ["hierarchy", "LEVELS"]

LEVELS = ("root", "step", "phase", "layer", "module", "annotation", "operator", "kernel")
_PHASE_NAME = {int(Phase.FWD): "forward", int(Phase.BWD): "backward",
               int(Phase.OPT): "optimizer", int(Phase.OTHER): "other",
               int(Phase.UNKNOWN): "unattributed"}
_AUTOGRAD = re.compile(r"(Backward\d*|CppNode<.*>)$")
_DEVICE_KINDS = (OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET, OpKind.COLLECTIVE, OpKind.P2P,
                 OpKind.COMPUTE)


def _range_level(name: str) -> str:
    if _AUTOGRAD.search(name):
        return "operator"
    if ".py(" in name or name.startswith(("nn.Module:", "<built-in", "torch/", "<")):
        return "module"
    if "::" in name:
        return "operator"
    return "annotation"


class _Tree:
    """Nodes keyed by (parent, name); arrays grown in Python lists."""

    def __init__(self) -> None:
        self.parent: list[int] = [-1]
        self.name: list[str] = ["all"]
        self.level: list[str] = ["root"]
        self.key: dict[tuple[int, str], int] = {}
        self.count: list[int] = [0]

    def child(self, p: int, name: str, level: str) -> int:
        k = (p, name)
        i = self.key.get(k)
        if i is None:
            i = len(self.parent)
            self.key[k] = i
            self.parent.append(p)
            self.name.append(name)
            self.level.append(level)
            self.count.append(0)
        return i


def hierarchy(x: Any, *, ranks: list[int] | None = None) -> pd.DataFrame:
    """The attribution tree of ``x`` (a Trace or ReplayResult), one row per node.

    Parameters
    ----------
    ranks : list of int, optional
        Only these ranks (default: all, summed).

    Returns
    -------
    DataFrame with ``node_id`` (0 is the root), ``parent_id`` (-1 for the root), ``depth``,
    ``level`` (one of :data:`LEVELS`), ``name``, ``path`` (names joined by `` / ``),
    ``count``, ``device_incl_ns``, ``device_excl_ns``, ``host_incl_ns``, ``host_excl_ns``,
    ``launches`` and ``launch_ns``; rows in depth-first order, children by inclusive device
    time (then host time) descending.
    """
    t = as_trace(x)
    o = t.ops
    names = np.asarray(t.strings, dtype=object)
    keep = np.ones(len(o), bool) if ranks is None else isin(o["rank"].to_numpy(), ranks)
    kind = o["kind"].to_numpy()
    lane = o["lane"].to_numpy().astype(np.int64)
    lanes = t.lanes
    lk = np.full(int(lanes["lane"].max()) + 1 if len(lanes) else 1, -1, np.int64)
    lk[lanes["lane"].to_numpy()] = lanes["lane_kind"].to_numpy()
    on_cpu = lk[lane] == LaneKind.CPU_THREAD if len(o) else np.zeros(0, bool)
    start = o["start_ns"].to_numpy().astype(np.int64)
    dur = o["dur_ns"].to_numpy().astype(np.int64)
    end = start + dur
    step = o["step"].to_numpy()
    phase = o["phase"].to_numpy()
    nid = o["name_id"].to_numpy()
    has_steps = bool((step >= 0).any())
    tree = _Tree()
    phase_node: dict[tuple[int, int], int] = {}

    def ph_node(st: int, ph: int) -> int:
        k = (st, ph)
        i = phase_node.get(k)
        if i is None:
            sname = f"step {st}" if st >= 0 else ("outside steps" if has_steps else "all steps")
            s_i = tree.child(0, sname, "step")
            i = phase_node[k] = tree.child(s_i, _PHASE_NAME.get(ph, "unattributed"), "phase")
        return i

    dev_excl: dict[int, int] = {}
    host_excl: dict[int, int] = {}
    launches: dict[int, int] = {}
    launch_ns: dict[int, int] = {}

    def add(d: dict[int, int], k: int, v: int) -> None:
        d[k] = d.get(k, 0) + v

    # ---- host instances: ranges and leaf operators, per CPU thread
    r = t.ranges
    rkeep = np.ones(len(r), bool) if ranks is None else isin(r["rank"].to_numpy(), ranks)
    r_name = names[r["name_id"].to_numpy()] if len(r) else np.zeros(0, object)
    not_step = np.asarray([not str(s).startswith("ProfilerStep#") for s in r_name], bool)
    rsel = np.flatnonzero(rkeep & not_step)
    leaf = np.flatnonzero(keep & on_cpu & (kind == OpKind.CPU_OP))
    e = t.edges
    es, ed, ek = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    lmask = (ek == EdgeKind.LAUNCH) & on_cpu[es] & ~on_cpu[ed] if len(e) else np.zeros(0, bool)
    launch_of = np.full(len(o), -1, np.int64)
    launch_of[ed[lmask][::-1]] = es[lmask][::-1]  # the first launch edge of each GPU op
    calls = np.flatnonzero(keep & on_cpu & (kind == OpKind.RUNTIME))
    is_launch = np.zeros(len(o), bool)
    is_launch[es[lmask]] = True
    # events per lane: (start, -end, type order, index); type 0 range, 1 leaf op, 2 call
    ev_lane = np.r_[r["lane"].to_numpy()[rsel].astype(np.int64), lane[leaf], lane[calls]]
    ev_s = np.r_[r["start_ns"].to_numpy()[rsel].astype(np.int64), start[leaf], start[calls]]
    ev_e = np.r_[r["end_ns"].to_numpy()[rsel].astype(np.int64), end[leaf], end[calls]]
    ev_t = np.r_[np.zeros(len(rsel), np.int64), np.ones(len(leaf), np.int64),
                 np.full(len(calls), 2, np.int64)]
    ev_c = np.r_[r["name_id"].to_numpy()[rsel].astype(np.int64), nid[leaf].astype(np.int64),
                 np.full(len(calls), -1, np.int64)]
    ev_i = np.r_[rsel, leaf, calls].astype(np.int64)
    order = np.lexsort((ev_t, -ev_e, ev_s, ev_lane))
    ev_lane, ev_s, ev_e, ev_t, ev_c, ev_i = (a[order] for a in (ev_lane, ev_s, ev_e, ev_t,
                                                                ev_c, ev_i))
    # step/phase of each instance: the first host op at or after its start on its lane
    host_ops = np.flatnonzero(on_cpu & ((kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME)))
    hl_order = host_ops[np.lexsort((start[host_ops], lane[host_ops]))]
    node_of_call = _host_instances(tree, names, ev_lane, ev_s, ev_e, ev_t, ev_c,
                                   ev_i, step, phase, lane[hl_order], start[hl_order],
                                   hl_order, host_excl, len(o), has_steps)
    # launch calls: count and time at their enclosing node (or their step/phase), one
    # pass per distinct node (calls in order: nodes created as a per-call pass would)
    lcalls = calls[is_launch[calls]]
    if len(lcalls):
        nd0 = node_of_call[lcalls]
        own = nd0 < 0
        g = _first_seen_groups([nd0, np.where(own, step[lcalls], 0),
                                np.where(own, phase[lcalls], 0)], dur[lcalls])
        for g_nd, g_st, g_ph, g_n, g_dur in zip(*g, strict=True):
            nd = int(g_nd) if g_nd >= 0 else ph_node(int(g_st), int(g_ph))
            add(launches, nd, int(g_n))
            add(launch_ns, nd, int(g_dur))
    # ---- GPU ops: below the node around their launch, else step / phase (/ layer / module)
    gpu = np.flatnonzero(keep & ~on_cpu & isin(kind, [int(k) for k in _DEVICE_KINDS]))
    layer = o["layer"].to_numpy()
    # one pass per distinct (launch node | step, phase, layer) and name, not per op (millions
    # on a large run): groups in order of first appearance, so the nodes are created in the
    # order a per-op pass would create them
    lc = launch_of[gpu]
    nd0 = np.where(lc >= 0, node_of_call[np.maximum(lc, 0)], -1)
    own = nd0 < 0  # below their step / phase (/ layer / module)
    by_layer = own & (lc < 0) & (not len(r))
    grp = _first_seen_groups([nd0, np.where(own, step[gpu], 0), np.where(own, phase[gpu], 0),
                              np.where(by_layer, layer[gpu], -2), nid[gpu]], dur[gpu])
    for g_nd, g_st, g_ph, g_ly, g_nm, g_n, g_dur in zip(*grp, strict=True):
        nd = int(g_nd)
        nm = str(names[g_nm])
        if nd < 0:
            nd = ph_node(int(g_st), int(g_ph))
            if g_ly != -2:  # no launch and a trace without ranges: layer and module
                if g_ly >= 0:
                    nd = tree.child(nd, f"layer {int(g_ly)}", "layer")
                mod = nm.split(".", 1)[0] if "." in nm else ""
                if mod:
                    nd = tree.child(nd, mod, "module")
        k = tree.child(nd, nm, "kernel")
        tree.count[k] += int(g_n)
        add(dev_excl, k, int(g_dur))
    return _frame(tree, dev_excl, host_excl, launches, launch_ns)


def _first_seen_groups(keys: list[np.ndarray], val: np.ndarray) -> list[list[int]]:
    """Rows grouped by the key columns ``keys``, groups in order of first appearance (as
    ``groupby(sort=False)``): each key column's value per group, then the group's size and
    its sum of ``val`` (int64), as lists. The keys are combined into one dense int64 code
    and factorized once (a 5-key pandas groupby of 2 M rows took ~4x longer)."""
    n = len(val)
    code = np.zeros(n, np.int64)
    span = 1
    for k in keys:
        _, inv = unique(k, return_inverse=True)
        m = int(inv.max()) + 1 if n else 1
        if span * m >= 1 << 62:  # more combinations than one int64 code holds
            df = pd.DataFrame({f"k{i}": c for i, c in enumerate(keys)}).assign(v=val)
            g = df.groupby([f"k{i}" for i in range(len(keys))], sort=False)["v"].agg(
                ["size", "sum"]).reset_index()
            return [g[c].tolist() for c in g.columns]
        code = code * m + inv
        span *= m
    codes, _ = pd.factorize(code, sort=False)  # codes in order of first appearance
    k = int(codes.max()) + 1 if n else 0
    first = np.empty(k, np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1)  # the last write is each group's first row
    sums = np.zeros(k, np.int64)
    np.add.at(sums, codes, np.asarray(val, np.int64))
    return [np.asarray(c)[first].tolist() for c in keys] + [
        np.bincount(codes, minlength=k).tolist(), sums.tolist()]


def _host_instances(tree: _Tree, names: np.ndarray, ev_lane, ev_s, ev_e, ev_t, ev_c,
                    ev_i, step, phase, hl_lane, hl_start, hl_order, host_excl: dict,
                    n_ops: int, has_steps: bool) -> np.ndarray:
    """Place the host instances (events sorted by lane, start, -end, type) in ``tree``;
    add their exclusive host time to ``host_excl``; return the node of each runtime call's
    enclosing instance per op (-1 outside every instance).

    The stack walk is a numba kernel (:func:`analysis._kernels._host_nesting`); the nodes
    are found per depth, per distinct (parent node, name), and created in the order a walk
    event by event creates them (step, phase, then instance node of the first event that
    needs each), so node ids equal the event-by-event walk's.
    """
    from ._kernels import _host_nesting

    node_of_call = np.full(n_ops, -1, np.int64)
    n = len(ev_t)
    if n == 0:
        return node_of_call
    c = np.ascontiguousarray
    par, dep, child = _host_nesting(c(ev_lane, np.int64), c(ev_s, np.int64),
                                    c(ev_e, np.int64), c(ev_t, np.int64))
    tmp = np.full(n, -1, np.int64)  # provisional node of each instance event
    rows: list[tuple[np.ndarray, ...]] = []  # (parent, code, first event, sub, level kind)
    nxt = 1
    # outermost instances: their step and phase (leaf ops their own; ranges from the first
    # host op at or after their start on their lane, else the last before it)
    top = np.flatnonzero(dep == 0)
    st_top = np.full(len(top), -1, np.int64)
    ph_top = np.full(len(top), -1, np.int64)
    is_op = ev_t[top] == 1
    st_top[is_op] = step[ev_i[top[is_op]]]
    ph_top[is_op] = phase[ev_i[top[is_op]]]
    rg = top[~is_op]
    if len(rg):
        q = _first_at_many(hl_lane, hl_start, ev_lane[rg], ev_s[rg])
        ok = q >= 0
        qq = hl_order[q[ok]]
        st_r = np.full(len(rg), -1, np.int64)
        ph_r = np.full(len(rg), -1, np.int64)
        st_r[ok], ph_r[ok] = step[qq], phase[qq]
        st_top[~is_op], ph_top[~is_op] = st_r, ph_r
    # step and phase nodes keyed by their names (phases without a name share one)
    pu, pinv = unique(ph_top, return_inverse=True)
    pu_name = np.asarray([_PHASE_NAME.get(int(x), "unattributed") for x in pu], dtype=object)
    name_code, name_uni = pd.factorize(pu_name)
    ph_code = name_code[pinv.reshape(-1)].astype(np.int64)
    st_codes, st_uni = pd.factorize(st_top)
    first_s = _first_index(st_codes, len(st_uni))
    step_tmp = nxt + np.arange(len(st_uni))
    nxt += len(st_uni)
    for k, stv in enumerate(st_uni.tolist()):
        nm = f"step {stv}" if stv >= 0 else ("outside steps" if has_steps else "all steps")
        rows.append((0, nm, int(top[first_s[k]]), 0, "step"))
    ph_codes, ph_uni = pd.factorize(st_codes.astype(np.int64) * (len(name_uni) + 1) + ph_code)
    first_p = _first_index(ph_codes, len(ph_uni))
    phase_tmp = nxt + np.arange(len(ph_uni))
    nxt += len(ph_uni)
    for k in range(len(ph_uni)):
        j = int(first_p[k])
        rows.append((int(step_tmp[st_codes[j]]), str(name_uni[ph_code[j]]), int(top[j]), 1,
                     "phase"))
    parent_tmp = phase_tmp[ph_codes]
    m = int(len(names)) + 1
    for d in range(int(dep.max()) + 1 if len(dep) else 0):
        ev = top if d == 0 else np.flatnonzero(dep == d)
        if d:
            parent_tmp = tmp[par[ev]]
        codes, uni = pd.factorize(parent_tmp * m + ev_c[ev])
        first = _first_index(codes, len(uni))
        tmp[ev] = nxt + codes
        for k in range(len(uni)):
            j = int(ev[first[k]])
            nm = str(names[ev_c[j]])
            rows.append((int(parent_tmp[first[k]]), nm, j, 2,
                         "operator" if ev_t[j] == 1 else _range_level(nm)))
        nxt += len(uni)
    # create the nodes in walk order
    first_ev = np.asarray([x[2] for x in rows], np.int64)
    sub = np.asarray([x[3] for x in rows], np.int64)
    final = np.zeros(nxt, np.int64)  # provisional -> tree id (root 0 -> 0)
    for k in np.lexsort((sub, first_ev)).tolist():
        p, nm, _, _, lv = rows[k]
        final[k + 1] = tree.child(int(final[p]), nm, lv)
    inst = np.flatnonzero(ev_t != 2)
    node = final[tmp[inst]]
    cnt = np.bincount(node, minlength=len(tree.count))
    for i in np.flatnonzero(cnt).tolist():
        tree.count[i] += int(cnt[i])
    excl = pd.Series(ev_e[inst] - ev_s[inst] - child[inst]).groupby(node).sum()
    for k, v in zip(excl.index.tolist(), excl.tolist(), strict=True):
        host_excl[k] = host_excl.get(k, 0) + int(v)
    calls = np.flatnonzero(ev_t == 2)
    pc = par[calls]
    node_of_call[ev_i[calls]] = np.where(pc >= 0, final[tmp[np.maximum(pc, 0)]], -1)
    return node_of_call


def _first_index(codes: np.ndarray, k: int) -> np.ndarray:
    """Position of each group's first member (codes 0..k-1 of ``pd.factorize``)."""
    out = np.full(k, -1, np.int64)
    pos = np.arange(len(codes))[::-1]
    out[codes[::-1]] = pos
    return out


def _first_at_many(keys_l: np.ndarray, keys_s: np.ndarray, ln: np.ndarray,
                   s: np.ndarray) -> np.ndarray:
    """:func:`_first_at` for many (lane, start) queries (``ln`` sorted ascending)."""
    out = np.full(len(ln), -1, np.int64)
    if not len(ln):
        return out
    u, a = unique(ln, return_index=True)
    bounds = np.r_[a, len(ln)]
    lo = np.searchsorted(keys_l, u, side="left")
    hi = np.searchsorted(keys_l, u, side="right")
    for k in range(len(u)):
        if lo[k] == hi[k]:
            continue
        x, y = int(bounds[k]), int(bounds[k + 1])
        p = lo[k] + np.searchsorted(keys_s[lo[k]:hi[k]], s[x:y], side="left")
        out[x:y] = np.minimum(p, hi[k] - 1)
    return out


def _first_at(keys_l: np.ndarray, keys_s: np.ndarray, ln: int, s: int) -> int:
    """Index of the first (lane, start) >= (ln, s) on lane ``ln``, else the last before it
    on that lane, else -1."""
    lo = np.searchsorted(keys_l, ln, side="left")
    hi = np.searchsorted(keys_l, ln, side="right")
    if lo == hi:
        return -1
    p = lo + int(np.searchsorted(keys_s[lo:hi], s, side="left"))
    return p if p < hi else hi - 1


def _frame(tree: _Tree, dev_excl, host_excl, launches, launch_ns) -> pd.DataFrame:
    n = len(tree.parent)
    parent = np.asarray(tree.parent, np.int64)

    def arr(d):
        a = np.zeros(n, np.int64)
        if d:
            k = np.fromiter(d.keys(), np.int64, len(d))
            a[k] = np.fromiter(d.values(), np.int64, len(d))
        return a
    dx, hx, ln, lns = arr(dev_excl), arr(host_excl), arr(launches), arr(launch_ns)
    # inclusive sums: children were created after their parents (ids increase downwards)
    di, hi_, li, lni = dx.copy(), hx.copy(), ln.copy(), lns.copy()
    for i in range(n - 1, 0, -1):
        p = parent[i]
        di[p] += di[i]
        hi_[p] += hi_[i]
        li[p] += li[i]
        lni[p] += lni[i]
    count = np.asarray(tree.count, np.int64)
    count[0] = 1
    # depth-first order, children by inclusive device then host time
    kids: dict[int, list[int]] = {}
    for i in range(1, n):
        kids.setdefault(int(parent[i]), []).append(i)
    out, depth, path = [], np.zeros(n, np.int64), [""] * n
    path[0] = "all"
    stack = [0]
    while stack:
        i = stack.pop()
        out.append(i)
        ch = sorted(kids.get(i, []), key=lambda c: (-di[c], -hi_[c], c))
        for c in ch:
            depth[c] = depth[i] + 1
            path[c] = tree.name[c] if i == 0 else f"{path[i]} / {tree.name[c]}"
        stack.extend(reversed(ch))
    ids = np.asarray(out, np.int64)
    return pd.DataFrame({
        "node_id": ids, "parent_id": parent[ids], "depth": depth[ids],
        "level": pd.Categorical([tree.level[i] for i in ids], categories=list(LEVELS)),
        "name": [tree.name[i] for i in ids], "path": [path[i] for i in ids],
        "count": count[ids], "device_incl_ns": di[ids], "device_excl_ns": dx[ids],
        "host_incl_ns": hi_[ids], "host_excl_ns": hx[ids], "launches": li[ids],
        "launch_ns": lni[ids]})
