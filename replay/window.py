"""Replay a run window by window: the replay graph of one window of time at a time, never the
whole run's (issue 30: replay memory that does not grow with the whole run).

The run is cut at measured times ``T``: a window holds the ops that *start* in
``[T_k, T_k+1)``. A cut is exact (the windows give the whole graph's replay, op for op) when
every dependency of an op points to an op of its own window or an earlier one, so only cuts
no dependency crosses backwards are taken (:func:`window_cuts`):

* a recorded edge whose source starts after its destination (skewed clocks across ranks);
* a wait edge (:mod:`replay.graph`: a GPU op that ends a blocking host call) whose GPU op
  starts after the call;
* a collective, whose members rendezvous: all of them lie in one window.

Lane links and inferred hand-offs always point forward in measured start. Each window's graph
is built by :func:`replay.graph.graph_from_arrays` from the window's ops and a halo:

* **before the window** (pinned at their replayed times, computed by an earlier window; no
  predecessors of their own): each lane's previous op, the sources of the window's edges and,
  on host lanes, every op that may hand work over to a window op (ending at most
  :data:`replay.gaps.HANDOFF_WINDOW_NS` before the cut) with the ops after it on its lane
  (whether its thread went idle after it);
* **after the window** (built and replayed, results dropped): each lane's next op, so that a
  blocking call's waits and a thread's idleness are those of the whole run.

The graph's statistics count the window's own ops only (:class:`Scope`), so summed over the
windows they are the whole graph's. A window whose graph has a dependency cycle (relaxing
one is a choice over the whole run) makes the replay fall back to the whole graph, as does a
run with no exact cut (one window: the whole run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from retime.collectors.enums import EdgeKind, LaneKind, OpKind
from retime.collectors.errors import ReplayError
from retime.collectors.trace import Trace

from ._kernels import _fast_replay
from .gaps import HANDOFF_WINDOW_NS
from .graph import BLOCKING_CALL_PATTERN, graph_from_arrays
from .graph_arrays import _lexsort_small

__all__ = ["Scope", "WINDOW_OPS", "window_cuts", "window_of", "replay_windows", "replay_loop",
           "windowed_replay", "assemble_run", "blocking_names"]

#: ops per window (about 0.2 GB of graph, build and simulation temporaries each: 0.22 GB of
#: peak RSS over the run's arrays at 32 ranks of the scale bench, against 0.35 GB at 1 M)
WINDOW_OPS = 500_000

_I64 = np.int64
_I32 = np.int32
_MAX = np.iinfo(_I64).max
#: ops per chunk of the passes over the whole run (their temporaries are a chunk's)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Scope:
    """What a window's graph build takes from the whole run (per op of the window's graph,
    op-id order): ``count``, the window's own ops (the others are its halo: the graph's
    ``stats`` count only these); ``origin``, each op's rank's first measured start;
    ``worker`` and ``host_coll``, :func:`replay.gaps.host_comm_masks` of the whole run."""

    count: np.ndarray
    origin: np.ndarray
    worker: np.ndarray
    host_coll: np.ndarray


def _merged(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the half-open intervals ``(a, b]`` (those with ``b > a``) as disjoint
    sorted ``(lo, hi]``; touching intervals merge (no cut lies between them)."""
    keep = b > a
    a, b = a[keep], b[keep]
    if len(a) == 0:
        return a, b
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    hi = np.maximum.accumulate(b)
    new = np.ones(len(a), bool)
    new[1:] = a[1:] > hi[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(a)) - 1
    return a[first], hi[last]


def window_cuts(start_ns: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                window_ops: int = WINDOW_OPS) -> np.ndarray:
    """Cut times (int64, increasing) splitting ops by ``start_ns`` into windows of about
    ``window_ops`` ops, none inside a forbidden interval ``(lo, hi]``. A cut ``T`` puts the
    ops starting before ``T`` in earlier windows."""
    n = len(start_ns)
    k = min(-(-n // max(int(window_ops), 1)), np.iinfo(np.int16).max)
    if k <= 1:
        return np.zeros(0, _I64)
    step = max(1, n // 200_000)  # quantiles of a sample are close enough for a window's size
    sample = np.sort(np.asarray(start_ns[::step], _I64))
    targets = sample[(np.arange(1, k) * len(sample)) // k]
    a, b = _merged(np.asarray(lo, _I64), np.asarray(hi, _I64))
    if len(a):  # a target inside a forbidden interval moves to just after it
        i = np.searchsorted(a, targets, side="left") - 1
        inside = (i >= 0) & (targets <= b[np.maximum(i, 0)])
        targets = np.where(inside, b[np.maximum(i, 0)] + 1, targets)
    cuts = np.unique(targets)
    # (a cut after the last start or at the first would leave a window empty)
    return cuts[(cuts > sample[0]) & (cuts <= np.max(start_ns))]


@dataclass(frozen=True)
class _Run:
    """Per-op arrays of the whole run that every window reads (op-id order)."""

    s: np.ndarray          # measured start (the trace's own arrays, as d)
    d: np.ndarray          # measured duration
    rank: np.ndarray
    lane: np.ndarray
    kind: np.ndarray
    coll: np.ndarray
    blocking: np.ndarray   # a blocking host call
    lane_prev: np.ndarray  # int32, -1 none
    lane_next: np.ndarray  # int32, -1 none
    rank0: int               # the smallest rank number
    rank_origin: np.ndarray  # per rank number - rank0: its first measured start
    worker_lane: np.ndarray  # per lane id: runs nothing but collectives
    dev_key_lane: np.ndarray  # per lane id: its device number
    host_lane: np.ndarray  # per lane id: a host (CPU thread) lane (per op: host_lane[lane])


def _run(trace: Trace) -> _Run:
    o = trace.ops
    s = o["start_ns"].to_numpy()
    lane = o["lane"].to_numpy()
    kind = o["kind"].to_numpy()
    n = len(s)
    bn = blocking_names(trace.strings)
    blocking = (bn[o["name_id"].to_numpy()] if len(bn) else np.zeros(n, bool)) \
        & ((kind == OpKind.RUNTIME) | (kind == OpKind.CPU_OP))
    order = _lexsort_small((s, lane))  # lane order: measured start, ties by op id
    lane_prev = np.full(n, -1, _I32)
    lane_next = np.full(n, -1, _I32)
    if n > 1:
        same = lane[order[1:]] == lane[order[:-1]]
        lane_prev[order[1:][same]] = order[:-1][same]
        lane_next[order[:-1][same]] = order[1:][same]
    del order
    return assemble_run(trace.lanes, s=s, d=o["dur_ns"].to_numpy(), rank=o["rank"].to_numpy(),
                        lane=lane, kind=kind, coll=o["coll_id"].to_numpy(), blocking=blocking,
                        lane_prev=lane_prev, lane_next=lane_next)


def blocking_names(strings: list[str]) -> np.ndarray:
    """Per string id: whether the name is a blocking host call's."""
    names = np.asarray(strings, dtype=object)
    return np.fromiter((bool(BLOCKING_CALL_PATTERN.search(x)) for x in names), bool,
                       len(names))


def assemble_run(lanes, *, s, d, rank, lane, kind, coll, blocking, lane_prev,
                 lane_next) -> _Run:
    """A :class:`_Run` from the per-op arrays (op-id order) and the lanes table."""
    lane_ids = lanes["lane"].to_numpy().astype(_I64)
    size = int(max(lane_ids.max(initial=0), lane.max(initial=0))) + 1
    dev_of = np.zeros(size, bool)
    key_of = np.zeros(size, _I64)
    first = np.unique(lane_ids, return_index=True)[1]  # the first row of a lane id wins
    dev_of[lane_ids[first]] = lanes["lane_kind"].to_numpy()[first] != LaneKind.CPU_THREAD
    key_of[lane_ids[first]] = lanes["device"].to_numpy().astype(_I64)[first]
    busy = np.zeros(size, _I64)  # per lane: ops other than collectives
    rank0 = int(rank.min())
    rmin = np.full(int(rank.max()) - rank0 + 1, _MAX, _I64)
    for a in range(0, len(s), _CHUNK):  # (temporaries of a chunk, not of the run)
        b = a + _CHUNK
        busy += np.bincount(lane[a:b][coll[a:b] < 0], minlength=size)
        np.minimum.at(rmin, rank[a:b] - rank0, s[a:b])
    worker_lane = busy == 0
    return _Run(s=s, d=d, rank=rank, lane=lane, kind=kind, coll=coll, blocking=blocking,
                lane_prev=lane_prev, lane_next=lane_next, rank0=rank0, rank_origin=rmin,
                worker_lane=worker_lane, dev_key_lane=key_of, host_lane=~dev_of)


def _edge_forbidden(r: _Run, es: np.ndarray, ed: np.ndarray,
                    ek: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``(lo, hi]`` (``hi > lo`` only) of measured time no cut may fall in, from
    edges (``es``, ``ed``: op ids; ``ek``: kinds; any subset of the run's edges): a
    recorded edge pointing back in start, a blocking call and the GPU ops that end it."""
    s = r.s
    lo, hi = [s[ed]], [s[es]]
    sync = ek == EdgeKind.SYNC
    y = r.lane_prev[ed[sync]].astype(_I64)
    w = y >= 0
    w[w] &= r.blocking[y[w]]
    lo.append(s[y[w]])
    hi.append(s[es[sync][w]])
    lo, hi = np.concatenate(lo), np.concatenate(hi)
    keep = hi > lo
    return lo[keep], hi[keep]


def _coll_forbidden(r: _Run) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``(lo, hi]`` spanning each collective's members' starts."""
    s = r.s
    m = np.flatnonzero(r.coll >= 0)
    if not len(m):
        return np.zeros(0, _I64), np.zeros(0, _I64)
    _, inv = np.unique(r.coll[m], return_inverse=True)
    cl = np.full(inv.max() + 1, _MAX, _I64)
    ch = np.full(inv.max() + 1, np.iinfo(_I64).min, _I64)
    np.minimum.at(cl, inv, s[m])
    np.maximum.at(ch, inv, s[m])
    return cl, ch


class _MemEdges:
    """The run's edges grouped by their destination's window (in memory): ``bucket(k)``
    gives ``(src, dst, kind, lag_ns, index)`` of the edges into window ``k``, in edge
    order."""

    def __init__(self, es, ed, ek, el, win: np.ndarray, windows: int) -> None:
        w = win[ed]
        self.order = np.argsort(w, kind="stable")
        self.bounds = np.searchsorted(w[self.order], np.arange(windows + 1))
        self.arrays = (es, ed, ek, el)

    def bucket(self, k: int) -> tuple[np.ndarray, ...]:
        ix = self.order[self.bounds[k]:self.bounds[k + 1]]
        return (*(x[ix] for x in self.arrays), ix)


class _MemResults:
    """Per-op replayed start, end and critical predecessor (op-id order, in memory)."""

    def __init__(self, n: int) -> None:
        self.s = np.full(n, -1, _I64)
        self.e = np.full(n, -1, _I64)
        self.c = np.full(n, -1, _I64)

    def put(self, k: int, ids: np.ndarray, s: np.ndarray, e: np.ndarray,
            c: np.ndarray) -> None:
        self.s[ids] = s
        self.e[ids] = e
        self.c[ids] = c

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.s[ids], self.e[ids]


def replay_windows(trace: Trace, *, ideal: bool = False,
                   window_ops: int = WINDOW_OPS) -> dict[str, Any] | None:
    """The fast-path identity replay of ``trace`` computed one window at a time (see the
    module docstring); ``None`` where it cannot be exact (a window with a dependency
    cycle) or the whole build would refuse the trace (with its own message): replay the
    whole graph instead.

    Returns ``start_ns``, ``end_ns``, ``crit_pred`` (op-id order, as
    :class:`replay.engine.ReplayResult`), ``stats`` (the whole graph's ``stats``), ``gaps``
    (:func:`replay.gaps.gap_shares` of the whole graph), ``windows`` and ``graph_bytes``
    (the largest window's graph).
    """
    o = trace.ops
    n = len(o)
    if n == 0 or o["lane"].to_numpy().min() < 0:
        return None  # (the whole build refuses negative lane ids with its own message)
    e = trace.edges
    if len(e) and (min(e["src"].min(), e["dst"].min()) < 0
                   or max(e["src"].max(), e["dst"].max()) >= n):
        return None  # dangling edges: likewise
    r = _run(trace)
    es = np.asarray(e["src"].to_numpy(), _I64)  # (the trace's own arrays: no copies)
    ed = np.asarray(e["dst"].to_numpy(), _I64)
    ek = e["kind"].to_numpy()
    lo, hi = _edge_forbidden(r, es, ed, ek)
    cl, ch = _coll_forbidden(r)
    cuts = window_cuts(r.s, np.r_[lo, cl], np.r_[hi, ch], window_ops=window_ops)
    del lo, hi, cl, ch
    win = window_of(cuts, r.s)
    res = _MemResults(n)
    out = replay_loop(r, cuts, win, _MemEdges(es, ed, ek, e["lag_ns"].to_numpy(), win,
                                              len(cuts) + 1), res, ideal)
    if out is None:
        return None
    return {"start_ns": res.s, "end_ns": res.e, "crit_pred": res.c, "stats": out["stats"],
            "gaps": out["gaps"], "windows": out["windows"], "graph_bytes": out["graph_bytes"]}


def window_of(cuts: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Each op's window (int16: up to 32,767 windows, 3 * 10^10 ops at WINDOW_OPS)."""
    return np.searchsorted(cuts, s, side="right").astype(np.int16)


def replay_loop(r: _Run, cuts: np.ndarray, win: np.ndarray, edges, results,
                ideal: bool, after_window=None) -> dict[str, Any] | None:
    """Replay the windows in turn: ``edges.bucket(k)`` gives the edges into window ``k``,
    ``results`` keeps each window's results (``put``) and gives those of earlier ops
    (``get``). Returns ``stats``, ``gaps``, ``windows``, ``graph_bytes`` and ``identity``
    (every op replayed at its measured start and end), or ``None`` (a window with a
    dependency cycle). ``after_window()`` is called once each window's temporaries are
    freed."""
    stats: dict[str, int] = {}
    ranks = np.flatnonzero(r.rank_origin != _MAX)  # (offsets from rank0)
    dl = np.zeros(len(ranks), _I64)
    wk = np.zeros(len(ranks), _I64)
    biggest = used = 0
    same = True
    handoff = _handoff_candidates(r, cuts, win)
    scratch = np.zeros(len(r.s), bool)  # the one mask over the run, cleared after each window
    for k in range(len(cuts) + 1):
        # (the window's ops by their ids: no mask over the whole run per window)
        core_ids = np.flatnonzero(win == k)
        if not len(core_ids):
            continue
        used += 1
        g, ids, pin = _window_graph(r, core_ids, win, k,
                                    None if k == 0 else int(cuts[k - 1]), ideal, edges, cuts,
                                    handoff, scratch)
        del core_ids
        if g is None:
            return None
        biggest = max(biggest, g.nbytes)
        for key, v in g.stats.items():
            stats[key] = stats.get(key, 0) + int(v)
        gid = ids[g.perm]  # op id per layout position
        mine = win[gid] == k
        # the layout positions of the window's own ops in op-id order (``ids`` ascends:
        # g.perm's inverse lists them so), as ``results.put`` keeps them: no sort there
        inv = np.empty(g.n_ops, _I64)
        inv[g.perm] = np.arange(g.n_ops)
        q = inv[mine[inv]]
        del inv
        rk = np.searchsorted(ranks, r.rank[gid[mine]] - r.rank0)
        # (.view: the graph's arrays come from numba with an int64 descriptor of its own,
        # which takes ufunc.at off its fast path: ~35 -> ~2 ns per op)
        np.add.at(dl, rk, g.measured_delay_layout_ns[mine].view(_I64))
        pdst = np.repeat(np.arange(g.n_ops, dtype=_I32), np.diff(g.pred_ptr))
        ho = (g.pred_kind == EdgeKind.HOST_ORDER) & (g.pred_lag_ns > 0) & ~g.pred_s2s \
            & mine[pdst]
        np.add.at(wk, np.searchsorted(ranks, r.rank[gid[pdst[ho]]] - r.rank0),
                  g.pred_lag_ns[ho].view(_I64))
        del pdst, ho
        ps, pe = results.get(gid[pin])
        st, en, cr = _simulate_pinned(g, pin, ps, pe)
        del g
        own = gid[q]
        st, en, c = st[q], en[q], cr[q]
        c = np.where(c >= 0, gid[np.maximum(c, 0)], -1)
        same = same and np.array_equal(st, r.s[own]) and np.array_equal(en - st, r.d[own])
        results.put(k, own, st, en, c)
        del gid, mine, st, en, cr, c, own, q
        if after_window is not None:
            after_window()
    hi = np.full(len(r.rank_origin), np.iinfo(_I64).min, _I64)
    np.maximum.at(hi, r.rank - r.rank0, r.s + r.d)
    return {"stats": stats,
            "gaps": _gaps(ranks + r.rank0, r.rank_origin[ranks], hi[ranks], dl, wk, stats),
            "windows": used, "graph_bytes": int(biggest), "identity": bool(same)}


def _handoff_candidates(r: _Run, cuts: np.ndarray, win: np.ndarray):
    """The host ops that may hand work over to an op of a later window (ending at most
    :data:`HANDOFF_WINDOW_NS` before its cut), ascending, and per op the last window whose
    cut it reaches: one pass over the run, not one per window (a chunk at a time)."""
    ids, last = [], []
    for a in range(0, len(r.s), _CHUNK):
        b = a + _CHUNK
        h = np.flatnonzero(r.host_lane[r.lane[a:b]]) + a
        # cut[j - 1] <= end + HANDOFF_WINDOW_NS for every window j up to this one
        kk = np.searchsorted(cuts, r.s[h] + r.d[h] + HANDOFF_WINDOW_NS, side="right")
        m = kk > win[h]
        ids.append(h[m])
        last.append(kk[m])
        del h, kk, m
    return np.concatenate(ids), np.concatenate(last)


def _window_graph(r: _Run, core_ids: np.ndarray, win: np.ndarray, k: int, t0: int | None,
                  ideal: bool, edges, cuts: np.ndarray, handoff, sub: np.ndarray):
    """Window ``k``'s graph (ops starting in it, ``core_ids``, plus its halo), the op ids of
    its ops (sorted) and, per layout position, whether the op is pinned (before the window);
    ``handoff``: :func:`_handoff_candidates`'s; ``sub``: a mask over the run, all False,
    used and cleared again (the window's only one: its ops before the window are those
    with ``win < k``, its look-ahead ops those with ``win > k``)."""
    n = len(r.s)
    past: list[np.ndarray] = []
    nxt = r.lane_next[core_ids]
    nxt = nxt[nxt >= 0]
    look_ids = nxt[win[nxt] > k]
    del nxt
    if t0 is not None:
        # host ops that may hand work over to a window op, and what follows them on
        # their lanes (whether their thread went idle after them)
        # (a chunk of the run at a time: the masks and indices are a chunk's)
        # (from the run's handoff candidates, found once: an earlier window's host op that
        # ends at most HANDOFF_WINDOW_NS before t0 is one whose last window is k or later)
        h_ids, h_last = handoff
        near = h_ids[(win[h_ids] < k) & (h_last >= k)]
        if len(near):
            lane_lo = np.full(len(r.worker_lane), _MAX, _I64)
            np.minimum.at(lane_lo, r.lane[near], r.s[near])
            # ops starting at lo or later lie in lo's window or a later one: the scan reads
            # the windows' numbers and only their ops' starts
            j0 = int(np.searchsorted(cuts, lane_lo.min(), side="right"))
            for a in range(0, n, _CHUNK):
                b = a + _CHUNK
                w = win[a:b]
                cand = np.flatnonzero((w >= j0) & (w < k)) + a
                past.append(cand[r.s[cand] >= lane_lo[r.lane[cand]]])
            del cand, w
        del near
        lp = r.lane_prev[core_ids]
        lp = lp[lp >= 0]
        past.append(lp[win[lp] < k].astype(_I64))
    # the edges into the window's ops and its look-ahead ops, in edge order (an edge into a
    # later window's bucket ends at a look-ahead op or at none of the window's graph)
    parts = [edges.bucket(k)]
    sub[look_ids] = True
    for j in sorted(set(win[look_ids].tolist())):
        b = edges.bucket(j)
        m = sub[b[1]]
        parts.append(tuple(x[m] for x in b))
    ees, eed, eek, eel, eix = parts[0] if len(parts) == 1 else (
        np.concatenate(x) for x in zip(*parts, strict=True))
    del parts
    if len(eix) > 1 and (eix[1:] < eix[:-1]).any():
        o = np.argsort(eix, kind="stable")
        ees, eed, eek, eel = ees[o], eed[o], eek[o], eel[o]
    past.append(ees[win[ees] < k])
    sub[core_ids] = True
    for x in past:
        sub[x] = True
    del past, look_ids
    ids = np.flatnonzero(sub)
    ke = sub[ees]
    sub[ids] = False
    es = np.searchsorted(ids, ees[ke])
    ed = np.searchsorted(ids, eed[ke])
    wi = win[ids]
    mine = wi == k
    coll = np.where(mine, r.coll[ids], -1)  # collectives lie whole in one window
    lane = r.lane[ids]
    host = r.host_lane[lane]
    rank = r.rank[ids]
    scope = Scope(count=mine, origin=r.rank_origin[rank - r.rank0],
                  worker=r.worker_lane[lane] & host, host_coll=(r.coll[ids] >= 0) & host)
    try:
        g = graph_from_arrays(
            rank=rank, lane=lane, kind=r.kind[ids], start_ns=r.s[ids],
            dur_ns=r.d[ids], coll_id=coll, edge_src=es, edge_dst=ed,
            edge_kind=eek[ke], edge_lag_ns=eel[ke], blocking=r.blocking[ids],
            on_device=~host, device_key=rank.astype(_I64) * 65536
            + r.dev_key_lane[lane], ideal=ideal, scope=scope)
    except ReplayError:  # a cycle, or a graph the whole build refuses with its own message
        return None, None, None
    return g, ids, (wi < k)[g.perm]


def _simulate_pinned(g, pin: np.ndarray, pin_s: np.ndarray,
                     pin_e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replay a window's graph with its pinned ops (per layout position; ``pin_s``,
    ``pin_e``: their replayed start and end) held at their replayed times: no
    predecessors, ready at their start, their replayed duration."""
    m = g.n_ops
    pdst = np.repeat(np.arange(m, dtype=_I32), np.diff(g.pred_ptr))
    kp = ~pin[pdst]
    pptr = np.zeros(m + 1, _I32)
    np.cumsum(np.bincount(pdst[kp], minlength=m), out=pptr[1:])
    wdst = np.repeat(np.arange(m, dtype=_I32), np.diff(g.wait_ptr))
    kw = ~pin[wdst]
    wptr = np.zeros(m + 1, _I32)
    np.cumsum(np.bincount(wdst[kw], minlength=m), out=wptr[1:])
    del pdst, wdst
    lp = np.where(pin, -1, g.lane_prev).astype(_I32)
    origin = g.origin_ns.copy()
    origin[pin] = pin_s
    delay = np.where(pin, 0, g.delay_ns).astype(_I64)
    dur = g.dur_ns.copy()
    dur[pin] = pin_e - pin_s
    a = np.ascontiguousarray
    st, en, cr = (np.empty(m, _I64) for _ in range(3))
    _fast_replay(a(g.order, _I32), a(g.coll_of, _I32), a(g.coll_ptr, _I32),
                 a(g.coll_members, _I32), a(dur, _I64), delay, a(origin, _I64), lp,
                 a(g.lane_lag_ns, _I64), a(g.lane_s2s, bool), pptr, a(g.pred_src[kp], _I32),
                 a(g.pred_lag_ns[kp], _I64), a(g.pred_s2s[kp], bool), wptr,
                 a(g.wait_src[kw], _I32), a(g.wait_lag_ns[kw], _I64), st, en, cr)
    return st, en, cr


def _gaps(ranks, lo, hi, dl, wk, stats) -> dict[str, Any]:
    """:func:`replay.gaps.gap_shares`'s object from per-rank sums."""
    out: dict[str, Any] = {"per_rank": []}
    tot = {"span_ns": 0, "host_work_ns": 0, "unexplained_ns": 0}
    for i, rk in enumerate(ranks.tolist()):
        span = int(hi[i] - lo[i])
        row = {"rank": int(rk), "span_ns": span, "host_work_ns": int(wk[i]),
               "unexplained_ns": int(dl[i])}
        row["unexplained_share"] = row["unexplained_ns"] / span if span else 0.0
        out["per_rank"].append(row)
        for key in tot:
            tot[key] += row[key]
    tot["unexplained_share"] = tot["unexplained_ns"] / tot["span_ns"] if tot["span_ns"] else 0.0
    tot["wait_gap_ns"] = int(stats.get("wait_gap_ns", 0))
    tot["handoff_edges"] = int(stats.get("handoff_edges", 0))
    out["total"] = tot
    return out


def windowed_replay(trace: Trace, *, ideal: bool = False, window_ops: int = WINDOW_OPS):
    """:func:`replay_windows` as a :class:`replay.engine.ReplayResult` (no ``graph``: the
    whole graph never exists), the same as ``simulate(build_graph(trace, ideal=ideal))``
    but for ``graph``, ``meta["windows"]`` and ``meta["graph_bytes"]`` (the largest window's
    graph); ``None`` where the whole graph is needed (see :func:`replay_windows`)."""
    from .engine import ReplayResult

    w = replay_windows(trace, ideal=ideal, window_ops=window_ops)
    if w is None:
        return None
    meta: dict[str, Any] = {"mode": "fast", "ideal": bool(ideal), "scenario": [],
                            "durations_modified": False}
    meta.update(w["stats"])
    meta.update(gaps=w["gaps"], windows=w["windows"], graph_bytes=w["graph_bytes"])
    return ReplayResult(trace, None, w["start_ns"], w["end_ns"], w["crit_pred"], meta=meta)
