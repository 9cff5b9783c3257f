"""Kineto: dependency inference and attribution on one rank's columns.

Called by :mod:`collectors.kineto.links` once the events are columns. SYNC edges (cuda_sync
events, blocking calls, stream waits), step/phase attribution and collective metadata
(CPU-collective edges: :mod:`.gloo`) (type, size, group, sequence number). See links' docstring for the
semantics of each edge kind.
"""

from __future__ import annotations

import re
from operator import attrgetter

import msgspec
import numpy as np

from .._kernels import latest_done as latest_done_ops
from ..collectives import DTYPE_BYTES, comm_op_from_name
from ..enums import CommOp, OpKind, Phase
from ..intervals import interval_union

__all__ = ["sync_edges", "attribute", "comm_info"]

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# host ops and annotations that name a collective and carry its size: c10d / record_param_comms,
# and the ops that launch communication kernels themselves (symmetric memory's
# symm_mem::multimem_all_reduce_, functional collectives)
COMM_RANGE = re.compile(r"^(nccl:|gloo:|c10d::|record_param_comms|rccl:|symm_mem::|"
                        r"_?c10d_functional::)")
_STREAM_WAIT = {"cudaStreamWaitEvent", "hipStreamWaitEvent", "cuStreamWaitEvent"}
_BLOCKING = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
             "cudaMemcpy", "hipStreamSynchronize", "hipDeviceSynchronize",
             "hipEventSynchronize", "hipMemcpy", "cuStreamSynchronize", "cuCtxSynchronize"}


def _first_index(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(v, return_index=True)`` for small non-negative ids (lanes), without a sort."""
    if len(v) == 0 or int(v.min()) < 0 or int(v.max()) >= 4 * len(v) + 1024:
        return np.unique(v, return_index=True)
    first = np.full(int(v.max()) + 1, -1, np.int64)
    first[v[::-1]] = np.arange(len(v) - 1, -1, -1)  # the last write (the first index) wins
    u = np.flatnonzero(first >= 0)
    return u, first[u]


def _next_host_op(i: int, lane: np.ndarray, n_h: int) -> int:
    j = i + 1
    return j if j < n_h and lane[j] == lane[i] else -1


def sync_edges(evs, syncs, kind, lane, corr, start, end, n_h, n, rt_sorted, rc, strings,
                name_id, launch_of, G, g_lane_local):
    """SYNC edges (see module docstring). Returns (src, dst) arrays."""
    src, dst = [], []
    gpu = np.arange(n_h, n)
    gcorr = corr[gpu]
    glane = lane[gpu]
    by_lane: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for ln in np.unique(glane):
        ids = gpu[glane == ln]
        o = np.argsort(corr[ids], kind="stable")
        by_lane[int(ln)] = (ids[o], corr[ids][o])
    ul, fi = _first_index(np.asarray(g_lane_local, np.int64))
    stream_lane = {(int(G["dev"][f]), int(G["stream"][f])): int(li) for li, f in
                   zip(ul.tolist(), fi.tolist(), strict=True)}
    lane_dev = {int(li): int(G["dev"][f]) for li, f in zip(ul.tolist(), fi.tolist(), strict=True)}

    def rt_of(c):
        if c is None or c < 0 or len(rc) == 0:
            return -1
        p = np.searchsorted(rc, c)
        return int(rt_sorted[p]) if p < len(rc) and rc[p] == c else -1

    def last_before(ln, c):
        t = by_lane.get(ln)
        if t is None:
            return -1
        p = np.searchsorted(t[1], c) - 1
        return int(t[0][p]) if p >= 0 else -1

    def first_after(ln, c):
        t = by_lane.get(ln)
        if t is None:
            return -1
        p = np.searchsorted(t[1], c, side="right")
        return int(t[0][p]) if p < len(t[1]) else -1

    queries: list[tuple[int, int]] = []

    def latest_done(c, t_end):
        """A placeholder (<= -2) for the GPU op that ended last, among those launched before
        correlation ``c``, by ``t_end`` (+1 us); answered for all calls at once below."""
        queries.append((int(c), int(t_end) + 1000))
        return -1 - len(queries)

    covered = set()
    for i in syncs:
        a = evs[i].args
        if a is None or a.correlation < 0:
            continue
        kind_s = a.sync_kind or evs[i].name
        call = rt_of(a.correlation)
        covered.add(a.correlation)
        dev = a.device if a.device is not None else evs[i].pid
        if kind_s == "Stream Wait Event":
            rec_ln = stream_lane.get((dev, a.wait_stream))
            wait_ln = stream_lane.get((dev, a.stream))
            if rec_ln is None or wait_ln is None or a.wait_corr is None:
                continue
            s = last_before(rec_ln, a.wait_corr)
            d = first_after(wait_ln, a.correlation)
        else:
            if call < 0 or (kind_s == "Event Sync" and a.wait_corr in (None, -1)):
                continue  # waiting on an event never recorded returns at once
            d = _next_host_op(call, lane, n_h)
            if kind_s == "Context Sync" or a.wait_stream in (None, -1):
                s = latest_done(a.correlation, end[call])
            else:
                ln = stream_lane.get((dev, a.wait_stream if a.wait_stream not in (None, -1) else a.stream))
                s = last_before(ln, a.wait_corr if a.wait_corr not in (None, -1) else a.correlation) if ln is not None else -1
        if s != -1 and d >= 0:
            src.append(s)
            dst.append(d)
    # blocking host calls without cuda_sync events
    names = strings.names
    rts = np.flatnonzero(kind[:n_h] == OpKind.RUNTIME)
    if covered:
        rts = rts[~np.isin(corr[rts], np.fromiter(covered, np.int64, len(covered)))]
    rt_names = name_id[rts]
    is_blocking = np.fromiter((nm in _BLOCKING for nm in names), bool, len(names))
    is_wait = np.fromiter((nm in _STREAM_WAIT for nm in names), bool, len(names))
    for r in rts[is_blocking[rt_names]].tolist():
        c = int(corr[r])
        d = _next_host_op(r, lane, n_h)
        if d < 0:
            continue
        src.append(latest_done(c if c >= 0 else np.iinfo(np.int64).max, end[r]))
        dst.append(d)
    if queries:  # answer the placeholders; a call with no such GPU op gets no edge
        q = np.asarray(queries, np.int64)
        pos = latest_done_ops(gcorr, end[gpu], q[:, 0], q[:, 1])
        got = np.where(pos >= 0, pos + n_h, -1)
        s_arr = np.asarray(src, np.int64)
        ph = s_arr <= -2
        s_arr[ph] = got[-s_arr[ph] - 2]
        keep = s_arr >= 0
        src = s_arr[keep].tolist()
        dst = np.asarray(dst, np.int64)[keep].tolist()
    # cudaStreamWaitEvent without cuda_sync info (older traces): the next op launched from
    # the same thread waits for the op most recently issued to another stream of the device
    # (the work the recorded event covered, as in DDP's NCCL stream waiting on compute).
    rt_gpu = np.full(n_h, -1, np.int64)
    launched = np.flatnonzero(launch_of >= 0)
    rt_gpu[launch_of[launched]] = launched
    ws, wd = _stream_wait_edges(rts[is_wait[rt_names]], corr, lane, start, end, n_h, rt_gpu,
                                by_lane, lane_dev)
    # launch calls that returned only after their GPU op finished (blocking memcpy)
    blk = launched[(end[launch_of[launched]] >= end[launched]) & (kind[launched] == OpKind.MEMCPY)]
    r = launch_of[blk]
    if covered:
        keep = ~np.isin(corr[r], np.fromiter(covered, np.int64, len(covered)))
        blk, r = blk[keep], r[keep]
    d = r + 1  # the host op right after the call, on its thread (_next_host_op)
    nxt = (d < n_h) & (lane[np.minimum(d, max(n_h - 1, 0))] == lane[r]) if len(r) else d >= 0
    return (np.concatenate([np.asarray(src, np.int64), ws, blk[nxt]]).astype(np.int64),
            np.concatenate([np.asarray(dst, np.int64), wd, d[nxt]]).astype(np.int64))


def _stream_wait_edges(wr, corr, lane, start, end, n_h, rt_gpu, by_lane, lane_dev):
    """cudaStreamWaitEvent calls ``wr`` without cuda_sync info -> (src, dst) SYNC edges.

    For each call r: d is the GPU op launched by the first runtime call in (r, r + 64] on r's
    thread (no thread change in between); src is, over the other streams of d's device, the
    op with the greatest correlation below r's (first stream on ties), if it ended by
    start[d] + 1 us. Vectorized over the calls, one pass per stream.
    """
    z = np.zeros(0, np.int64)
    if len(wr) == 0 or n_h == 0:
        return z, z
    lh = lane[:n_h]
    run = np.concatenate([[0], np.cumsum(lh[1:] != lh[:-1])])  # thread-run id per host op
    pos = np.where(rt_gpu >= 0, np.arange(n_h), n_h)
    nxt = np.append(np.minimum.accumulate(pos[::-1])[::-1], n_h)  # next launching call >= j
    j = nxt[wr + 1]
    jc = np.minimum(j, n_h - 1)
    ok = (j < n_h) & (j <= wr + 64) & (run[jc] == run[wr])
    wr, j = wr[ok], j[ok]
    d = rt_gpu[j]
    c = corr[wr]
    ld = lane[d].astype(np.int64)
    n_l = max(max(lane_dev) if lane_dev else 0, int(ld.max()) if len(ld) else 0) + 1
    ldev = np.zeros(n_l, np.int64)
    has_dev = np.zeros(n_l, bool)
    for k_, v_ in lane_dev.items():
        ldev[k_], has_dev[k_] = v_, True
    dev = ldev[ld]
    dev_ok = has_dev[ld]
    best = np.full(len(d), -1, np.int64)
    best_c = np.full(len(d), -1, np.int64)
    for ln, (ids, cs) in by_lane.items():
        if ln not in lane_dev:
            continue
        m = dev_ok & (ld != ln) & (dev == lane_dev[ln])
        p = np.searchsorted(cs, c) - 1
        pc = np.maximum(p, 0)
        upd = m & (p >= 0) & (cs[pc] > best_c)
        best[upd] = ids[pc[upd]]
        best_c[upd] = cs[pc[upd]]
    keep = best >= 0
    keep[keep] = end[best[keep]] <= start[d[keep]] + 1000
    return best[keep], d[keep]


_FWD = re.compile(r"forward", re.I)
_BWD = re.compile(r"backward|^autograd::engine::evaluate_function", re.I)
_OPT = re.compile(r"^Optimizer\.|## optimizer ##|optimizer\.step|zero_grad", re.I)


def _inside(t: np.ndarray, us: np.ndarray, ue: np.ndarray) -> np.ndarray:
    if len(us) == 0:
        return np.zeros(len(t), bool)
    p = np.searchsorted(us, t, side="right") - 1
    ok = p >= 0
    res = np.zeros(len(t), bool)
    res[ok] = t[ok] < ue[p[ok]]
    return res


def attribute(names_arr, r_name, r_start, r_end, start, launch_of, n_h, lane=None):
    """step from ProfilerStep#N ranges; phase from forward/backward/optimizer markers.

    Host ops take the step they run in, GPU ops the step of the call that launched them
    (:mod:`collectors.steps`). A GPU op without a recorded launch takes its place in its
    stream's FIFO order (:func:`_unlaunched_steps`). Name patterns are matched once per
    distinct name (the string table), not per range.
    """
    n = len(start)
    t = start.copy()
    has_launch = launch_of >= 0
    t[has_launch] = start[launch_of[has_launch]]  # GPU ops: attribute by their launch time
    step = np.full(n, -1, np.int32)
    step_no = np.full(len(names_arr), -1, np.int64)
    cls = np.zeros((3, len(names_arr)), bool)
    for i, s in enumerate(names_arr):
        # prefilter: an ASCII name whose lower case holds none of the patterns' words matches
        # none (for ASCII text the re.I patterns compare like lower case); others: the regexes
        if s.isascii():
            low = s.lower()
            if not ("forward" in low or "backward" in low or "optimizer" in low
                    or "zero_grad" in low or "profilerstep#" in low
                    or "autograd::engine::evaluate_function" in low):
                continue
        m = _STEP_RE.match(s)
        if m:
            step_no[i] = int(m.group(1))
        bwd = bool(_BWD.search(s))
        cls[0, i] = bool(_FWD.search(s)) and not bwd
        cls[1, i] = bwd
        cls[2, i] = bool(_OPT.search(s))
    if len(r_name):
        rs = step_no[r_name]
        sel = rs >= 0
        if sel.any():
            o = np.argsort(r_start[sel], kind="stable")
            ss, se, sn = r_start[sel][o], r_end[sel][o], rs[sel][o]
            p = np.searchsorted(ss, t, side="right") - 1
            ok = p >= 0
            ok[ok] = t[ok] < se[p[ok]]
            step[ok] = sn[p[ok]]
    if lane is not None and n > n_h:
        step[n_h:] = _unlaunched_steps(step[n_h:], launch_of[n_h:] >= 0, lane[n_h:],
                                       start[n_h:])
    phase = np.full(n, int(Phase.UNKNOWN), np.int8)
    phase[step >= 0] = int(Phase.OTHER)
    for k, ph in enumerate((Phase.FWD, Phase.BWD, Phase.OPT)):
        sel = cls[k][r_name] if len(r_name) else np.zeros(0, bool)
        us, ue = interval_union(r_start[sel], r_end[sel])
        phase[_inside(t, us, ue)] = int(ph)
    return step, phase


def _unlaunched_steps(step, launched, lane, start) -> np.ndarray:
    """Steps of GPU ops whose launch call is not in the trace, from their stream's FIFO order.

    A stream runs its ops in launch order, so an op between two launched ops of step ``k``
    was launched in step ``k``; one before the stream's first launched op was queued before
    the profiled steps (the GPU's backlog when it runs behind the host: step -1, not the host
    step it happens to run in); one between steps ``p < q`` keeps the step its start time
    falls in, clamped to ``[p, q]``; one after the last launched op keeps its time's step
    (at least ``p``). Streams without any launched op keep the time-based steps.
    """
    step = step.copy()
    un = ~launched
    if not un.any() or not launched.any():
        return step
    o = np.lexsort((start, lane))
    ln, st, la = lane[o], step[o], launched[o]
    pos = np.arange(len(o))
    new_lane = np.r_[True, ln[1:] != ln[:-1]]
    seg = np.cumsum(new_lane) - 1
    seg_start = np.flatnonzero(new_lane)[seg]
    # index of the previous / next launched op on the same lane (-1 when none)
    prev = np.where(la, pos, -1)
    prev = np.maximum.accumulate(prev)
    prev = np.where(prev >= seg_start, prev, -1)
    nxt = np.where(la, pos, len(o))
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]
    seg_end = np.r_[np.flatnonzero(new_lane)[1:], len(o)][seg]
    nxt = np.where(nxt < seg_end, nxt, -1)
    lane_has = np.zeros(int(seg.max()) + 1, bool)
    lane_has[seg[la]] = True
    fix = ~la & lane_has[seg]
    p_st = np.where(prev >= 0, st[np.maximum(prev, 0)], -1)
    q_st = np.where(nxt >= 0, st[np.maximum(nxt, 0)], -1)
    out = st.copy()
    before = fix & (prev < 0)
    out[before] = -1
    mid = fix & (prev >= 0) & (nxt >= 0)
    lo_, hi_ = p_st[mid], np.maximum(q_st[mid], p_st[mid])
    out[mid] = np.where(st[mid] >= 0, np.clip(st[mid], lo_, hi_), lo_)
    after = fix & (prev >= 0) & (nxt < 0) & (st >= 0)
    out[after] = np.maximum(st[after], p_st[after])
    step[o] = out
    return step


def _dims_bytes(raw_dims, raw_types) -> int:
    try:
        dims = msgspec.json.decode(raw_dims) if len(raw_dims) else None
        types = msgspec.json.decode(raw_types) if len(raw_types) else None
    except msgspec.DecodeError:
        return 0
    if not dims or not isinstance(dims, list):
        return 0
    d0 = dims[0]
    if not isinstance(d0, list) or not d0:
        return 0
    ne = 1
    for x in d0:
        ne *= int(x) if isinstance(x, (int, float)) else 1
    t0 = types[0] if isinstance(types, list) and types else "float"
    return ne * DTYPE_BYTES.get(t0, 4)


def comm_info(evs, kind, start, name_id, names_arr, launch_of, H, parent, op_h, ev_idx,
               nbytes, lane=None, gpu_ranges=None) -> dict:
    """Per collective op: comm_op, bytes, group name, group size, seq (from args/ranges).

    Information comes from the kernel's own args (newer PyTorch), then from the enclosing
    host ranges of its launch call (``record_param_comms``, ``nccl:*``, ``c10d::*``),
    innermost first, found by walking the nesting parents.
    """
    ops = np.flatnonzero((kind == OpKind.COLLECTIVE) | (kind == OpKind.P2P))
    n_h = len(op_h)
    hn = np.asarray(H["name"], np.int32)
    hidx = np.asarray(H["idx"], np.int64)
    # enclosing comm ranges of each op's launch call, innermost first (vectorized parent walk)
    host = np.where(launch_of[ops] >= 0, launch_of[ops], np.where(ops < n_h, ops, -1))
    cur = np.full(len(ops), -1, np.int64)
    has = host >= 0
    cur[has] = parent[op_h[host[has]]]
    lv_op, lv_j = [], []
    while True:
        live = np.flatnonzero(cur >= 0)
        if len(live) == 0:
            break
        lv_op.append(live)
        lv_j.append(cur[live])
        cur[live] = parent[cur[live]]
    if lv_op:
        anc_op = np.concatenate(lv_op)  # level by level; a stable sort by op keeps that order
        anc_j = np.concatenate(lv_j)
        srt = np.argsort(anc_op, kind="stable")
        anc_op, anc_j = anc_op[srt], anc_j[srt]
        u_nm, inv = np.unique(hn[anc_j], return_inverse=True)
        is_comm = np.asarray([bool(COMM_RANGE.match(names_arr[x])) for x in u_nm.tolist()], bool)
        keep = is_comm[inv.reshape(-1)]
        anc_op, anc_j = anc_op[keep], anc_j[keep]
    else:
        anc_op = anc_j = np.zeros(0, np.int64)
    bounds = np.searchsorted(anc_op, np.arange(len(ops) + 1)).tolist()
    enc_args = [evs[x].args for x in hidx[anc_j].tolist()]
    f_, none_ = _INFO_FIELDS, _NO_INFO  # _informative, inlined (one call per range is slow)
    enc_inf = np.cumsum([0] + [x is not None and (f_(x) != none_ or len(x.input_dims) > 0)
                               for x in enc_args]).tolist()
    cop_of: dict[str, CommOp] = {}

    def cop_name(nm: str) -> CommOp:
        c = cop_of.get(nm)
        if c is None:
            c = cop_of[nm] = comm_op_from_name(nm)
        return c

    # CommOp of each distinct enclosing range name (after its ':') and kernel name
    u_enc, enc_inv = np.unique(hn[anc_j], return_inverse=True)
    enc_cop_u = [int(cop_name(names_arr[x].split(":", 1)[-1])) for x in u_enc.tolist()]
    enc_e = np.asarray(enc_cop_u, np.int64)[enc_inv.reshape(-1)] if len(u_enc) else \
        np.zeros(0, np.int64)
    enc_cops = enc_e.tolist()
    u_k, k_inv = np.unique(name_id[ops], return_inverse=True)
    k_cop_u = [int(cop_name(names_arr[x])) for x in u_k.tolist()]
    k_e = np.asarray(k_cop_u, np.int64)[k_inv.reshape(-1)] if len(u_k) else np.zeros(0, np.int64)
    k_cops = k_e.tolist()
    no_op = (CommOp.NONE, CommOp.UNKNOWN)
    unknown = CommOp.UNKNOWN
    ev_o = ev_idx[ops].tolist()
    nb_o = nbytes[ops].tolist()

    def by_names(cop, q, o, b0, b1):
        """Unless ``cop`` is known: the first enclosing range's, the kernel's, then the GPU
        annotation's collective."""
        if cop in no_op:
            for c in enc_cops[b0:b1]:
                if c != unknown:
                    cop = c
                    break
        if cop in no_op:
            cop = k_cops[q]
        if cop in no_op and gpu_ranges is not None:
            cop = _annotation_cop(gpu_ranges, names_arr, start[o], lane[o], cop)
        return cop

    # ops whose args (their own, their enclosing ranges') carry no collective info (older
    # PyTorch): names and the kernel's size only, by_names for all of them at once
    a_ks = [evs[x].args for x in ev_o]
    bnd = np.asarray(bounds, np.int64)
    enc_inf_a = np.asarray(enc_inf, np.int64)
    plain = (enc_inf_a[bnd[1:]] == enc_inf_a[bnd[:-1]]) & ~np.fromiter(
        (_informative(a) for a in a_ks), bool, len(ops))
    known = np.flatnonzero(enc_e != int(unknown))  # innermost range naming a collective
    first = np.full(len(enc_e) + 1, len(enc_e), np.int64)
    first[known] = known
    first = np.minimum.accumulate(first[::-1])[::-1][bnd[:-1]]
    cop_v = np.where(first < bnd[1:], np.append(enc_e, int(CommOp.NONE))[first], int(CommOp.NONE))
    cop_v = np.where((cop_v == int(CommOp.NONE)) | (cop_v == int(unknown)), k_e, cop_v)
    out_op = ops.tolist()
    out_cop = cop_v.tolist()
    out_bytes = list(nb_o)
    out_group = ["0"] * len(ops)
    out_gsize = [-1] * len(ops)
    out_seq = [-1] * len(ops)
    out_ranks: list = [None] * len(ops)
    if gpu_ranges is not None:
        for q in np.flatnonzero(plain & ((cop_v == int(CommOp.NONE)) | (cop_v == int(unknown)))
                                ).tolist():
            o = out_op[q]
            out_cop[q] = int(_annotation_cop(gpu_ranges, names_arr, start[o], lane[o], cop_v[q]))

    for q in np.flatnonzero(~plain).tolist():
        o = out_op[q]
        a_k = a_ks[q]
        b0, b1 = bounds[q], bounds[q + 1]
        infos = [a_k] + enc_args[b0:b1]
        cop = CommOp.NONE
        for a in infos:
            if a is not None and a.coll_name:
                cop = cop_name(a.coll_name)
                if cop != unknown:
                    break
        cop = by_names(cop, q, o, b0, b1)
        b = 0
        group, gsize, seq, pranks = None, None, -1, None
        for a in infos:
            if a is None:
                continue
            if not b and (a.in_nelems or a.out_nelems):
                b = max(a.in_nelems or 0, a.out_nelems or 0) * DTYPE_BYTES.get(a.dtype or "Float", 4)
            if group is None and a.pg_name is not None:
                group = str(a.pg_name)
            if gsize is None and a.group_size:
                gsize = int(a.group_size)
            if seq < 0 and isinstance(a.seq, int):
                seq = int(a.seq)
            if pranks is None and a.pg_ranks:
                pranks = a.pg_ranks if isinstance(a.pg_ranks, list) else _parse_ranks(a.pg_ranks)
        if not b:
            for a in infos:
                if a is not None and len(a.input_dims):
                    b = _dims_bytes(a.input_dims, a.input_type)
                    if b:
                        break
        if not b:
            b = nb_o[q]
        out_cop[q] = int(cop)
        out_bytes[q] = int(b)
        out_group[q] = group if group is not None else "0"
        out_gsize[q] = gsize if gsize is not None else -1
        out_seq[q] = seq
        out_ranks[q] = pranks
    return {"op": np.asarray(out_op, np.int64), "comm_op": np.asarray(out_cop, np.int8),
            "bytes": np.asarray(out_bytes, np.int64), "group": out_group,
            "group_size": np.asarray(out_gsize, np.int64), "seq": np.asarray(out_seq, np.int64),
            "pg_ranks": out_ranks}


_INFO_FIELDS = attrgetter("coll_name", "in_nelems", "out_nelems", "pg_name", "group_size", "seq",
                          "pg_ranks")
_NO_INFO = (None,) * 7


def _informative(a) -> bool:
    """False when args ``a`` carry nothing comm_info reads (a no-op in all its loops)."""
    return a is not None and (_INFO_FIELDS(a) != _NO_INFO or len(a.input_dims) > 0)


def _annotation_cop(gpu_ranges, names_arr, t0, ln, cop):
    """No launch call recorded (RCCL): the CommOp of a gpu_user_annotation around the kernel
    (innermost first), else ``cop``."""
    gl, gn, gs, ge = gpu_ranges
    hit = np.flatnonzero((gl == ln) & (gs <= t0) & (t0 < ge))
    for j in hit[np.argsort(-gs[hit])]:
        c = comm_op_from_name(names_arr[gn[j]].split(":", 1)[-1])
        if c != CommOp.UNKNOWN:
            return c
    return cop


def _parse_ranks(s: str) -> list[int] | None:
    try:
        v = msgspec.json.decode(s.encode())
        return [int(x) for x in v] if isinstance(v, list) else None
    except (msgspec.DecodeError, ValueError, TypeError):
        return None


#: the autograd engine's blocking call: ``loss.backward()`` hands the graph to the engine's
#: device threads and waits for them (recorded as a Python frame with ``with_stack=True``)
ENGINE_WAIT = re.compile(r"run_backward of torch\._C\._EngineBase")


def engine_wait_edges(names_arr, name_id, lane, start, end, n_h):
    """``run_backward`` leaf ops -> (src, dst) SYNC edges: the last host op another thread ran
    inside the call (the autograd device thread's last backward op) -> the op after the call
    on its own thread, so the call ends when the engine's threads are done, not at its
    measured end (a what-if that shortens or lengthens the backward moves it); and the op
    before the call -> the first op those threads ran inside it (the engine starts its work
    when the call is made, so a shorter forward starts the backward earlier)."""
    host = np.arange(n_h)
    hit = np.fromiter((bool(ENGINE_WAIT.search(str(s))) for s in names_arr), bool,
                      len(names_arr))
    calls = host[hit[name_id[:n_h]]] if len(names_arr) else host[:0]
    src, dst = [], []
    for c in calls.tolist():
        nxt = c + 1  # host ops are sorted by (lane, start)
        if nxt >= n_h or lane[nxt] != lane[c]:
            continue
        inside = np.flatnonzero((lane[:n_h] != lane[c]) & (start[:n_h] >= start[c])
                                & (end[:n_h] <= end[c]))
        if len(inside):
            src.append(int(inside[np.argmax(end[inside])]))
            dst.append(nxt)
            if c > 0 and lane[c - 1] == lane[c]:  # the engine starts when the call is made
                src.append(c - 1)
                dst.append(int(inside[np.argmin(start[inside])]))
    return np.asarray(src, np.int64), np.asarray(dst, np.int64)
