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
    keep = np.ones(len(o), bool) if ranks is None else np.isin(o["rank"].to_numpy(), ranks)
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
    rkeep = np.ones(len(r), bool) if ranks is None else np.isin(r["rank"].to_numpy(), ranks)
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
    ev_i = np.r_[rsel, leaf, calls].astype(np.int64)
    order = np.lexsort((ev_t, -ev_e, ev_s, ev_lane))
    # step/phase of each instance: the first host op at or after its start on its lane
    host_ops = np.flatnonzero(on_cpu & ((kind == OpKind.CPU_OP) | (kind == OpKind.RUNTIME)))
    hl_order = host_ops[np.lexsort((start[host_ops], lane[host_ops]))]
    hl_key_l, hl_key_s = lane[hl_order], start[hl_order]
    node_of_call = np.full(len(o), -1, np.int64)
    stack_node: list[int] = []
    stack_end: list[int] = []
    stack_inst: list[int] = []
    inst_dur: list[int] = []
    inst_node: list[int] = []
    inst_child: list[int] = []
    cur_lane = None
    for j in order.tolist():
        ln, s_, e_, ty, idx = int(ev_lane[j]), int(ev_s[j]), int(ev_e[j]), int(ev_t[j]), int(ev_i[j])
        if ln != cur_lane:
            cur_lane = ln
            stack_node.clear()
            stack_end.clear()
            stack_inst.clear()
        while stack_end and s_ >= stack_end[-1]:
            stack_end.pop()
            stack_node.pop()
            stack_inst.pop()
        if ty == 2:  # a runtime call: counts for its enclosing node
            node_of_call[idx] = stack_node[-1] if stack_node else -1
            continue
        if stack_node:
            parent = stack_node[-1]
            inst_child[stack_inst[-1]] += min(e_, stack_end[-1]) - s_
        else:
            if ty == 1:
                st_, ph_ = int(step[idx]), int(phase[idx])
            else:
                p = _first_at(hl_key_l, hl_key_s, ln, s_)
                q = hl_order[p] if p >= 0 else -1
                st_ = int(step[q]) if q >= 0 else -1
                ph_ = int(phase[q]) if q >= 0 else -1
            parent = ph_node(st_, ph_)
        nm = str(names[nid[idx]]) if ty == 1 else str(r_name[idx])
        node = tree.child(parent, nm, "operator" if ty == 1 else _range_level(nm))
        tree.count[node] += 1
        inst_dur.append(e_ - s_)
        inst_node.append(node)
        inst_child.append(0)
        stack_node.append(node)
        stack_end.append(e_)
        stack_inst.append(len(inst_dur) - 1)
    for d_, nd, ch in zip(inst_dur, inst_node, inst_child, strict=True):
        add(host_excl, nd, d_ - ch)
    # launch calls: count and time at their enclosing node (or their step/phase)
    for c in calls[is_launch[calls]].tolist():
        nd = int(node_of_call[c])
        if nd < 0:
            nd = ph_node(int(step[c]), int(phase[c]))
        add(launches, nd, 1)
        add(launch_ns, nd, int(dur[c]))
    # ---- GPU ops: below the node around their launch, else step / phase (/ layer / module)
    gpu = np.flatnonzero(keep & ~on_cpu & np.isin(kind, [int(k) for k in _DEVICE_KINDS]))
    layer = o["layer"].to_numpy()
    # one pass per distinct (launch node | step, phase, layer) and name, not per op (millions
    # on a large run): groups in order of first appearance, so the nodes are created in the
    # order a per-op pass would create them
    lc = launch_of[gpu]
    nd0 = np.where(lc >= 0, node_of_call[np.maximum(lc, 0)], -1)
    own = nd0 < 0  # below their step / phase (/ layer / module)
    by_layer = own & (lc < 0) & (not len(r))
    keys = pd.DataFrame({
        "nd": nd0, "step": np.where(own, step[gpu], 0), "phase": np.where(own, phase[gpu], 0),
        "layer": np.where(by_layer, layer[gpu], -2), "name_id": nid[gpu]})
    grp = keys.assign(dur=dur[gpu]).groupby(list(keys.columns), sort=False)["dur"].agg(
        ["size", "sum"]).reset_index()
    for g_nd, g_st, g_ph, g_ly, g_nm, g_n, g_dur in zip(
            *(grp[c].tolist() for c in grp.columns), strict=True):
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
