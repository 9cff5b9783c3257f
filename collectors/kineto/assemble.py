"""Kineto: a rank's columns (collectors/kineto/links.py reads them from its events) -> its
lanes, ops, edges and ranges: the :class:`schema.RankPart` of one file. The dependency
rules (LAUNCH, SYNC, HOST_ORDER) are listed in collectors/kineto/links.py.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .._kernels import nest_intervals
from ..enums import CommOp, EdgeKind, LaneKind, OpKind
from .deps import attribute, comm_info, engine_wait_edges, sync_edges
from .gloo import gloo_edges
from .schema import H_CPU, H_GLOO, H_RUNTIME, RankPart

__all__ = ["assemble"]

#: Python frames that block the thread (with_stack traces name them "file.py(line): func")
_PY_WAIT = re.compile(r"^(threading|queue|selectors|multiprocessing/connection)\.py\(\d+\): "
                      r"(wait|_wait_for_tstate_lock|join|get|select|poll|_poll|recv_bytes)$")


def _lane_key_ids(a, b) -> tuple[np.ndarray, list]:
    """Dense ids (in order of first appearance) of the pairs ``(a[i], b[i])``."""
    n = len(a)
    try:
        ai = np.asarray(a).astype(np.int64)
        bi = np.asarray(b).astype(np.int64)
        if n and (ai.min() < -(1 << 30) or ai.max() >= 1 << 30 or bi.min() < -(1 << 31)
                  or bi.max() >= 1 << 31):
            raise ValueError("ids too wide to pack")  # e.g. pthread ids: hash the pairs
        codes, uniq = pd.factorize((ai << 32) + bi)
    except (TypeError, ValueError, OverflowError):  # string pids/tids: hash the pairs
        codes, uniq = pd.factorize(pd.Series(list(zip(a, b)), dtype=object))
    first = np.empty(len(uniq), np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1)
    return codes.astype(np.int64), [(_py(a[f]), _py(b[f])) for f in first]


def _host_order(lane, hs, he, hc) -> np.ndarray:
    """``np.lexsort((hc, -he, hs, lane))``, faster: one stable sort of (lane, start) packed in
    an int64, then the few runs of equal (lane, start) ordered by (-end, code)."""
    n = len(hs)
    if n < 2:
        return np.arange(n)
    t0 = int(hs.min())
    if int(lane.min()) < 0 or int(lane.max()) >= 1 << 18 or int(hs.max()) - t0 >= 1 << 44:
        return np.lexsort((hc, -he, hs, lane))
    key = (lane.astype(np.int64) << 44) | (hs - t0)
    o = np.argsort(key, kind="stable")
    ks = key[o]
    tie = ks[1:] == ks[:-1]
    if tie.any():
        t = np.flatnonzero(tie)
        m = np.union1d(t, t + 1)  # positions (in o) inside runs of equal keys
        run = np.cumsum(np.concatenate([[True], ~tie[m[:-1]] | (np.diff(m) != 1)]))
        om = o[m]
        o[m] = om[np.lexsort((hc[om], -he[om], run))]
    return o


def _py(x):
    """numpy scalars -> Python ones (lane keys are tested with isinstance(x, int))."""
    return x.item() if isinstance(x, np.generic) else x


def assemble(path, doc, rank, rank_source, strings, kept, dropped, tnames, G, H, GR,
              syncs, mem, window, evs, n_events) -> RankPart:
    # ---------------- lanes
    lanes: list[tuple[int, int, int, int, str]] = []
    g_lane_local, g_uniq = _lane_key_ids(G["dev"], G["stream"])
    for dev, st in g_uniq:
        nm = tnames.get(("thread_name", (dev, st))) or f"stream {st}"
        lanes.append((int(LaneKind.GPU_STREAM), int(dev), int(st), int(dev), str(nm).strip()))
    n_g_lanes = len(lanes)
    h_lane, h_uniq = _lane_key_ids(H["pid"], H["tid"])
    for pid, tid in h_uniq:
        nm = tnames.get(("thread_name", (pid, tid))) or f"thread {tid}"
        nid = tid if isinstance(tid, int) else -1
        lanes.append((int(LaneKind.CPU_THREAD), -1, nid, pid if isinstance(pid, int) else -1,
                      str(nm).strip()))
    h_lane = h_lane + n_g_lanes

    # ---------------- host nesting: leaves -> ops, containers/annotations -> ranges
    hs = np.asarray(H["start"], np.int64)
    he = np.asarray(H["end"], np.int64)
    hc = np.asarray(H["code"], np.int8)
    order = _host_order(h_lane, hs, he, hc)  # lane, start, longer first, annot before op
    depth_s, cont_s, parent_s = nest_intervals(h_lane[order], hs[order], he[order])
    parent = np.full(len(hs), -1, np.int64)
    has_p = parent_s >= 0
    parent[order[has_p]] = order[parent_s[has_p]]
    depth = np.empty_like(depth_s)
    depth[order] = depth_s
    container = np.empty_like(cont_s)
    container[order] = cont_s
    # a Python frame blocked in a wait (a background thread idling through the whole window)
    # is not work: it is kept as a range, not as an op that would stretch the rank's span
    waiting = np.asarray([bool(_PY_WAIT.match(n)) for n in strings.names], bool)
    is_wait = waiting[np.asarray(H["name"], np.int64)] if len(waiting) else np.zeros(len(hc), bool)
    is_op = ((hc == H_RUNTIME) | (hc == H_GLOO) | ((hc == H_CPU) & ~container & ~is_wait))
    is_range = ~is_op
    kept["ops"] += int(is_op.sum())
    kept["ranges"] += int(is_range.sum())

    h_name = np.asarray(H["name"], np.int32)
    op_h = np.flatnonzero(is_op)
    op_h = op_h[np.lexsort((hs[op_h], h_lane[op_h]))]  # host ops in lane/time order
    n_h = len(op_h)
    n_gpu = len(G["start"])
    n = n_h + n_gpu
    kind = np.empty(n, np.int8)
    hcode = hc[op_h]
    kind[:n_h] = np.where(hcode == H_RUNTIME, int(OpKind.RUNTIME),
                          np.where(hcode == H_GLOO, int(OpKind.COLLECTIVE), int(OpKind.CPU_OP)))
    kind[n_h:] = np.asarray(G["kind"], np.int8)
    lane = np.concatenate([h_lane[op_h], g_lane_local]).astype(np.int32)
    start = np.concatenate([hs[op_h], np.asarray(G["start"], np.int64)])
    dur = np.concatenate([he[op_h] - hs[op_h], np.asarray(G["dur"], np.int64)])
    name_id = np.concatenate([h_name[op_h], np.asarray(G["name"], np.int32)])
    corr = np.concatenate([np.asarray(H["corr"], np.int64)[op_h], np.asarray(G["corr"], np.int64)])
    ext = np.concatenate([np.asarray(H["ext"], np.int64)[op_h], np.asarray(G["ext"], np.int64)])
    nbytes = np.concatenate([np.zeros(n_h, np.int64), np.asarray(G["bytes"], np.int64)])
    ev_idx = np.concatenate([np.asarray(H["idx"], np.int64)[op_h], np.asarray(G["idx"], np.int64)])
    end = start + dur

    # ranges table (host containers + annotations, gpu annotations)
    rg = np.flatnonzero(is_range)
    r_lane = np.concatenate([h_lane[rg], _gpu_range_lanes(GR, g_uniq, n_g_lanes)]).astype(np.int32)
    r_name = np.concatenate([h_name[rg], np.asarray(GR["name"], np.int32)])
    r_start = np.concatenate([hs[rg], np.asarray(GR["start"], np.int64)])
    r_end = np.concatenate([he[rg], np.asarray(GR["end"], np.int64)])
    r_depth = np.concatenate([depth[rg], np.zeros(len(GR["start"]), np.int16)])
    valid_gr = r_lane >= 0
    if not valid_gr.all():  # gpu annotation on a stream with no ops: attach to a new lane
        for j in np.flatnonzero(~valid_gr):
            gi = j - len(rg)
            lanes.append((int(LaneKind.GPU_STREAM), int(GR["dev"][gi]), int(GR["stream"][gi]),
                          int(GR["dev"][gi]), f"stream {GR['stream'][gi]}"))
            r_lane[j] = len(lanes) - 1

    # ---------------- edges
    src_l, dst_l, kind_l, lag_l = [], [], [], []

    def add(src, dst, k, lag):
        src_l.append(np.asarray(src, np.int64))
        dst_l.append(np.asarray(dst, np.int64))
        kind_l.append(np.full(len(src), int(k), np.int8))
        lag_l.append(np.asarray(lag, np.int64))

    # HOST_ORDER: consecutive host ops on a lane (already sorted by lane, start)
    if n_h > 1:
        same = lane[1:n_h] == lane[: n_h - 1]
        s_idx = np.flatnonzero(same)
        gap = start[s_idx + 1] - end[s_idx]
        add(s_idx, s_idx + 1, EdgeKind.HOST_ORDER, np.maximum(gap, 0))
    # LAUNCH: runtime correlation -> gpu op
    rt = np.flatnonzero((kind[:n_h] == OpKind.RUNTIME) & (corr[:n_h] >= 0))
    rt_sorted = rt[np.argsort(corr[rt], kind="stable")]
    rc = corr[rt_sorted]
    gpu_ids = np.arange(n_h, n)
    gc = corr[gpu_ids]
    pos = np.searchsorted(rc, gc)
    pos_c = np.minimum(pos, max(len(rc) - 1, 0))
    has = (len(rc) > 0) & (gc >= 0)
    has = has & (rc[pos_c] == gc) if len(rc) else np.zeros(len(gc), bool)
    launch_of = np.full(n, -1, np.int64)  # gpu op -> runtime op
    if has.any():
        srcs = rt_sorted[pos_c[has]]
        dsts = gpu_ids[has]
        launch_of[dsts] = srcs
        add(srcs, dsts, EdgeKind.LAUNCH, np.minimum(start[dsts] - end[srcs], 0))
    n_unlaunched = int((~has).sum())
    # SYNC edges
    sync_src, sync_dst = sync_edges(evs, syncs, kind, lane, corr, start, end, n_h, n, rt_sorted, rc,
                                     strings, name_id, launch_of, G, g_lane_local)
    if len(sync_src):
        add(sync_src, sync_dst, EdgeKind.SYNC, np.minimum(start[sync_dst] - end[sync_src], 0))
    # the autograd engine's wait: backward() returns when its device threads are done
    ew_src, ew_dst = engine_wait_edges(np.asarray(strings.names, dtype=object), name_id, lane,
                                       start, end, n_h)
    if len(ew_src):
        add(ew_src, ew_dst, EdgeKind.SYNC, np.minimum(start[ew_dst] - end[ew_src], 0))

    # CPU collectives (gloo): issuing call -> execution on a gloo thread -> the waiting op
    gsrc, gdst, gkind = gloo_edges(np.asarray(strings.names, dtype=object), kind, lane, start,
                                    end, name_id, n_h, hs, he, hc, h_name, h_lane, is_op, op_h)
    for k_ in (EdgeKind.LAUNCH, EdgeKind.SYNC):
        m_ = gkind == k_
        if m_.any():
            add(gsrc[m_], gdst[m_], k_, np.minimum(start[gdst[m_]] - end[gsrc[m_]], 0))

    # ---------------- attribution: step, phase
    names_arr = np.asarray(strings.names, dtype=object)
    step, phase = attribute(names_arr, r_name[: len(rg)], r_start[: len(rg)], r_end[: len(rg)],
                             start, launch_of, n_h, lane)

    # ---------------- collectives metadata
    ng = len(GR["start"])
    comm = comm_info(evs, kind, start, name_id, names_arr, launch_of, H, parent, op_h,
                      ev_idx, nbytes, lane,
                      (r_lane[len(rg):], r_name[len(rg):], r_start[len(rg):], r_end[len(rg):])
                      if ng else None)
    comm_op = np.zeros(n, np.int8)
    comm_op[comm["op"]] = comm["comm_op"]
    nbytes[comm["op"]] = comm["bytes"]
    p2p = np.isin(comm_op, [int(CommOp.SEND), int(CommOp.RECV)])
    kind[p2p & (kind == OpKind.COLLECTIVE)] = int(OpKind.P2P)

    dist = doc.distributedInfo
    pgs = []
    if dist is not None and dist.pg_config:
        for pg in dist.pg_config:
            pgs.append({"name": str(pg.pg_name), "desc": pg.pg_desc, "size": pg.pg_size,
                        "ranks": list(pg.ranks or [])})
    devices = {}
    for d in doc.deviceProperties or []:
        if d.id is not None:
            devices[int(d.id)] = {"name": d.name, "memory_bytes": d.totalGlobalMem,
                                  "sms": d.numSms, "compute": f"{d.computeMajor}.{d.computeMinor}"}
    used_devs = np.unique(np.asarray(G["dev"], np.int64)).tolist()
    devices = {k: v for k, v in devices.items() if k in used_devs} or devices
    for d, blocks in _comm_blocks(evs, ev_idx, comm["op"]).items():
        if d in devices:  # NCCL channels measured: one block per channel (cost layer)
            devices[d]["nccl_blocks"] = blocks
    mem_arr = np.asarray(mem, dtype=np.int64).reshape(-1, 5)
    acc = {"events_read": n_events, "kept": dict(kept), "dropped": dict(dropped),
           "rank": int(rank), "rank_source": rank_source,
           "gpu_ops_without_launch": n_unlaunched}
    if doc.with_stack in (True, 1):  # Python stack tracing: the profiler slows the host
        acc["with_stack"] = True
    return RankPart(
        path=str(path), rank=int(rank), rank_source=rank_source,
        world_size=dist.world_size if dist is not None else None,
        backend=dist.backend if dist is not None else None, pg_config=pgs, devices=devices,
        strings=strings.names, lanes=lanes,
        ops=dict(lane=lane, kind=kind, name_id=name_id, start_ns=start, dur_ns=dur, step=step,
                 phase=phase, comm_op=comm_op, bytes=nbytes, correlation=corr, external_id=ext),
        edges=dict(src=np.concatenate(src_l) if src_l else np.zeros(0, np.int64),
                   dst=np.concatenate(dst_l) if dst_l else np.zeros(0, np.int64),
                   kind=np.concatenate(kind_l) if kind_l else np.zeros(0, np.int8),
                   lag_ns=np.concatenate(lag_l) if lag_l else np.zeros(0, np.int64)),
        ranges=dict(lane=r_lane, name_id=r_name, start_ns=r_start, end_ns=r_end, depth=r_depth),
        memory=dict(device=mem_arr[:, 0], ts_ns=mem_arr[:, 1], bytes_delta=mem_arr[:, 2],
                    allocated_bytes=mem_arr[:, 3], reserved_bytes=mem_arr[:, 4]),
        comm=comm, accounting=acc, window_ns=window,
        hostname=doc.host_name or (doc.retimeCapture or {}).get("hostname"),
        capture=doc.retimeCapture,
    )


def _comm_blocks(evs, ev_idx, ops) -> dict[int, int]:
    """Per device: the median launch grid (blocks) of its collective kernels, from their
    ``grid`` args (absent: nothing)."""
    import msgspec

    devs, grids = [], []
    if isinstance(evs, dict):
        for i in np.asarray(ev_idx, np.int64)[np.asarray(ops, np.int64)].tolist():
            a = getattr(evs.get(i), "args", None)
            if a is None or not len(a.grid) or not isinstance(a.device, int):
                continue
            devs.append(a.device)
            grids.append(a.grid)
    try:  # all grids in one call; one of them malformed: one by one, skipping it
        vals = msgspec.json.decode(b"[" + b",".join(grids) + b"]")
    except msgspec.DecodeError:
        vals = []
        for raw in grids:
            try:
                vals.append(msgspec.json.decode(raw))
            except msgspec.DecodeError:
                vals.append(None)
    got: dict[int, list[int]] = {}
    for d, g in zip(devs, vals, strict=True):
        if isinstance(g, list) and g and isinstance(g[0], int) and g[0] > 0:
            got.setdefault(d, []).append(g[0])
    return {d: int(np.median(v)) for d, v in got.items()}


def _gpu_range_lanes(GR, g_uniq, n_g_lanes) -> np.ndarray:
    idx = {k: i for i, k in enumerate(g_uniq)}
    return np.fromiter((idx.get((d, s), -1) for d, s in zip(GR["dev"], GR["stream"])), np.int64,
                       len(GR["dev"]))
