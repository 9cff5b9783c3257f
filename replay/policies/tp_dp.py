"""Data-parallel gradient all-reduces under ``parallel.tp`` on a measured trace.

* :func:`dp_buckets`: DDP buckets that hold exactly the gradients of the linear layers the TP
  layout splits (:func:`.tp_measured.tp_layout`): at TP=t they hold 1/t of the split layers'
  weights (a row layer's whole bias) and lose the NCCL model's saving on the smaller message.
* ``parallel.dp`` with ``parallel.tp`` (:func:`same_gpus_dp`): Megatron's "same GPUs, fewer
  replicas" -- ``tp x dp`` equal to the trace's ranks, each replica a TP group of ``t`` GPUs
  with the per-replica batch unchanged (the global batch drops by ``t``); every gradient
  all-reduce is re-priced by the NCCL model for ``dp`` ranks instead of the trace's, never
  below the measured time x the model's ratio (a wait for peers inside it is kept). Other
  collectives (all-to-all, broadcasts) keep their measured time (said in the line).
"""

from __future__ import annotations

import numpy as np

from retime.collectors.enums import CommOp, OpKind, Phase
from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

from .base import WhatIfState

__all__ = ["dp_buckets", "same_gpus_dp", "resize_dp"]


def _params(L: dict, t: int) -> tuple[int, int]:
    """(gradient elements of linear layer ``L`` per rank at TP=1, at TP=``t``): a column
    layer holds 1/t of its weight and bias, a row layer 1/t of its weight and the whole
    bias (Megatron adds it after the all-reduce), a replicated one all of both."""
    w, b = L["k"] * L["n"], L["n"] if L["bias"] else 0
    if L["kind"] == "column":
        return w + b, (w + b) // t
    if L["kind"] == "row":
        return w + b, w // t + b
    return w + b, w + b


def dp_buckets(trace: Trace, lay) -> list[tuple[int, int, int]]:
    """Data-parallel gradient all-reduces whose bytes are exactly the gradients of linear
    layers of :func:`.tp_measured.tp_layout` (``lay``), in DDP's order (buckets fill in reverse order of the
    layers' registration, here their forward order): ``(op id, bytes at TP=1, bytes at
    TP=t)`` per such bucket. A bucket holding anything else (a convolution's, an
    embedding's parameters) stops the match on its rank: its and the later buckets keep
    their bytes (an empty list when none matches)."""
    o = trace.ops
    kind, rank = o["kind"].to_numpy(), o["rank"].to_numpy()
    ar = np.flatnonzero((kind == OpKind.COLLECTIVE) & (o["comm_op"].to_numpy()
                                                       == int(CommOp.ALL_REDUCE))
                        & (o["phase"].to_numpy() == Phase.BWD))
    nbytes, st = o["bytes"].to_numpy(), o["start_ns"].to_numpy()
    out = []
    for r in np.unique(rank[ar]).tolist():
        mine = [L for L in lay.layers if L["rank"] == r][::-1]
        ids = ar[rank[ar] == r]
        ids = ids[np.argsort(st[ids], kind="stable")]
        i = 0
        for op in ids.tolist():
            want, old, new, j = int(nbytes[op]), 0, 0, i
            while j < len(mine) and old < want:
                a, b = _params(mine[j], lay.t)
                old, new, j = old + a * mine[j]["es"], new + b * mine[j]["es"], j + 1
            if old == want:
                out.append((op, want, new))
                i = j
            elif i < len(mine) and _params(mine[i], lay.t)[0] * mine[i]["es"] > want:
                continue  # smaller than the next layer's gradient: another tensor's
            else:
                break
    return out


def _world(trace: Trace) -> int:
    return max(int(trace.meta.get("world_size") or 0) if isinstance(trace.meta, dict) else 0,
               int(trace.ops["rank"].max()) + 1)


def same_gpus_dp(trace: Trace, t: int, dp: int) -> int:
    """``dp`` checked for ``parallel.tp=t`` on the same GPUs: ``t x dp`` must be the trace's
    ranks (PolicyError, one line, otherwise)."""
    world = _world(trace)
    if int(dp) * int(t) != world:
        raise PolicyError(
            f"parallel.tp={t} with parallel.dp={dp} on a measured trace: the same GPUs means "
            f"tp x dp = the trace's {world} ranks; set parallel.dp={world // t}"
            + ("" if world % t == 0 else f" (and a tp dividing {world})")
            + ", or leave parallel.dp out (each rank becomes a TP group: more GPUs)")
    return int(dp)


def resize_dp(state: WhatIfState, lay, cost_bound: str | None) -> dict:
    """Re-time the gradient all-reduces at TP=t (module docstring): matched buckets on their
    smaller message, and with ``state.notes["tp_dp"]`` every one for the smaller group;
    each the measured time less the model's saving, never below measured x model ratio."""
    from .base import ranks_per_node_of
    from .nccl_trace import NcclPricer, kernel_choice, measured_channels, trace_cluster
    tr = state.trace
    t = lay.t
    dp = state.notes.get("tp_dp")
    b = dp_buckets(tr, lay)
    o = tr.ops
    ar = np.flatnonzero((o["kind"].to_numpy() == OpKind.COLLECTIVE)
                        & (o["comm_op"].to_numpy() == int(CommOp.ALL_REDUCE))
                        & (o["phase"].to_numpy() == Phase.BWD))
    if not b and (dp is None or not len(ar)):
        why = ("no gradient all-reduce in the trace" if not len(ar) else
               "none of its all-reduces holds exactly the linear layers' gradients")
        return {"buckets": 0, "old": 0, "new": 0, "saved_ns": 0, "dp_ranks": dp,
                "line": f"parallel.tp={t}: data-parallel collectives keep their measured "
                        f"times ({why}: the split layers' gradients, 1/{t} per rank after the "
                        "change, cannot be placed in them)"}
    world = _world(tr)
    n_new = int(dp) if dp is not None else world
    new_of = {op: (old, new) for op, old, new in b}
    nbytes = o["bytes"].to_numpy()
    todo = ar if dp is not None else np.asarray([x[0] for x in b], np.int64)
    rpn = ranks_per_node_of(tr, state.ranks_per_node)
    cluster, src = trace_cluster(tr, ranks_per_node=rpn, world=world)
    pricer = NcclPricer(cluster, forced=kernel_choice(tr.names()[todo]), bound=cost_bound,
                        channels=measured_channels(tr))
    d = state.dur
    saved = 0.0
    for op in todo.tolist():
        old, new = new_of.get(op, (int(nbytes[op]), int(nbytes[op])))
        m_old = pricer.time_ns(int(CommOp.ALL_REDUCE), old, world)
        m_new = pricer.time_ns(int(CommOp.ALL_REDUCE), new, n_new)
        if m_old <= 0:
            continue
        x = max(d[op] - (m_old - m_new), d[op] * m_new / m_old)
        saved += d[op] - x
        d[op] = x
    o_b, n_b = sum(x[1] for x in b), sum(x[2] for x in b)
    group = (f"each re-timed by the NCCL model's saving for {world} ranks on the trace's "
             f"fabric ({src['platform']}; the data-parallel group assumed to keep it at {t}x "
             "the GPUs)" if dp is None else
             f"and all {len(todo)} gradient all-reduce(s) re-timed by the NCCL model from "
             f"{world} to {n_new} ranks on the trace's fabric ({src['platform']}): the same "
             f"{world} GPUs as {n_new} replicas of a {t}-GPU TP group, each replica's batch "
             f"unchanged (the global batch / {t}); other collectives keep their measured "
             "times")
    return {"buckets": len(b), "old": o_b, "new": n_b, "saved_ns": round(saved),
            "dp_ranks": dp,
            "line": f"parallel.tp={t}: {len(b)} data-parallel gradient all-reduce(s) hold "
                    "exactly the linear layers' gradients (DDP's buckets, in reverse layer "
                    f"order): {o_b / 1e6:.3g} -> {n_b / 1e6:.3g} MB (column layers keep 1/{t} "
                    f"of weight and bias, row layers 1/{t} of the weight and the whole bias), "
                    f"{group}: {saved / 1e6:.3g} ms saved over the ranks"}
