"""``parallel.dp`` (and ``topology.ranks_per_node``) on a measured data-parallel trace.

The most common question asked of a measured run is "what with more (or fewer) data-parallel
ranks?". With a fixed per-rank batch a DDP rank does the same work whatever the number of
ranks; what changes is the gradient all-reduce (group size, which links it crosses) and, where
ranks share a host's cores, the compute. :func:`relayout_dp` builds the new job from the
measured ranks:

* rank ``r`` of the new job runs the measured rank ``r mod n``'s ops (its stragglers carried
  over: a slow measured rank stays slow in every copy), with the same dependencies;
* every collective instance keeps its id and gets all new ranks as members (a pure DP trace:
  every collective spans the whole job; traces with other groups are refused);
* placement: rank ``r`` lives on node ``r // ranks_per_node`` (the scenario's, else the
  measured ranks per host);
* ``Network`` then re-times each collective member against its template op in the measured
  trace (``state.notes["template"]``): the alpha-beta model calibrated on the measured
  collectives at the measured group size and level, evaluated at the new group size and
  level (a ring all-reduce moves ``2 (n - 1) / n`` of the bytes per rank);
* host cores (CPU training, gloo): when the capture recorded each rank's CPU set
  (``meta["cpu_affinity"]``), a host keeps the cores its measured ranks had, and its new
  ranks get shares of them (:func:`host_cpu.share_cores`: disjoint while there is a core per
  rank, else round-robin; ``meta["cpu_affinity"]`` of the new job): ranks on one core
  time-share it (:func:`shared_core_contention` replays them on the contention path).

What it does not model: a per-rank batch change (``parallel.micro_batch``), other
parallelism (TP/PP groups), and the data loader.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

from .base import ranks_per_node_of
from .host_cpu import share_cores

__all__ = ["relayout_dp", "host_cores"]


def _check_pure_dp(trace: Trace) -> np.ndarray:
    o = trace.ops
    ranks = np.unique(o["rank"].to_numpy())
    world = int(trace.meta.get("world_size") or len(ranks))
    if len(ranks) != world or not np.array_equal(ranks, np.arange(world)):
        raise PolicyError(
            f"parallel.dp on a measured trace needs every rank of the job traced (this trace "
            f"has ranks {ranks.tolist()[:8]}{' ...' if len(ranks) > 8 else ''} of world size "
            f"{world}); capture all ranks, or synthesize the job (`retime synth`)")
    kind = o["kind"].to_numpy()
    if (kind == OpKind.P2P).any():
        raise PolicyError("parallel.dp on a measured trace: the trace has point-to-point "
                          "transfers (pipeline parallelism); only pure data-parallel traces "
                          "can change their number of ranks")
    comm = np.flatnonzero(kind == OpKind.COLLECTIVE)
    if len(comm) == 0:
        raise PolicyError("parallel.dp on a measured trace: the trace has no collectives "
                          "(gradient all-reduces) to re-time; is it a data-parallel job?")
    groups = {int(g): set(map(int, r)) for g, r in
              zip(trace.groups["group_id"].to_numpy(), trace.groups["ranks"], strict=True)} \
        if len(trace.groups) else {}
    gid = o["group_id"].to_numpy()[comm]
    full = set(range(world))
    for g in np.unique(gid).tolist():
        rs = groups.get(int(g))
        if rs is not None and rs != full:
            raise PolicyError(
                f"parallel.dp on a measured trace: process group {g} spans ranks "
                f"{sorted(rs)[:8]}, not the whole job (tensor/pipeline parallel groups); only "
                "pure data-parallel traces can change their number of ranks")
    coll = o["coll_id"].to_numpy()[comm]
    if (coll < 0).any():
        raise PolicyError("parallel.dp on a measured trace: some collectives are not matched "
                          "across ranks (see `retime info`); every rank of every all-reduce "
                          "must be in the trace")
    return ranks


def host_cores(trace: Trace) -> dict[str, list[int]] | None:
    """Host -> the CPUs its measured ranks could run on (union of their ``cpu_affinity``),
    or None when the capture did not record them."""
    aff = trace.meta.get("cpu_affinity")
    hosts = trace.meta.get("hostnames")
    if not isinstance(aff, dict) or not isinstance(hosts, dict):
        return None
    out: dict[str, set[int]] = {}
    for r, cpus in aff.items():
        h = hosts.get(str(r))
        if h is None:
            return None
        out.setdefault(h, set()).update(int(c) for c in cpus)
    return {h: sorted(c) for h, c in out.items()}


def relayout_dp(trace: Trace, dp: int, ranks_per_node: int | None = None
                ) -> tuple[Trace, dict[str, Any], np.ndarray]:
    """The measured DP job with ``dp`` ranks (module docstring). Returns the new trace, a
    description, and per new op the measured op it copies (op-id order)."""
    ranks = _check_pure_dp(trace)
    n = len(ranks)
    dp = int(dp)
    rpn_meas = ranks_per_node_of(trace)
    rpn = int(ranks_per_node or min(rpn_meas, dp))
    o, lanes = trace.ops, trace.lanes
    rank = o["rank"].to_numpy()
    order = np.argsort(rank, kind="stable")
    first = np.searchsorted(rank[order], np.arange(n + 1))
    lane_rank = lanes["rank"].to_numpy()
    parts, lane_parts, tmpl = [], [], []
    lane_map: dict[tuple[int, int], int] = {}
    new_op_of: list[np.ndarray] = []  # per new rank: old op id -> new id (template rank's ops)
    nxt_op, nxt_lane = 0, 0
    for r in range(dp):
        t = r % n
        ids = order[first[t]:first[t + 1]]
        ids = ids[np.argsort(ids, kind="stable")]
        lr = lanes[lane_rank == t]
        for ln in lr["lane"].to_numpy().tolist():
            lane_map[(r, int(ln))] = nxt_lane
            nxt_lane += 1
        nl = lr.copy()
        nl["rank"] = np.int32(r)
        nl["lane"] = np.asarray([lane_map[(r, int(x))] for x in lr["lane"].to_numpy()],
                                nl["lane"].dtype)
        lane_parts.append(nl)
        p = o.iloc[ids].copy()
        p["rank"] = np.int32(r)
        p["lane"] = np.asarray([lane_map[(r, int(x))] for x in p["lane"].to_numpy()],
                               p["lane"].dtype)
        p["op_id"] = np.arange(nxt_op, nxt_op + len(ids), dtype=np.int64)
        m = np.full(len(o), -1, np.int64)
        m[ids] = p["op_id"].to_numpy()
        new_op_of.append(m)
        parts.append(p)
        tmpl.append(ids)
        nxt_op += len(ids)
    ops = pd.concat(parts, ignore_index=True)
    template = np.concatenate(tmpl).astype(np.int64)
    e = trace.edges
    es, ed = e["src"].to_numpy(), e["dst"].to_numpy()
    intra = rank[es] == rank[ed]  # cross-rank edges (none in DP traces) are dropped
    eparts = []
    for r in range(dp):
        t = r % n
        sel = intra & (rank[es] == t)
        m = new_op_of[r]
        eparts.append(pd.DataFrame({"src": m[es[sel]], "dst": m[ed[sel]],
                                    "kind": e["kind"].to_numpy()[sel],
                                    "lag_ns": e["lag_ns"].to_numpy()[sel]}))
    edges = pd.concat(eparts, ignore_index=True)

    def per_rank(df: pd.DataFrame, has_lane: bool) -> pd.DataFrame:
        if len(df) == 0:
            return df
        rr = df["rank"].to_numpy()
        out = []
        for r in range(dp):
            x = df[rr == r % n].copy()
            x["rank"] = np.asarray(r, df["rank"].dtype)
            if has_lane:
                x["lane"] = np.asarray([lane_map[(r, int(v))] for v in x["lane"].to_numpy()],
                                       x["lane"].dtype)
            out.append(x)
        return pd.concat(out, ignore_index=True)

    ranges = per_rank(trace.ranges, True)
    memory = per_rank(trace.memory, False)
    groups = trace.groups.copy()
    if len(groups):
        groups["ranks"] = [list(range(dp)) for _ in range(len(groups))]
    meta = dict(trace.meta)
    meta["world_size"] = dp
    meta["hostnames"] = {str(r): f"node{r // rpn}" for r in range(dp)}
    cores = host_cores(trace)
    if cores:
        c = int(np.median([len(v) for v in cores.values()]))
        share = share_cores(rpn, c)  # each node's ranks on its c cores
        meta["cpu_affinity"] = {str(r): [(r // rpn) * 4096 + x for x in share[r % rpn]]
                                for r in range(dp)}
        meta["cores_per_host"] = c
    for k in ("sources", "windows_ns", "capture", "clock_offsets_ns"):
        meta.pop(k, None)
    new = Trace(ops=ops, lanes=pd.concat(lane_parts, ignore_index=True), edges=edges,
                ranges=ranges, groups=groups, memory=memory, strings=list(trace.strings),
                meta=meta)
    info = {"from": {"dp": n, "ranks_per_node": rpn_meas},
            "to": {"dp": dp, "ranks_per_node": rpn},
            "template": f"rank r runs measured rank r mod {n}",
            "cores_per_host": meta.get("cores_per_host")}
    return new, info, template


def cpu_only(trace: Trace) -> bool:
    """Whether every lane of the trace is a host thread (CPU training, gloo)."""
    return bool(len(trace.lanes)) and bool(
        (trace.lanes["lane_kind"].to_numpy() == LaneKind.CPU_THREAD).all())


def _core_load(trace: Trace) -> dict[int, float] | None:
    """Rank -> how many ranks share each of its cores: the ranks of its host whose CPU sets
    overlap its own, over its number of CPUs (at least 1: a rank's training thread uses one
    core at a time). None without ``meta["cpu_affinity"]``."""
    aff = trace.meta.get("cpu_affinity")
    hosts = trace.meta.get("hostnames")
    if not isinstance(aff, dict) or not isinstance(hosts, dict):
        return None
    sets = {int(r): set(map(int, c)) for r, c in aff.items()}
    out = {}
    for r, s in sets.items():
        h = hosts.get(str(r))
        m = sum(1 for q, t in sets.items() if hosts.get(str(q)) == h and s & t)
        out[r] = max(1.0, m / max(len(s), 1))
    return out


def shared_core_factor(orig: Trace, new: Trace, template: np.ndarray) -> np.ndarray | None:
    """Per op of the re-laid-out CPU job: how much longer its rank's host work takes because
    more (or fewer) ranks share its cores than in the measurement (time-sharing: ``k`` busy
    ranks on a core each get ``1/k`` of it; ranks of a DP job compute at the same time), or
    None when the job runs on GPUs or the capture did not record CPU sets."""
    if not cpu_only(orig):
        return None
    k_old, k_new = _core_load(orig), _core_load(new)
    if not k_old or not k_new:
        return None
    r_new = new.ops["rank"].to_numpy()
    r_old = orig.ops["rank"].to_numpy()[template]
    kn = np.asarray([k_new.get(int(r), 1.0) for r in range(int(r_new.max()) + 1)])
    ko = np.asarray([k_old.get(int(r), 1.0) for r in range(int(r_old.max()) + 1)])
    f = kn[r_new] / ko[r_old]
    return None if np.allclose(f, 1.0) else f
