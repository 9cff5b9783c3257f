"""Op tables of a re-laid-out op-level step (:mod:`replay.policies.parallel_oplevel`):
one pipeline replica built op by op, then tiled over the data-parallel ranks, scheduled by the
synthesizer's list scheduler and returned as an op-level Trace (the lanes, optypes, groups and
``meta["oplevel"]`` that :mod:`collectors.oplevel` writes). As in a measured timeline, a
collective member starts at its own ready time and waits inside for the last member, so the
replay graph of the result has no unexplained delay."""

from __future__ import annotations

import numpy as np

from retime.collectors.enums import EdgeKind, LaneKind
from retime.collectors.errors import PolicyError
from retime.collectors.oplevel import LANE_NAMES, OPTYPES
from retime.collectors.trace import StringTable, Trace

__all__: list[str] = []

_ROLE = {name: spec[3] for name, spec in OPTYPES.items()}
_DP_T = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
_P2P_T = ("forward-send", "forward-recv", "backward-send", "backward-recv")


class _Rep:
    """Ops of one pipeline replica (one DP index), in creation order."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("stage", "role", "optype", "dur", "mb",
                                                       "chunk", "ckey", "scope", "peer")}
        self.edges: list[tuple[int, int]] = []

    def add(self, stage: int, optype: str, dur: float, mb: int = -1, chunk: int = -1,
            ckey: tuple | None = None, scope: int = 0, peer: int = -1) -> int:
        c = self.cols
        for k, val in (("stage", stage), ("role", _ROLE[optype]), ("optype", optype),
                       ("dur", dur), ("mb", mb), ("chunk", chunk), ("ckey", ckey),
                       ("scope", scope), ("peer", peer)):
            c[k].append(val)
        return len(c["stage"]) - 1

    def chain(self, ids: list[int]) -> None:
        self.edges.extend(zip(ids[:-1], ids[1:], strict=True))


# collective scopes: 0 none, 1 per replica (p2p, embedding, layernorm), 2 over DP (one stage),
# 3 the whole job (grad-norm all-reduce)
_NONE, _REPLICA, _DPG, _WORLD = range(4)



def _to_trace(rep: _Rep, to: dict, step: int) -> Trace:
    from retime.collectors.synth._kernels import _list_schedule

    p, dp = to["pp"], to["dp"]
    c = rep.cols
    n1 = len(c["stage"])
    st1 = np.asarray(c["stage"], np.int64)
    role1 = np.asarray(c["role"], np.int64)
    order = np.lexsort((np.arange(n1), role1, st1))  # (stage, lane, program order)
    pos = np.empty(n1, np.int64)
    pos[order] = np.arange(n1)
    cols = {k: [c[k][i] for i in order] for k in c}
    e = np.asarray(rep.edges, np.int64).reshape(-1, 2)
    esrc1, edst1 = pos[e[:, 0]], pos[e[:, 1]]
    # collective instances: per-replica keys get one id per DP index, the others are shared
    keys: dict[tuple, int] = {}
    kid = np.full(n1, -1, np.int64)
    scope = np.asarray(cols["scope"], np.int64)
    for i, k in enumerate(cols["ckey"]):
        if k is not None:
            kid[i] = keys.setdefault(k, len(keys))
    nk = len(keys)
    d_idx = np.repeat(np.arange(dp), n1)
    # rank = stage * dp + d (Megatron's order: data-parallel ranks of a stage adjacent)
    rank = np.tile(np.asarray(cols["stage"], np.int64) * dp, dp) + d_idx
    kidt = np.tile(kid, dp)
    coll = np.where(np.tile(scope, dp) == _REPLICA, kidt + nk * d_idx, kidt + nk * dp)
    coll[kidt < 0] = -1
    peer_st = np.tile(np.asarray(cols["peer"], np.int64), dp)
    peer = np.where(peer_st >= 0, peer_st * dp + d_idx, -1)
    # groups (as the op-level reader names them): world, dp:stageS, pp:dpD, embedding:dpD,
    # tp:rankR (layernorm), numbered in that order
    optype = np.asarray(cols["optype"], object)
    stage_t = np.tile(np.asarray(cols["stage"], np.int64), dp)
    optype_t = np.tile(optype, dp)
    cls1 = np.full(n1, -1, np.int64)
    for c_, names_ in enumerate((("optimizer-clip-main-grad",), _DP_T, _P2P_T,
                                 ("embedding-grads-all-reduce",),
                                 ("layernorm-grads-all-reduce",))):
        cls1[np.isin(optype, names_) & (kid >= 0)] = c_
    cls = np.tile(cls1, dp)
    W = p * dp
    base = np.cumsum([0, 1, p, dp, dp])  # first id of world, dp, pp, embedding, tp groups
    sub = np.select([cls == 1, cls == 2, cls == 3, cls == 4], [stage_t, d_idx, d_idx, rank], 0)
    grp = np.where(cls >= 0, base[np.maximum(cls, 0)] + sub, -1).astype(np.int32)
    members = ([list(range(W))] + [[s * dp + x for x in range(dp)] for s in range(p)]
               + [[x * dp + d for x in range(p)] for d in range(dp)]
               + [sorted({d, (p - 1) * dp + d}) for d in range(dp)] + [[r] for r in range(W)])
    gnames = (["world"] + [f"dp:stage{s}" for s in range(p)] + [f"pp:dp{d}" for d in range(dp)]
              + [f"embedding:dp{d}" for d in range(dp)] + [f"tp:rank{r}" for r in range(W)])
    used = np.zeros(len(gnames), bool)
    used[np.unique(grp[grp >= 0])] = True
    dense = np.cumsum(used) - 1  # group ids 0..G-1 in that order
    grp = np.where(grp >= 0, dense[np.maximum(grp, 0)], -1).astype(np.int32)
    groups = [{"group_id": int(dense[i]), "name": gnames[i], "ranks": members[i]}
              for i in np.flatnonzero(used)]
    # lanes (rank, role) in op order; ops are already sorted by (rank, lane, program order)
    role = np.tile(np.asarray(cols["role"], np.int64), dp)
    lane_key = rank * 16 + role
    o = np.lexsort((np.arange(len(rank)), role, rank))
    rank, role, lane_key, coll, peer, grp = (a[o] for a in (rank, role, lane_key, coll, peer,
                                                             grp))
    inv = np.empty(len(o), np.int64)
    inv[o] = np.arange(len(o))
    ukeys, lane = np.unique(lane_key, return_inverse=True)
    shift = np.repeat(np.arange(dp, dtype=np.int64) * n1, len(esrc1))
    src = inv[np.tile(esrc1, dp) + shift]
    dst = inv[np.tile(edst1, dp) + shift]
    dur = np.rint(np.tile(np.asarray(cols["dur"], np.float64), dp)[o]).astype(np.int64)
    start, done = _list_schedule(np.ascontiguousarray(dur), lane.astype(np.int32), len(ukeys),
                                 src, dst, np.zeros(len(src), np.int64), coll)
    if done != len(dur):
        raise PolicyError(f"parallel: the re-laid-out schedule {to['schedule']} has a "
                          f"dependency cycle ({len(dur) - done} ops unscheduled); this layout "
                          "cannot run with Megatron's blocking pipeline transfers")
    # as measured: a collective member starts when it is ready (its own launch) and waits in
    # it for the last member, so the replay model (transfer tail after the last arrival, see
    # replay.graph) finds no unexplained delay in the table
    end = start + dur
    ready = np.zeros(len(dur), np.int64)
    np.maximum.at(ready, dst, end[src])
    same = np.flatnonzero(lane[1:] == lane[:-1]) + 1
    ready[same] = np.maximum(ready[same], end[same - 1])
    mem = coll >= 0
    start[mem] = ready[mem]
    dur[mem] = end[mem] - start[mem]
    strings = StringTable()
    u, ui = np.unique(optype_t[o].astype(str), return_inverse=True)
    spec = np.array([[int(x) for x in OPTYPES[n][:3]] for n in u], np.int64)[ui]
    tile = {k: np.tile(np.asarray(cols[k], np.int64), dp)[o] for k in ("mb", "chunk")}
    ops = {"op_id": np.arange(len(o), dtype=np.int64), "rank": rank.astype(np.int32),
           "lane": lane.astype(np.int32), "kind": spec[:, 0].astype(np.int8),
           "name_id": np.array([strings.intern(n) for n in u], np.int32)[ui],
           "start_ns": start, "dur_ns": dur, "step": np.full(len(o), step, np.int32),
           "phase": spec[:, 2].astype(np.int8), "microbatch": tile["mb"].astype(np.int32),
           "stage": stage_t[o].astype(np.int16), "chunk": tile["chunk"].astype(np.int16),
           "coll_id": coll, "comm_op": spec[:, 1].astype(np.int8), "group_id": grp,
           "peer": peer.astype(np.int32)}
    lrank, lrole = ukeys // 16, ukeys % 16
    lanes = {"lane": np.arange(len(ukeys), dtype=np.int32), "rank": lrank.astype(np.int32),
             "device": lrank.astype(np.int32),
             "lane_kind": np.full(len(ukeys), int(LaneKind.OP_STREAM)),
             "native_id": lrole, "name": [LANE_NAMES[r] for r in lrole]}
    counts = {str(n): int(k) for n, k in zip(u, np.bincount(ui, minlength=len(u)), strict=True)}
    n_coll = len(np.unique(coll[coll >= 0]))
    colls = {"matched": n_coll, "unmatched": 0, "unmatched_reasons": {},
             "ops_matched": int((coll >= 0).sum()), "ops_unmatched": 0, "p2p_noops": 0}
    meta = {"source_format": "oplevel", "sources": [], "world_size": p * dp, "devices": {},
            "collectives": colls,
            "accounting": {"relayout": {"events_read": 0, "kept": counts,
                                        "dropped": {}}},
            "oplevel": {"ranks": [{"rank": s * dp + d, "dp_rank": d, "stage": s}
                                  for s in range(p) for d in range(dp)],
                        "steps": [step], "step_offsets_ns": {str(step): 0},
                        "layout": {k: to[k] for k in ("dp", "pp", "tp", "cp", "chunks",
                                                      "microbatches", "schedule")}
                        | {"schedule_match": 1.0}}}
    return Trace.build(ops=ops, lanes=lanes, strings=strings,
                       edges={"src": src, "dst": dst,
                              "kind": np.full(len(src), int(EdgeKind.DATA), np.int8),
                              "lag_ns": np.zeros(len(src), np.int64)},
                       groups=groups, meta=meta)
