"""Slow, obvious reference replay engine (pure Python, heapq) and a random trace generator.

The numba kernels in ``replay/_kernels.py`` must match these results exactly
(``tests/test_replay_engine.py``); ``bench/replay.py`` times them side by side.
Everything here works on plain Python ints/floats and dicts, one op at a time.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from retime.collectors.enums import EdgeKind, LaneKind, OpKind
from retime.collectors.trace import Trace


# ---------------------------------------------------------------------------- helpers
def _layout_durations(g, durations_ns):
    """Durations per layout position (``durations_ns`` is given in op-id order)."""
    if durations_ns is None:
        return g.dur_ns.tolist()
    d = np.asarray(durations_ns).tolist()
    return [d[i] for i in g.perm.tolist()]


def _preds(g):
    """dst -> list of (src, lag) in CSR order; waits likewise; lane prev per op."""
    n = g.n_ops
    ptr, src, lag = g.pred_ptr.tolist(), g.pred_src.tolist(), g.pred_lag_ns.tolist()
    s2s = g.pred_s2s.tolist()
    wptr, wsrc, wlag = g.wait_ptr.tolist(), g.wait_src.tolist(), g.wait_lag_ns.tolist()
    preds = [[(src[k], lag[k], s2s[k]) for k in range(ptr[i], ptr[i + 1])] for i in range(n)]
    waits = [[(wsrc[k], wlag[k]) for k in range(wptr[i], wptr[i + 1])] for i in range(n)]
    colls = [g.coll_members[g.coll_ptr[c]:g.coll_ptr[c + 1]].tolist()
             for c in range(g.n_collectives)]
    return preds, waits, colls


def _ready(i, start, end, lane_prev, lane_lag, lane_s2s, preds, origin):
    best, cp = None, -1
    p = lane_prev[i]
    if p >= 0:
        best, cp = (start[p] if lane_s2s[i] else end[p]) + lane_lag[i], p
    for s, lag, from_start in preds[i]:
        v = (start[s] if from_start else end[s]) + lag
        if best is None or v > best:
            best, cp = v, s
    if cp < 0:
        best = origin[i]
    return best, cp


# ---------------------------------------------------------------------------- fast path
def naive_fast(g, durations_ns=None):
    """Reference of the fast path: Kahn's algorithm (heapq by op id) over super-nodes."""
    n = g.n_ops
    dur = _layout_durations(g, durations_ns)
    delay, origin = g.delay_ns.tolist(), g.origin_ns.tolist()
    lane_prev, lane_lag = g.lane_prev.tolist(), g.lane_lag_ns.tolist()
    lane_s2s = g.lane_s2s.tolist()
    coll_of = g.coll_of.tolist()
    preds, waits, colls = _preds(g)
    node = [colls[coll_of[i]][0] if coll_of[i] >= 0 else i for i in range(n)]
    members = {u: (colls[coll_of[u]] if coll_of[u] >= 0 else [u]) for u in set(node)}
    deps = {u: set() for u in members}
    succ = {u: set() for u in members}
    for i in range(n):
        srcs = [s for s, _, _ in preds[i]] + [s for s, _ in waits[i]]
        if lane_prev[i] >= 0:
            srcs.append(lane_prev[i])
        for s in srcs:
            if node[s] != node[i]:
                deps[node[i]].add(node[s])
                succ[node[s]].add(node[i])
    heap = [u for u in members if not deps[u]]
    heapq.heapify(heap)
    start, end, crit = [0] * n, [0] * n, [-1] * n
    done = 0
    while heap:
        u = heapq.heappop(heap)
        done += 1
        ms = members[u]
        a, last = None, -1
        for m in ms:
            r, cp = _ready(m, start, end, lane_prev, lane_lag, lane_s2s, preds, origin)
            start[m], crit[m] = r + delay[m], cp
            if a is None or start[m] > a:
                a, last = start[m], m
        for m in ms:
            if coll_of[m] >= 0:
                e = start[m]
                if a + dur[m] > e:
                    e = a + dur[m]
                    if m != last:
                        crit[m] = last
            else:
                e = start[m] + dur[m]
            for s, lag in waits[m]:
                if end[s] + lag > e:
                    e, crit[m] = end[s] + lag, s
            end[m] = e
        for v in succ[u]:
            deps[v].discard(u)
            if not deps[v]:
                heapq.heappush(heap, v)
    if done < len(members):
        raise RuntimeError("cycle")
    return _to_ops(g, start, end, crit)


def _to_ops(g, start, end, crit):
    """Graph layout positions -> op ids (the order results are reported in)."""
    perm = g.perm.tolist()
    n = len(perm)
    s, e, c = [0] * n, [0] * n, [-1] * n
    for k in range(n):
        s[perm[k]], e[perm[k]] = start[k], end[k]
        c[perm[k]] = perm[crit[k]] if crit[k] >= 0 else -1
    return np.array(s, np.int64), np.array(e, np.int64), np.array(c, np.int64)


# ---------------------------------------------------------------------------- contention path
def naive_fluid(g, durations_ns=None, interference=0.0, share_compute=False, share_links=True,
                comm_interference=None, comm_cap=False, compute_interference=None):
    """Reference of the contention path: heapq event simulation with lazy deletion.

    Same model as ``replay._fluid._fluid_replay`` (see its docstring), but it re-evaluates
    every running job at every change (the kernel only those a change can affect). Rates
    are updated in job-id order and released ops are started at the end of each event, in
    order, as the kernel does, so that floating-point results agree to the last bit.
    ``comm_interference``: the communication side's slowdown (a number, or one per op in
    op-id order; a collective takes its first member's), None for ``interference``;
    ``compute_interference`` likewise for the compute side (one per op: per kernel).
    """
    n = g.n_ops
    dur = _layout_durations(g, durations_ns)
    delay = g.delay_ns.tolist()
    base = int(g.origin_ns.min()) if n else 0
    origin = [float(x - base) for x in g.origin_ns.tolist()]
    lane_prev, lane_lag = g.lane_prev.tolist(), g.lane_lag_ns.tolist()
    lane_s2s = g.lane_s2s.tolist()
    coll_of = g.coll_of.tolist()
    device, resource, link = g.device.tolist(), g.resource.tolist(), g.link.tolist()
    preds, waits, colls = _preds(g)
    succs = [[] for _ in range(n)]
    wsuccs = [[] for _ in range(n)]
    lane_next = [-1] * n
    for i in range(n):
        if lane_prev[i] >= 0:
            lane_next[lane_prev[i]] = i
        for s, _, from_start in preds[i]:
            succs[s].append((i, from_start))
        for s, _ in waits[i]:
            wsuccs[s].append(i)
    for i in range(n):
        succs[i].sort()  # kernel fills successors in dst order
        wsuccs[i].sort()
    pending = [(1 if lane_prev[i] >= 0 else 0) + len(preds[i]) for i in range(n)]
    wpending = [len(waits[i]) for i in range(n)]
    start, end = [0.0] * n, [0.0] * n
    own = [None] * n
    crit = [-1] * n
    csorted = [sorted(ms, key=lambda m: (max(dur[m], 0), m)) for ms in colls]
    arrived = [0] * len(colls)
    last_of = [-1] * len(colls)
    jobs = {}  # id -> dict(done, rate, last, thr, k, ver)
    active: list = []
    n_compute: dict = {}
    n_comm: dict = {}
    ci = interference if comm_interference is None else comm_interference
    ci = np.broadcast_to(np.asarray(ci, np.float64), (n,))
    ci = ci[np.asarray(g.perm)] if np.ndim(comm_interference) == 1 else ci  # layout order
    inv_m = (1.0 / (1.0 + ci)).tolist()
    cc = interference if compute_interference is None else compute_interference
    cc = np.broadcast_to(np.asarray(cc, np.float64), (n,))
    cc = cc[np.asarray(g.perm)] if np.ndim(compute_interference) == 1 else cc
    inv_c = (1.0 / (1.0 + cc)).tolist()
    on = max(interference, float(ci.max()) if n else 0.0, float(cc.max()) if n else 0.0)
    sharing = share_compute or share_links or on > 0.0
    heap: list = []
    seq = 0
    clamped = 0
    started = 0

    def members(j):
        return [j] if j < n else colls[j - n]

    def is_flow(j):
        return j >= n or resource[j] == 2

    def push_job(j, t):
        nonlocal seq
        jobs[j]["t"] = t
        jobs[j]["ver"] += 1
        heapq.heappush(heap, (t, 0, seq, j, jobs[j]["ver"]))
        seq += 1

    def rerate(now):
        share = {}
        if share_links:
            cnt: dict = {}
            cap: dict = {}
            flows = sorted(j for j in active if is_flow(j))
            for j in flows:
                for m in members(j):
                    if link[m] >= 0:
                        cnt[link[m]] = cnt.get(link[m], 0) + 1
                        cap[link[m]] = 1.0
            frozen = set()

            def fshare(j):
                best = math.inf
                for m in members(j):
                    lk = link[m]
                    if lk >= 0 and cnt[lk] > 0:
                        best = min(best, cap[lk] / cnt[lk])
                return best

            while len(frozen) < len(flows):
                best = min(fshare(j) for j in flows if j not in frozen)
                progressed = False
                for j in flows:
                    if j not in frozen and fshare(j) <= best:
                        frozen.add(j)
                        share[j] = min(best, 1.0)
                        progressed = True
                        for m in members(j):
                            if link[m] >= 0:
                                cnt[link[m]] -= 1
                                cap[link[m]] -= share[j]
                if not progressed:
                    break
        for j in sorted(active):  # the kernel updates in job-id order
            if not is_flow(j):
                d = device[j]
                r = 1.0
                if share_compute and n_compute[d] > 1:
                    r = 1.0 / n_compute[d]
                if on > 0.0 and n_comm.get(d, 0) > 0:
                    r = r * inv_c[j]
            else:
                r = share.get(j, 1.0) if share_links else 1.0
                if on > 0.0 and any(device[m] >= 0 and n_compute.get(device[m], 0) > 0
                                    for m in members(j)):
                    r = min(r, inv_m[members(j)[0]]) if comm_cap else r * inv_m[members(j)[0]]
            jb = jobs[j]
            if r != jb["rate"]:
                if jb["rate"] > 0.0:
                    jb["done"] += (now - jb["last"]) * jb["rate"]
                jb["last"] = now
                jb["rate"] = r
                push_job(j, now + max(jb["thr"] - jb["done"], 0.0) / r)

    rel: list = []  # released in this event; started in FIFO order at its end (as the kernel)

    def release(q, now):
        rel.append(q)

    def flush(now):
        nonlocal seq, clamped
        for q in rel:
            start_op(q, now)
        rel.clear()

    def start_op(q, now):
        nonlocal seq, clamped
        r, cp = _ready(q, start, end, lane_prev, lane_lag, lane_s2s, preds, origin)
        s = r + delay[q]
        if s < now:
            s, clamped = now, clamped + 1
        crit[q] = cp
        heapq.heappush(heap, (s, 1, seq, q, 0))
        seq += 1

    for i in range(n):
        if pending[i] == 0:
            heapq.heappush(heap, (origin[i] + delay[i], 1, seq, i, 0))
            seq += 1
    while heap:
        t, kind, _, x, ver = heapq.heappop(heap)
        fin = []
        now = t
        if kind == 0:
            j = x
            jb = jobs[j]
            if ver != jb["ver"] or jb.get("gone"):
                continue
            jb["done"] = jb["thr"]
            jb["last"] = now
            if j < n:
                own[j] = now
                if wpending[j] == 0:
                    fin.append(j)
                finished = True
            else:
                cs = csorted[j - n]
                while jb["k"] < len(cs) and max(dur[cs[jb["k"]]], 0) <= jb["done"]:
                    m = cs[jb["k"]]
                    own[m] = now
                    jb["k"] += 1
                    if wpending[m] == 0:
                        fin.append(m)
                finished = jb["k"] == len(cs)
                if not finished:
                    jb["thr"] = float(max(dur[cs[jb["k"]]], 0))
                    push_job(j, now + (jb["thr"] - jb["done"]) / jb["rate"])
            if finished:
                jb["gone"] = True
                p = active.index(j)
                active[p] = active[-1]
                active.pop()
                if not is_flow(j):
                    n_compute[device[j]] -= 1
                else:
                    for m in members(j):
                        if device[m] >= 0:
                            n_comm[device[m]] = n_comm.get(device[m], 0) - 1
                if sharing:
                    rerate(now)
        else:
            i = x
            start[i] = now
            started += 1
            q = lane_next[i]
            if q >= 0 and lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    release(q, now)
            for q, from_start in succs[i]:
                if from_start:
                    pending[q] -= 1
                    if pending[q] == 0:
                        release(q, now)
            c = coll_of[i]
            newjob = -1
            if c >= 0:
                arrived[c] += 1
                if arrived[c] == len(colls[c]):
                    a = -math.inf
                    for m in colls[c]:
                        if start[m] > a:
                            a, last_of[c] = start[m], m
                    j = n + c
                    jobs[j] = {"done": 0.0, "rate": 1.0, "last": now, "thr": 0.0, "k": 0, "ver": 0}
                    cs = csorted[c]
                    while jobs[j]["k"] < len(cs) and dur[cs[jobs[j]["k"]]] <= 0:
                        m = cs[jobs[j]["k"]]
                        own[m] = a + dur[m]
                        jobs[j]["k"] += 1
                        if wpending[m] == 0:
                            fin.append(m)
                    if jobs[j]["k"] < len(cs):
                        newjob = j
                        jobs[j]["thr"] = float(max(dur[cs[jobs[j]["k"]]], 0))
            elif resource[i] > 0 and dur[i] > 0:
                newjob = i
                jobs[i] = {"done": 0.0, "rate": 1.0, "last": now, "thr": float(dur[i]), "k": 0,
                           "ver": 0}
            else:
                own[i] = now + dur[i]
                if wpending[i] == 0:
                    fin.append(i)
            if newjob >= 0:
                j = newjob
                jobs[j].update(done=0.0, last=now, rate=1.0)
                active.append(j)
                if not is_flow(j):
                    n_compute[device[j]] = n_compute.get(device[j], 0) + 1
                else:
                    for m in members(j):
                        if device[m] >= 0:
                            n_comm[device[m]] = n_comm.get(device[m], 0) + 1
                push_job(j, now + jobs[j]["thr"])
                if sharing:
                    jobs[j]["rate"] = -1.0
                    rerate(now)
        while fin:
            i = fin.pop()
            cc = coll_of[i]
            if cc >= 0:
                ev = start[i]
                if own[i] > ev:
                    ev = own[i]
                    if i != last_of[cc]:
                        crit[i] = last_of[cc]
            else:
                ev = own[i]
            for s, lag in waits[i]:
                if end[s] + lag > ev:
                    ev, crit[i] = end[s] + lag, s
            end[i] = ev
            q = lane_next[i]
            if q >= 0 and not lane_s2s[q]:
                pending[q] -= 1
                if pending[q] == 0:
                    release(q, now)
            for q, from_start in succs[i]:
                if from_start:
                    continue
                pending[q] -= 1
                if pending[q] == 0:
                    release(q, now)
            for q in wsuccs[i]:
                wpending[q] -= 1
                if wpending[q] == 0 and own[q] is not None:
                    fin.append(q)
        flush(now)
    if started < n:
        raise RuntimeError("cycle")
    s, e, c = _to_ops(g, [int(np.rint(x)) + base for x in start],
                      [int(np.rint(x)) + base for x in end], crit)
    return s, e, c, clamped


# ---------------------------------------------------------------------------- generator
def random_trace(seed: int, *, n_ranks: int = 3, steps: int = 6, gpu_lanes: int = 2,
                 p_coll: float = 0.3, p_p2p: float = 0.15, p_sync: float = 0.1,
                 negative_launch_lag: bool = True, jitter: bool = True) -> Trace:
    """A random multi-rank training-like trace with lanes, edges, collectives and p2p.

    Each rank runs a host thread issuing runtime calls (HOST_ORDER edges with the measured
    gap), each launching a GPU op on one of its streams (LAUNCH edges, lag ``min(0, ...)``);
    now and then all ranks launch a collective in the same order (shared ``coll_id``), a rank
    sends to the next one (P2P edge), or the host blocks on a stream (a ``cudaStreamSynchronize``
    call followed by a SYNC edge). Times come from a simple forward simulation with random
    durations and idle gaps, so the trace is internally consistent (like a real profile).
    """
    rng = np.random.default_rng(seed)
    strings = ["cudaLaunchKernel", "cudaStreamSynchronize", "gemm", "elementwise",
               "ncclAllReduce", "ncclSend", "ncclRecv", "aten::mul"]
    ops: dict[str, list] = {k: [] for k in ("rank", "lane", "kind", "name_id", "start_ns",
                                            "dur_ns", "coll_id")}
    edges: dict[str, list] = {"src": [], "dst": [], "kind": [], "lag_ns": []}
    lanes = {"lane": [], "rank": [], "device": [], "lane_kind": [], "native_id": []}
    cpu_lane, gpu_lane = {}, {}
    for r in range(n_ranks):
        cpu_lane[r] = len(lanes["lane"])
        for k, v in (("lane", cpu_lane[r]), ("rank", r), ("device", -1),
                     ("lane_kind", int(LaneKind.CPU_THREAD)), ("native_id", 100 + r)):
            lanes[k].append(v)
        for s in range(gpu_lanes):
            gpu_lane[r, s] = len(lanes["lane"])
            for k, v in (("lane", gpu_lane[r, s]), ("rank", r), ("device", 0),
                         ("lane_kind", int(LaneKind.GPU_STREAM)), ("native_id", 7 + s)):
                lanes[k].append(v)
    host_t = {r: int(rng.integers(0, 5000)) for r in range(n_ranks)}
    lane_free = {key: 0 for key in gpu_lane}
    last_host = {r: -1 for r in range(n_ranks)}
    last_gpu = {}

    def add_op(r, lane, kind, name, start, dur, coll=-1):
        i = len(ops["rank"])
        for k, v in (("rank", r), ("lane", lane), ("kind", int(kind)), ("name_id", name),
                     ("start_ns", int(start)), ("dur_ns", int(dur)), ("coll_id", coll)):
            ops[k].append(v)
        return i

    def edge(s, d, kind, lag):
        for k, v in (("src", s), ("dst", d), ("kind", int(kind)), ("lag_ns", int(lag))):
            edges[k].append(v)

    def host_call(r, name, dur):
        gap = int(rng.integers(0, 2000))
        st = host_t[r] + gap
        i = add_op(r, cpu_lane[r], OpKind.RUNTIME, name, st, dur)
        if last_host[r] >= 0:
            prev_end = ops["start_ns"][last_host[r]] + ops["dur_ns"][last_host[r]]
            edge(last_host[r], i, EdgeKind.HOST_ORDER, st - prev_end)
        last_host[r] = i
        host_t[r] = st + dur
        return i

    def launch(r, s, kind, name, dur, coll=-1, not_before=0):
        li = host_call(r, 0, int(rng.integers(1000, 6000)))
        lend = ops["start_ns"][li] + ops["dur_ns"][li]
        lo = ops["start_ns"][li] + int(rng.integers(500, 3000)) if negative_launch_lag else lend
        st = max(lo, lane_free[r, s], not_before)
        if jitter and rng.random() < 0.05 and st == lane_free[r, s] and st - 40 > lo:
            st -= int(rng.integers(1, 40))  # profiler rounding: overlaps its predecessor
        if jitter and rng.random() < 0.1:
            st += int(rng.integers(1, 20000))  # an unexplained delay
        gi = add_op(r, gpu_lane[r, s], kind, name, st, dur, coll)
        edge(li, gi, EdgeKind.LAUNCH, min(0, st - lend))
        lane_free[r, s] = st + dur
        last_gpu[r, s] = gi
        return gi

    coll_seq = 0
    for _ in range(steps):
        for r in range(n_ranks):
            for _ in range(int(rng.integers(2, 6))):
                launch(r, int(rng.integers(0, gpu_lanes)), OpKind.KERNEL,
                       int(rng.integers(2, 4)), int(rng.integers(2000, 50000)))
        if rng.random() < p_coll and n_ranks > 1:
            # every rank launches its member; the collective ends together after the last
            s = gpu_lanes - 1
            members = []
            for r in range(n_ranks):
                members.append(launch(r, s, OpKind.COLLECTIVE, 4, 1))
            a = max(ops["start_ns"][m] for m in members)
            tail = int(rng.integers(5000, 30000))
            for r, m in zip(range(n_ranks), members, strict=True):
                end = a + tail + int(rng.integers(0, 200))
                ops["dur_ns"][m] = end - ops["start_ns"][m]
                ops["coll_id"][m] = coll_seq
                lane_free[r, s] = end
            coll_seq += 1
        if rng.random() < p_p2p and n_ranks > 1:
            r = int(rng.integers(0, n_ranks - 1))
            snd = launch(r, 0, OpKind.P2P, 5, int(rng.integers(3000, 9000)))
            send_end = ops["start_ns"][snd] + ops["dur_ns"][snd]
            rcv = launch(r + 1, 0, OpKind.P2P, 6, int(rng.integers(1000, 4000)),
                         not_before=send_end)
            edge(snd, rcv, EdgeKind.P2P, 0)
        for r in range(n_ranks):
            if rng.random() < p_sync and (r, 0) in last_gpu:
                gi = last_gpu[r, 0]
                gend = ops["start_ns"][gi] + ops["dur_ns"][gi]
                y = host_call(r, 1, 1000)
                ops["dur_ns"][y] = max(gend, ops["start_ns"][y]) + 800 - ops["start_ns"][y]
                host_t[r] = ops["start_ns"][y] + ops["dur_ns"][y]
                nxt = host_call(r, 7, int(rng.integers(500, 3000)))
                edge(gi, nxt, EdgeKind.SYNC, 0)
    return Trace.build(ops={k: np.asarray(v) for k, v in ops.items()}, lanes=lanes,
                       strings=strings, edges=edges, meta={"source_format": "random",
                                                           "seed": seed})
