"""Trace -> ReplayGraph: the contiguous arrays the replay kernels run on (DESIGN.md §4).

The graph's arrays and its copy-with methods: :mod:`replay.graph_data`.

Model (what one op waits for)
-----------------------------
* **Lane order.** Ops on one lane run FIFO in measured start order (ties by op id); an op
  starts after the previous op of its lane ends. Where the measurement shows the two
  overlapping (profiler rounding, op-level streams), the op is instead tied to its
  predecessor's start with the measured offset (``lane_s2s``).
* **Edges** ``src -> dst``: ``dst.start >= src.end + lag``. A negative lag (a kernel
  that starts before its launch call returns, skewed clocks) is stored as a fixed offset from ``src``'s
  *start* (``pred_s2s``), so a what-if that shortens the launch call does not pull the kernel
  ahead of it; both forms give the same time on the measured trace. Negative SYNC lags (a thread
  that resumes a little before the collective it waited for closes its range) stay counted
  from the source's end, so they move with it. A lag is clamped to the measured
  slack ``dst.start - src.end`` when the measurement contradicts it (counted in
  ``stats["edges_clamped"]``), so that the measured timeline is always feasible.
* **Release delay.** Every op's measured start minus its modeled ready time (computed from
  the measured ends of its predecessors) is a gap no dependency explains. It is kept as
  ``delay_ns`` (added to the ready time) unless ``ideal=True``; count and total are reported.
  An op with no predecessor at all is ready at its rank's first measured start (``origin``).
* **Collectives.** Ops sharing ``coll_id >= 0`` form one rendezvous. Each member starts at its
  own ready time (its launch), the transfer begins when the last member has started (``A``),
  and member ``m`` ends at ``max(start_m, A + dur_m)``. ``dur_ns`` of a member is therefore
  its *transfer tail after the last arrival*, estimated from the measurement as
  ``end_m - max(member starts)``: for the last arriver that is its whole kernel, for the
  others their kernel minus the time they spent waiting for late ranks. (It can be negative
  when rank clocks are skewed; the end is still never before the start.) A late rank in a
  what-if thereby delays all members by the right amount. Edges between members of one
  collective are dropped (the rendezvous subsumes them; ``stats["intra_collective_edges"]``).
* **Blocking host calls.** A ``SYNC`` edge ``gpu op -> cpu op`` whose CPU op follows a
  blocking call on its thread (``*Synchronize``, synchronous ``cudaMemcpy``) becomes a *wait
  edge* on that call: it ends at ``max(start + own, gpu end + lag)`` where ``own`` is the part
  of the call after the GPU work finished. What-ifs that speed up the GPU shorten the wait.
* **Cycles** are reported with the ops on the cycle; dangling edges are refused.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import EdgeKind, LaneKind, OpKind
from retime.collectors.errors import ReplayError
from retime.collectors.trace import Trace

from ._kernels import (
    _edge_lags,
    _lane_links,
    _layout_perm,
    _measured_ready,
)
from .gaps import classify_wait_gaps, host_comm_masks, with_handoff_edges
from .graph_arrays import _csr, _dense_inverse, _lexsort_small
from .graph_data import RES_COMM, RES_COMPUTE, ReplayGraph
from .graph_order import CycleError, _node_of, _order_or_raise, choose_relaxations
from .launch_queue import queue_waits

__all__ = ["build_graph", "graph_from_arrays", "BLOCKING_CALL_PATTERN"]

#: Host calls whose measured duration includes waiting for the GPU.
#: ``run_backward`` (``loss.backward()`` as a Python frame) waits for the autograd engine's
#: device threads (the ingest's SYNC edge from their last op: collectors.kineto.deps)
BLOCKING_CALL_PATTERN = re.compile(r"(Synchronize|^(cuda|hip)Memcpy$|^(cuda|hip)Memcpy2D$"
                                   r"|run_backward of torch\._C\._EngineBase)")

_I64 = np.int64
_I32 = np.int32
#: index arrays are int32; the contention path packs ``2 * op + flag`` into one
_MAX_OPS = 2**30 - 1


# ---------------------------------------------------------------------------- building
def build_graph(trace: Trace, *, ideal: bool = False, strict: bool = False) -> ReplayGraph:
    """Build the replay graph of ``trace`` (vectorized; see the module docstring for the model).

    Parameters
    ----------
    trace : Trace
        Any trace (ingested, synthesized, or a replayed one).
    ideal : bool
        Drop the unexplained release delays (they stay in ``measured_delay_ns``).
    strict : bool
        Refuse a graph with a dependency cycle. By default a cycle through cross-rank links
        (collectives matched in opposite orders, cross-rank edges) is broken by relaxing the
        fewest such links, chosen where the measurement contradicts them most
        (:func:`replay.graph_order.choose_relaxations`): a relaxed collective's members
        replay as separate ops, a relaxed edge is dropped. ``stats["relaxed"]`` says which
        and how many.

    Raises
    ------
    ReplayError
        Dangling edges, a collective with two members on one lane, or a dependency cycle
        (``strict``, or a cycle without cross-rank links; one line naming its ops).
    """
    o = trace.ops
    e = trace.edges
    lanes = trace.lanes
    names = np.asarray(trace.strings, dtype=object)
    blocking_name = np.fromiter((bool(BLOCKING_CALL_PATTERN.search(s)) for s in names),
                                dtype=bool, count=len(names))
    name_id = o["name_id"].to_numpy()
    blocking = blocking_name[name_id] if len(names) else np.zeros(len(o), bool)
    kind = o["kind"].to_numpy()
    blocking &= (kind == OpKind.RUNTIME) | (kind == OpKind.CPU_OP)
    lane = o["lane"].to_numpy()
    # device lanes: GPU streams and op-level streams share their (rank, device); looked up
    # per lane (a table as long as the largest lane id), so no per-op index temporaries
    lane_ids = lanes["lane"].to_numpy().astype(_I64)
    if len(lane_ids) and len(o):
        if lane_ids.min() < 0 or lane.min() < 0:
            raise ReplayError(f"negative lane id (lanes {int(lane_ids.min())}, ops "
                              f"{int(lane.min())}); re-ingest the trace")
        lk = lanes["lane_kind"].to_numpy()
        size = int(max(lane_ids.max(), lane.max())) + 1
        dev_of = np.zeros(size, bool)
        key_of = np.zeros(size, _I64)
        # the first row of a lane id wins (as the former searchsorted on a stable sort)
        first = np.unique(lane_ids, return_index=True)[1]
        dev_of[lane_ids[first]] = lk[first] != LaneKind.CPU_THREAD
        key_of[lane_ids[first]] = lanes["device"].to_numpy().astype(_I64)[first]
        on_device = dev_of[lane]
        dev_key = o["rank"].to_numpy().astype(_I64) * 65536 + key_of[lane]
        del dev_of, key_of, first
    else:
        on_device = np.zeros(len(o), bool)
        dev_key = np.zeros(len(o), _I64)
    coll = o["coll_id"].to_numpy()
    es, ed = e["src"].to_numpy(), e["dst"].to_numpy()
    e_kind, e_lag = e["kind"].to_numpy(), e["lag_ns"].to_numpy()
    keep_e = np.ones(len(es), bool)
    relaxed: dict[str, Any] = {"count": 0, "collectives": [], "edges": []}
    while True:
        try:
            g = graph_from_arrays(
                rank=o["rank"].to_numpy(), lane=lane, kind=kind,
                start_ns=o["start_ns"].to_numpy(), dur_ns=o["dur_ns"].to_numpy(),
                # the trace's own edge arrays (no copies) until a cycle drops some
                coll_id=coll, **_kept_edges(es, ed, e_kind, e_lag, keep_e),
                blocking=blocking, on_device=on_device, device_key=dev_key, ideal=ideal,
                trace=trace)
            break
        except CycleError as exc:
            if strict:
                raise ReplayError(str(exc).split("; replay without")[0] + "; --strict "
                                  "refuses it (without, the cross-rank links on it are "
                                  "relaxed)") from None
            s0 = o["start_ns"].to_numpy()
            pick = choose_relaxations(exc, o["rank"].to_numpy(), s0,
                                      s0 + o["dur_ns"].to_numpy(), coll, es[keep_e], ed[keep_e])
            if pick is None or (not pick[0] and not pick[1].any()):
                raise ReplayError(str(exc).split("; replay without")[0] + "; no cross-rank "
                                  "link is on it to relax: fix or drop the edge") from None
            cids, drop = pick
            if cids:
                coll = np.where(isin(coll, cids), -1, coll)
                relaxed["collectives"] += cids
            if drop.any():
                idx = np.flatnonzero(keep_e)[drop]
                relaxed["edges"] += [[int(es[i]), int(ed[i])] for i in idx]
                keep_e[idx] = False
            relaxed["count"] = len(relaxed["collectives"]) + len(relaxed["edges"])
    if relaxed["count"]:
        g.stats["relaxed"] = relaxed
    return g


def _kept_edges(es, ed, kind, lag, keep) -> dict[str, np.ndarray]:
    if keep.all():
        return {"edge_src": es, "edge_dst": ed, "edge_kind": kind, "edge_lag_ns": lag}
    return {"edge_src": es[keep], "edge_dst": ed[keep], "edge_kind": kind[keep],
            "edge_lag_ns": lag[keep]}


def graph_from_arrays(*, rank, lane, kind, start_ns, dur_ns, coll_id=None, edge_src=None,
                      edge_dst=None, edge_kind=None, edge_lag_ns=None, blocking=None,
                      on_device=None, device_key=None, ideal: bool = False,
                      trace: Trace | None = None, scope=None) -> ReplayGraph:
    """Build a :class:`ReplayGraph` from plain op/edge arrays (what :func:`build_graph` uses).

    All per-op arrays have length N and are aligned with op ids ``0..N-1``; ``blocking``
    marks blocking host calls, ``on_device`` ops on device (GPU/op-stream) lanes and
    ``device_key`` any integer naming the device of an op (dense-coded here).

    ``scope`` (a :class:`replay.window.Scope`, for a window of a larger run): the ops the
    ``stats`` count (the window's own; the others are its halo), each op's rank origin and
    the communication-thread masks of the whole run.
    """
    rank = np.ascontiguousarray(rank, np.int32)
    lane = np.ascontiguousarray(lane, np.int32)
    kind = np.ascontiguousarray(kind, np.int8)
    s = np.ascontiguousarray(start_ns, _I64)
    d = np.ascontiguousarray(dur_ns, _I64)
    n = len(s)
    end = s + d
    coll = np.full(n, -1, _I64) if coll_id is None else np.ascontiguousarray(coll_id, _I64)
    if edge_src is None:
        edge_src = edge_dst = np.zeros(0, _I64)
        edge_kind = np.zeros(0, np.int8)
        edge_lag_ns = np.zeros(0, _I64)
    es = np.ascontiguousarray(edge_src, _I64)
    ed = np.ascontiguousarray(edge_dst, _I64)
    ek = np.ascontiguousarray(edge_kind, np.int8)
    el = np.ascontiguousarray(edge_lag_ns, _I64)
    if len(es) and (min(es.min(), ed.min()) < 0 or max(es.max(), ed.max()) >= n):
        bad = int(np.flatnonzero((es < 0) | (es >= n) | (ed < 0) | (ed >= n))[0])
        raise ReplayError(f"edge {bad} ({int(es[bad])} -> {int(ed[bad])}) refers to an op "
                          f"outside 0..{n - 1} (dangling edge); re-ingest the trace or drop it")
    if len(es) and (es == ed).any():
        bad = int(np.flatnonzero(es == ed)[0])
        raise ReplayError(f"edge {bad} is a self-loop on op {int(es[bad])}; drop it")
    cnt = None if scope is None else np.asarray(scope.count, bool)
    stats: dict[str, Any] = {"ops": n if cnt is None else int(cnt.sum()),
                             "edges_in": len(es) if cnt is None else int(cnt[ed].sum())}

    if n > _MAX_OPS or len(es) > _MAX_OPS:
        raise ReplayError(f"graph of {n} ops and {len(es)} edges is too large: the replay "
                          f"handles up to {_MAX_OPS} of each; split the trace by steps")
    # Memory: the builder keeps only what the graph will hold plus a few per-op temporaries
    # at a time (numba kernels build the CSRs and orders; no E-sized index temporaries).

    # ---- lane order (FIFO by measured start, ties by op id)
    # (a measured overlap on a lane: the op did not wait for its predecessor's end; it keeps
    # the offset from the predecessor's start instead, the same time on the measured trace)
    lane_prev, lane_lag, lane_s2s = _lane_links(_lexsort_small((s, lane)), lane, s, end)
    has_prev = lane_prev >= 0
    stats["lane_overlaps"] = int(lane_s2s.sum() if cnt is None else lane_s2s[cnt].sum())

    # ---- inferred thread hand-offs (replay/gaps.py)
    # (collectives are not handed over: they start when issued and when their peers do)
    es, ed, ek, el = with_handoff_edges(rank, lane, s, end, on_device, lane_prev, es, ed, ek,
                                        el, stats, not_dst=coll >= 0, scope=scope)

    # ---- collectives: dense index, members sorted by (collective, op id)
    in_coll = coll >= 0
    coll_of = np.full(n, -1, _I32)
    if in_coll.any():
        uniq, inv = unique(coll[in_coll], return_inverse=True)
        coll_of[in_coll] = inv
        members = np.flatnonzero(in_coll)[np.argsort(inv, kind="stable")].astype(_I32)
        counts = np.bincount(inv, minlength=len(uniq))
        del uniq, inv
    else:
        members = np.zeros(0, _I32)
        counts = np.zeros(0, _I64)
    coll_ptr = np.zeros(len(counts) + 1, _I32)
    np.cumsum(counts, out=coll_ptr[1:])
    node_of = _node_of(n, coll_of, coll_ptr, members)
    bad = has_prev & (node_of == node_of[np.maximum(lane_prev, 0)]) & in_coll
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ReplayError(
            f"collective coll_id={int(coll[i])} has two members on one lane (ops "
            f"{int(lane_prev[i])} and {i}, rank {int(rank[i])}, lane {int(lane[i])}); a lane "
            "cannot rendezvous with itself: fix the collective matching of the ingest")
    del bad, in_coll, has_prev

    # ---- edges: blocking-call waits, clamping, intra-collective drop
    # lags clamped to the measured gap; a negative one (a kernel starting before its launch
    # call returned) is a fixed offset from the source's start (s2s: shortening the launch
    # call must not pull the kernel earlier); edges inside one collective are dropped (keep)
    lag_store, s2s, keep, n_clamped = _edge_lags(es, ed, el, ek, np.int8(EdgeKind.SYNC), s,
                                                 end, d, node_of)
    stats["edges_clamped"] = int(n_clamped) if cnt is None else \
        int(((el > s[ed] - end[es]) & cnt[ed]).sum())
    worker, host_coll = (host_comm_masks(lane, coll, on_device) if scope is None
                         else (scope.worker, scope.host_coll))
    classify_wait_gaps(es, ed, ek, lag_store, s2s, keep, s, end, lane, stats, worker=worker,
                       host_coll=host_coll, count=cnt)
    del worker, host_coll
    blocking = np.zeros(n, bool) if blocking is None else np.asarray(blocking, bool)
    wait_mask = np.zeros(len(es), bool)
    if len(es):
        y = lane_prev[ed]
        wait_mask = (ek == EdgeKind.SYNC) & (y >= 0)
        wait_mask[wait_mask] &= blocking[y[wait_mask]]
        del y
    w_src = es[wait_mask]
    w_dst = lane_prev[ed[wait_mask]].astype(_I64)
    del wait_mask
    # launches blocked on a full launch queue wait for the op K launches earlier (issue 27)
    q_src, q_dst, q_depth = queue_waits(s, end, es, ed, ek, np.asarray(on_device, bool)
                                        if on_device is not None else np.zeros(n, bool),
                                        np.asarray(device_key) if device_key is not None
                                        else np.zeros(n, _I64))
    if len(q_src):
        w_src = np.concatenate([w_src, q_src])
        w_dst = np.concatenate([w_dst, q_dst])
        stats["queue_waits"] = int(len(q_src) if cnt is None else cnt[q_dst].sum())
        stats["queue_depth"] = sorted(set(q_depth.values()))
    dur = d.copy()
    w_lag = np.zeros(len(w_src), _I64)
    if len(w_src):
        last_gpu_end = np.full(n, np.iinfo(_I64).min, _I64)
        np.maximum.at(last_gpu_end, w_dst, end[w_src])
        ys = unique(w_dst)
        dur[ys] = np.maximum(0, end[ys] - np.maximum(s[ys], last_gpu_end[ys]))
        w_lag = end[w_dst] - end[w_src]
        del last_gpu_end, ys
    if cnt is None:
        stats["wait_edges"] = int(len(w_src))
        stats["intra_collective_edges"] = int(len(es) - keep.sum())
        stats["start_edges"] = int(s2s.sum())
    else:
        stats["wait_edges"] = int(cnt[w_dst].sum())
        stats["intra_collective_edges"] = int((~keep & cnt[ed]).sum())
        stats["start_edges"] = int((s2s & cnt[ed]).sum())
        stats["edges"] = int((keep & cnt[ed]).sum())
    pred_ptr, pred_src, pred_lag, pred_kind, pred_s2s = _csr(
        n, ed, es, lag_store, ek, s2s, keep=keep)
    del keep, lag_store, s2s
    if cnt is None:
        stats["edges"] = int(len(pred_src))
    wkeep = node_of[w_src] != node_of[w_dst]
    nw = len(w_src)
    wait_ptr, wait_src, wait_lag, _, _ = _csr(n, w_dst, w_src, w_lag, np.zeros(nw, np.int8),
                                              np.zeros(nw, bool), keep=wkeep)
    del w_src, w_dst, w_lag, wkeep
    # the edge arrays are in the CSRs now; with inferred hand-offs they are this function's
    # own copies (25 bytes per edge), freed here, before the layout's peak (issue 30)
    del es, ed, ek, el

    # ---- collective transfer tails
    if len(members):
        a_meas = np.maximum.reduceat(s[members], coll_ptr[:-1][counts > 0])
        dur[members] = end[members] - np.repeat(a_meas, counts[counts > 0])
        stats["collectives"] = int(len(counts))
        stats["collective_wait_ns"] = int((d[members] - np.maximum(dur[members], 0)).clip(0).sum())
    else:
        stats["collectives"] = 0
        stats["collective_wait_ns"] = 0

    # ---- origin and measured release delays
    origin = np.zeros(n, _I64)
    if scope is not None:
        origin = np.ascontiguousarray(scope.origin, _I64)
    elif n:
        n_ur, rinv = _dense_inverse(rank)
        rmin = np.full(n_ur, np.iinfo(_I64).max, _I64)
        np.minimum.at(rmin, rinv, s)
        origin = rmin[rinv]
        del rinv
    mdelay = _measured_ready(s, end, origin, lane_prev, lane_lag, lane_s2s, pred_ptr, pred_src,
                             pred_lag, pred_s2s)
    np.subtract(s, mdelay, out=mdelay)  # in place: measured start - ready, clipped at 0
    np.maximum(mdelay, 0, out=mdelay)
    stats["unexplained_delay_count"] = int(np.count_nonzero(mdelay if cnt is None
                                                            else mdelay[cnt]))
    stats["unexplained_delay_ns"] = int(mdelay.sum() if cnt is None else mdelay[cnt].sum())
    del end

    # ---- topological order of super-nodes (cycle check), close to measured time
    key = s.copy()
    if len(members):
        key[members[coll_ptr[:-1][counts > 0]]] = a_meas
    order = _order_or_raise(node_of, lane_prev, pred_ptr, pred_src, wait_ptr, wait_src,
                            trace, s, key=key)
    del key, node_of

    # ---- contention resources
    on_dev = np.zeros(n, bool) if on_device is None else np.asarray(on_device, bool)
    device = np.full(n, -1, np.int32)
    if on_dev.any():
        key = np.asarray(device_key, _I64)[on_dev] if device_key is not None else rank[on_dev]
        device[on_dev] = _dense_inverse(key)[1].astype(np.int32)
        del key
    is_comm = (kind == OpKind.COLLECTIVE) | (kind == OpKind.P2P)
    resource = np.zeros(n, np.int8)
    compute_kinds = (kind == OpKind.KERNEL) | (kind == OpKind.MEMSET) | (kind == OpKind.COMPUTE)
    resource[on_dev & compute_kinds] = RES_COMPUTE
    resource[is_comm] = RES_COMM
    del compute_kinds, on_dev
    link = np.full(n, -1, np.int32)
    if n:
        link[is_comm] = _dense_inverse(rank)[1][is_comm]
    del is_comm

    # ---- lay the kernel arrays out in execution order (see ReplayGraph); each per-op
    # array is replaced by its laid-out copy at once, so one extra copy lives at a time
    perm, pos = _layout_perm(order, coll_of, coll_ptr, members)
    order = pos[order]
    coll_members = pos[members]
    del members

    def lay(x):
        return np.ascontiguousarray(x[perm])

    lp = lay(lane_prev)
    del lane_prev
    has = lp >= 0
    lp[has] = pos[lp[has]]
    del has
    pdst = np.repeat(np.arange(n, dtype=_I32), np.diff(pred_ptr))
    pred_ptr, pred_src, pred_lag, pred_kind, pred_s2s = _csr(
        n, pdst, pred_src, pred_lag, pred_kind, pred_s2s, pos=pos)
    del pdst
    wdst = np.repeat(np.arange(n, dtype=_I32), np.diff(wait_ptr))
    wait_ptr, wait_src, wait_lag, _, _ = _csr(
        n, wdst, wait_src, wait_lag, np.zeros(len(wdst), np.int8), np.zeros(len(wdst), bool),
        pos=pos)
    del wdst
    mdelay = lay(mdelay)
    delay = np.zeros(n, _I64) if ideal else mdelay
    dur = lay(dur)
    origin = lay(origin)
    lane_lag = lay(lane_lag)
    lane_s2s = lay(lane_s2s)
    coll_of = lay(coll_of)
    device = lay(device)
    resource = lay(resource)
    link = lay(link)
    return ReplayGraph(
        dur_ns=dur, delay_ns=delay, measured_delay_layout_ns=mdelay, origin_ns=origin,
        lane_prev=lp, lane_lag_ns=lane_lag, lane_s2s=lane_s2s,
        pred_ptr=pred_ptr, pred_src=pred_src, pred_lag_ns=pred_lag, pred_kind=pred_kind,
        pred_s2s=pred_s2s, wait_ptr=wait_ptr, wait_src=wait_src, wait_lag_ns=wait_lag,
        coll_of=coll_of, coll_ptr=coll_ptr, coll_members=coll_members,
        order=order, perm=perm, pos=pos, rank=rank, lane=lane,
        device=device, resource=resource, link=link, meas_start_ns=s,
        meas_dur_ns=d, ideal=bool(ideal), stats=stats, trace=trace)
