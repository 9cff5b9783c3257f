"""Rank layout of a synthesized step: lanes, process groups, and the expansion of the
representative ranks (one per pipeline stage) to every rank of the job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ..enums import LaneKind, OpKind
from ..trace import StringTable, Trace
from .parallel import ParallelConfig

__all__ = ["LANES", "expand_ranks", "group_table", "no_hugepages"]

#: local lanes of every rank, in lane-id order (lane id = rank * len(LANES) + index)
LANES = ("compute", "tp", "cp", "dp", "pp_send", "pp_recv", "ep")
_LANE = {n: i for i, n in enumerate(LANES)}
#: ``gkind`` of ops whose group is not implied by their lane: the tied-embedding group
#: (first and last pipeline stage of one replica) and the expert-data-parallel group (ranks
#: holding the same experts: expert gradients, expert ZeRO gathers)
_EMB = 4
_EDP = 6
#: the model-parallel group of one replica (every stage and tensor rank): the optimizer's
#: global gradient-norm all-reduce
_MP = 7


@contextmanager
def no_hugepages() -> Iterator[None]:
    """Turn off numpy's ``madvise(MADV_HUGEPAGE)`` on large arrays while building a trace.

    Why: the trace's columns are written once, and on hosts whose transparent huge pages
    use direct compaction the first touch of fresh huge pages stalls for seconds (measured
    2.6 s instead of 6-10 s for a 9.5 M-op, 1,024-GPU step on a busy 2-core machine). The
    previous setting is restored on exit.
    """
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy < 2 or a build without it
        try:
            from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore
        except ImportError:
            yield
            return
    prev = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(prev)

_CLASS_OF_LANE = {0: "compute", 1: "tp_comm", 2: "cp_comm", 3: "dp_comm", 4: "pp_send",
                  5: "pp_recv", 6: "ep_comm"}


def group_table(parallel: ParallelConfig, embedding: bool = False, model_parallel: bool = False
                ) -> tuple[list[dict], dict[str, int]]:
    """Process groups of the layout and the group-id offset of each kind."""
    P = parallel
    W = P.world_size
    ranks = np.arange(W).reshape(P.pp, P.dp, P.cp, P.tp)
    G = P.dp // P.ep
    r5 = ranks.reshape(P.pp, G, P.ep, P.cp, P.tp)
    rows: list[dict] = []
    offsets: dict[str, int] = {}
    kinds = (("tp", ranks.reshape(-1, P.tp)),
             ("cp", ranks.transpose(0, 1, 3, 2).reshape(-1, P.cp)),
             ("dp", ranks.transpose(0, 3, 1, 2).reshape(-1, P.dp * P.cp)),
             ("pp", ranks.transpose(1, 2, 3, 0).reshape(-1, P.pp)),
             ("ep", r5.transpose(0, 1, 3, 4, 2).reshape(-1, P.ep)),
             ("edp", r5.transpose(0, 2, 4, 1, 3).reshape(-1, G * P.cp)))
    if embedding and P.pp > 1:  # first and last stage of each replica
        pp_mat = ranks.transpose(1, 2, 3, 0).reshape(-1, P.pp)
        kinds += (("emb", pp_mat[:, [0, P.pp - 1]]),)
    if model_parallel:  # every stage and tensor rank of each replica
        kinds += (("mp", ranks.transpose(1, 2, 0, 3).reshape(-1, P.pp * P.tp)),)
    for kind, mat in kinds:
        offsets[kind] = len(rows)
        if mat.shape[1] <= 1:
            continue
        for i, row in enumerate(mat):
            rows.append({"group_id": len(rows), "name": f"{kind}{i}", "ranks": row.tolist()})
    return rows, offsets


def _bcast(rep_col: np.ndarray, K: int) -> np.ndarray:
    """``np.tile(rep_col, K)`` as one block copy."""
    return np.broadcast_to(rep_col, (K, len(rep_col))).reshape(-1)


def expand_ranks(rep: dict[str, np.ndarray], src: np.ndarray, dst: np.ndarray,
                 kinds: np.ndarray, parallel: ParallelConfig, strings: StringTable, step: int,
                 expand: str, max_ops: int, meta: dict | None) -> Trace:
    """Copy the representative ranks' scheduled ops to every rank of their stage.

    ``rep`` holds the op columns of one rank per pipeline stage (ranks ``stage * R`` with
    ``R = dp * cp * tp``), ``src/dst/kinds`` their edges. Replica ``k`` of stage ``s`` is rank
    ``s * R + k``; its ops get their own lanes, ``coll_id`` (shared by the members of each
    group instance), ``group_id`` and ``peer``. Ops are written replica-major, so the first
    ``len(rep)`` rows are the representatives.
    """
    P = parallel
    W = P.world_size
    R = P.dp * P.cp * P.tp
    N = len(rep["dur_ns"])
    if expand == "auto":
        expand = "all" if N * R <= max_ops else "unique"
    ks = np.arange(R, dtype=np.int64) if expand == "all" else np.zeros(1, np.int64)
    K = len(ks)
    stage = rep["stage"].astype(np.int64)
    lane_local = rep["lane"].astype(np.int64)
    emb = rep["gkind"] == _EMB
    mp = rep["gkind"] == _MP
    groups, goff = group_table(P, embedding=bool(emb.any()), model_parallel=bool(mp.any()))
    # replica index k = (d * cp + c) * tp + t; rank = stage * R + k
    t_k = ks % P.tp
    c_k = (ks // P.tp) % P.cp
    d_k = ks // (P.tp * P.cp)
    rank2 = (stage.astype(np.int32)[None, :] * np.int32(R)
             + ks.astype(np.int32)[:, None])  # [K, N]
    # lane class -> per-replica additive part of coll key and group id
    cls = np.zeros(N, np.int64)  # 0 none, 1 tp, 2 cp, 3 dp, 4 emb, 5 ep, 6 edp
    cls[lane_local == _LANE["tp"]] = 1
    cls[lane_local == _LANE["cp"]] = 2
    cls[lane_local == _LANE["dp"]] = 3
    cls[lane_local == _LANE["ep"]] = 5
    cls[emb] = _EMB
    cls[rep["gkind"] == _EDP] = _EDP
    cls[mp] = _MP
    G = P.dp // P.ep
    e_k = d_k % P.ep
    g_k = d_k // P.ep
    zero_k = np.zeros(K, np.int64)
    key_k = np.stack([zero_k, ks - t_k, ks - c_k * P.tp, t_k, ks,
                      ks - e_k * P.cp * P.tp, e_k * P.tp + t_k, ks - t_k], axis=1)  # [K, 8]
    gid_k = np.stack([zero_k, ks // P.tp, d_k * P.tp + t_k, t_k, ks,
                      (g_k * P.cp + c_k) * P.tp + t_k, e_k * P.tp + t_k, ks // P.tp], axis=1)
    gid_base = np.select([cls == 1, cls == 2, cls == 3, cls == _EMB, cls == 5, cls == _EDP,
                          cls == _MP],
                         [goff["tp"] + stage * (R // P.tp),
                          goff["cp"] + stage * (P.dp * P.tp),
                          goff["dp"] + stage * P.tp,
                          np.full(N, goff.get("emb", 0)),
                          goff["ep"] + stage * (G * P.cp * P.tp),
                          goff["edp"] + stage * (P.ep * P.tp),
                          np.full(N, goff.get("mp", 0))], -1)
    is_coll = rep["kind"] == int(OpKind.COLLECTIVE)
    j = np.cumsum(is_coll) - 1
    coll_base = np.where(is_coll & (cls > 0), j * W + stage * R, -1)
    for cross in (emb, mp):  # members on several stages share the first one's instance
        if cross.any():
            ei = np.flatnonzero(cross)
            coll_base[ei] = j[ei[0]] * W
    # only communication ops carry coll_id / group_id / peer: fill those columns sparsely
    coll_id = np.full((K, N), -1, np.int64)
    ci = np.flatnonzero(coll_base >= 0)
    coll_id[:, ci] = coll_base[ci][None, :] + key_k[:, cls[ci]]
    # a pipeline send and its receive (same replica k, two stages) share one instance, after
    # every collective's ids
    pair = rep.get("p2p_pair")
    if pair is not None:
        pi = np.flatnonzero(pair >= 0)
        coll_id[:, pi] = (int(is_coll.sum()) * W + pair[pi] * R)[None, :] + ks[:, None]
    group_id = np.full((K, N), -1, np.int32)
    gi = np.flatnonzero(gid_base >= 0)
    group_id[:, gi] = gid_base[gi][None, :] + gid_k[:, cls[gi]]
    pst = rep["peer_stage"].astype(np.int64)
    pi = np.flatnonzero(pst >= 0)
    peer = np.full((K, N), -1, np.int32)
    if len(pi):
        peer[:, pi] = pst[pi][None, :] * R + ks[:, None]
        group_id[:, pi] = goff["pp"] + ks[:, None]
    lane2 = rank2 * np.int32(len(LANES))
    lane2 += lane_local.astype(np.int32)[None, :]
    ops = {
        "rank": rank2.reshape(-1),
        "lane": lane2.reshape(-1),
        "kind": _bcast(rep["kind"], K),
        "name_id": _bcast(rep["name_id"], K),
        "start_ns": _bcast(rep["start_ns"], K),
        "dur_ns": _bcast(rep["dur_ns"], K),
        "step": np.full(N * K, step, np.int32),
        "phase": _bcast(rep["phase"], K),
        "layer": _bcast(rep["layer"], K),
        "microbatch": _bcast(rep["microbatch"], K),
        "stage": _bcast(rep["stage"], K),
        "chunk": _bcast(rep["chunk"], K),
        "coll_id": coll_id.reshape(-1),
        "comm_op": _bcast(rep["comm_op"], K),
        "bytes": _bcast(rep["bytes"], K),
        "group_id": group_id.reshape(-1),
        "peer": peer.reshape(-1),
        "flops": _bcast(rep["flops"], K),
    }
    off = (ks * N)[:, None]
    edges = {"src": (src[None, :] + off).reshape(-1), "dst": (dst[None, :] + off).reshape(-1),
             "kind": _bcast(kinds, K)}
    # lanes: every rank gets the lanes its stage uses
    used = np.zeros((P.pp, len(LANES)), bool)
    used[stage, lane_local] = True
    lane_rank = (np.arange(P.pp)[:, None] * R + ks[None, :])  # [pp, K]
    lr_l, ll_l = [], []
    for s_ in range(P.pp):
        li = np.flatnonzero(used[s_])
        lr_l.append(np.repeat(lane_rank[s_], len(li)))
        ll_l.append(np.tile(li, K))
    lr_a = np.concatenate(lr_l)
    ll_a = np.concatenate(ll_l)
    lane_names = np.asarray([f"{n} stream" for n in LANES], dtype=object)
    lanes = {"lane": (lr_a * len(LANES) + ll_a).astype(np.int32), "rank": lr_a.astype(np.int32),
             "device": lr_a.astype(np.int32),
             "lane_kind": np.full(len(lr_a), int(LaneKind.GPU_STREAM), np.int8),
             "native_id": ll_a.astype(np.int64),
             "name": lane_names[ll_a]}
    ranks_emitted = lane_rank.reshape(-1)
    # per-class busy time of each stage's representative rank
    end = rep["start_ns"] + rep["dur_ns"]
    # the step: the longest rank's span (first start to last end), as the replay engine
    # counts it: in steady state each rank starts its next step when it ends this one
    step_ns = 0
    if N:
        lo = np.full(P.pp, np.iinfo(np.int64).max, np.int64)
        hi = np.full(P.pp, np.iinfo(np.int64).min, np.int64)
        np.minimum.at(lo, stage, rep["start_ns"])
        np.maximum.at(hi, stage, end)
        used = hi >= lo
        step_ns = int((hi[used] - lo[used]).max())
    classes: dict[str, list[int]] = {}
    for li, cname in _CLASS_OF_LANE.items():
        sel = rep["lane"] == li
        if sel.any():
            classes[cname] = np.bincount(stage[sel], weights=rep["dur_ns"][sel],
                                         minlength=P.pp).astype(np.int64).tolist()
    names = np.asarray(strings.names, dtype=object)
    by_name: dict[str, int] = {}
    s0 = stage == 0
    if s0.any():
        tot = np.bincount(rep["name_id"][s0], weights=rep["dur_ns"][s0], minlength=len(names))
        by_name = {str(names[i]): int(tot[i]) for i in np.flatnonzero(tot)}
    busy = classes.get("compute", [0] * P.pp)
    synth = {
        "step_time_ns": step_ns,
        "world_size": W,
        "parallel": P.to_dict(),
        "expand": expand,
        "ranks_emitted": int(len(ranks_emitted)),
        "rank_classes": [{"stage": s, "representative": s * R,
                          "ranks": [s * R, (s + 1) * R - 1]} for s in range(P.pp)],
        "op_class_ns": classes,
        "op_name_ns_stage0": by_name,
        "compute_idle_fraction": [1.0 - b / step_ns if step_ns else 0.0 for b in busy],
        "ops_per_rank": np.bincount(stage, minlength=P.pp).tolist(),
        # ops are replica-major: the first ``ops_per_replica`` rows are the representatives
        "ops_per_replica": int(N),
        "flops_per_step": float(np.nansum(rep["flops"][lane_local == _LANE["compute"]]) * R),
    }
    synth.update(meta or {})
    size_of_cls = np.array([1, P.tp, P.cp, P.dp * P.cp, 2, P.ep, G * P.cp, P.pp * P.tp])
    inst = (K // size_of_cls[cls[coll_base >= 0]]) if expand == "all" else np.ones(1)
    n_coll = int(inst.sum()) if expand == "all" else int(np.count_nonzero(coll_base >= 0))
    if pair is not None and (pair >= 0).any():  # send/receive pairs: one instance per replica
        n_coll += (int(pair.max()) + 1) * K
    m = {"source_format": "synth", "world_size": W, "synth": synth,
         "accounting": {"synth": {"events_read": 0, "kept": {"ops": int(N * K)}, "dropped": {}}},
         "collectives": {"matched": n_coll, "unmatched": 0}}
    # the layout is valid by construction (tests validate it); skip the O(N) checks on big
    # traces, where they would cost as much as building the trace
    return Trace.build(ops=ops, lanes=lanes, strings=strings, edges=edges, groups=groups or None,
                       meta=m, validate=N * K <= 2_000_000)
