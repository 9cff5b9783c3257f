"""``parallel.tp`` on a CPU run (gloo): re-timing the split host GEMMs and pricing the TP
all-reduces from a calibration (:mod:`.tp_measured` builds the layout).

On a CPU trace a GEMM's (or an attention core's) compute is not an op: Kineto records the
operator as a range around a few leaf ops (``aten::empty``, ``aten::resolve_conj``), and
the work lies in the host gaps between them and after the last (the replay graph's lane and
``HOST_ORDER`` lags). Here:

* **the split calls' compute**: the part of every host gap (lane lag and ``HOST_ORDER``
  lag, measured end of one op to start of the next on the same lane) that lies inside a
  split call's span, outside the operators nested in it (``aten::transpose``,
  ``aten::expand``: dispatch), shrinks to ``1/t`` of it: flat, there is no CPU GEMM efficiency model
  (the range's optimistic end; small GEMMs gain less on a real CPU). The leaf ops inside
  keep their time (dispatch and allocation run whole on every TP rank);
* **the TP all-reduces**: gloo on the ranks' host, priced from a calibration of this
  machine (``retime calibrate -n t``, ``retime replay --calibration FILE``: its all-reduce
  sweep's alpha-beta fit, :func:`.cluster_cal.sweep_fit`) as ``alpha + 2 (t-1)/t bytes /
  busbw``, added after the call that feeds each (its last leaf op), blocking the thread as
  Megatron's all-reduce does. Without a calibration of ``t`` ranks the what-if is refused
  (a TP=1 trace holds no collective to price gloo by).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from retime.collectors.enums import EdgeKind, OpKind, Phase
from retime.collectors.errors import PolicyError

from .base import WhatIfState

__all__ = ["scale_tp_cpu"]


def _price(state: WhatIfState, t: int) -> tuple[float, float, str]:
    """(alpha ns, bus bandwidth bytes/ns, its source) of a gloo all-reduce over ``t``
    ranks from the trace's calibration."""
    from .cluster_cal import sweep_fit
    cal = state.trace.meta.get("calibration") if isinstance(state.trace.meta, dict) else None
    if not isinstance(cal, dict):
        raise PolicyError(
            f"parallel.tp={t} on a CPU run: the TP=1 trace holds no collective to price its "
            f"{t}-rank gloo all-reduces by; measure them on this machine with `retime "
            f"calibrate -n {t} -o cal.json` and pass `--calibration cal.json`")
    if int(cal.get("world_size", 0)) != t:
        raise PolicyError(
            f"parallel.tp={t} on a CPU run: --calibration {cal.get('path', '')} measured "
            f"{cal.get('world_size')} ranks, the TP group has {t}; run `retime calibrate "
            f"-n {t}`")
    fit = sweep_fit(cal)
    return (float(fit["alpha_us"]) * 1e3, float(fit["busbw_gbps"]),
            f"{cal.get('path', 'the calibration')}: alpha {fit['alpha_us']:g} us, bus "
            f"bandwidth {fit['busbw_gbps']:g} GB/s over {fit['points']} sizes")


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: np.ndarray, b: np.ndarray, lane: np.ndarray, rank: np.ndarray,
             spans: list[tuple[int, set, int, int, list]]) -> np.ndarray:
    """Per gap ``[a, b]`` (on ``lane`` of ``rank``): its overlap with the split calls' own
    time (each span less the operator ranges nested in it: their dispatch, not the work)."""
    out = np.zeros(len(a), np.float64)
    for r, lanes, s, e, kids in spans:
        m = np.flatnonzero((rank == r) & np.isin(lane, list(lanes)))
        if not len(m):
            continue
        ov = np.maximum(0, np.minimum(b[m], e) - np.maximum(a[m], s)).astype(np.float64)
        for ks, ke in kids:
            ov -= np.maximum(0, np.minimum(b[m], ke) - np.maximum(a[m], ks))
        out[m] += np.maximum(ov, 0)
    return out


def scale_tp_cpu(state: WhatIfState, lay, t: int) -> dict[str, Any]:
    """Phase 2 of ``parallel.tp=t`` on a CPU run (module docstring)."""
    from .tp_attention import cpu_calls
    if state.notes.get("tp_dp") is not None:
        raise PolicyError(f"parallel.tp={t} with parallel.dp on a CPU run: fewer replicas' "
                          "gloo gradient all-reduces are not modelled; leave parallel.dp out")
    alpha_ns, bw, src = _price(state, t)
    tr = state.trace
    c = cpu_calls(tr)
    o = tr.ops
    kind, rank, lane = (o["kind"].to_numpy(), o["rank"].to_numpy(),
                        o["lane"].to_numpy())
    st = o["start_ns"].to_numpy()
    en = st + o["dur_ns"].to_numpy()
    cpu = kind == OpKind.CPU_OP
    calls = np.unique(lay.calls)
    spans, leaves = [], {}
    for x in calls.tolist():
        r, s, e = int(c.rank[x]), int(c.first[x]), int(c.end[x])
        inside = np.flatnonzero(cpu & (rank == r) & (st >= s) & (st < e))
        leaves[x] = inside
        if len(inside):
            ln = set(lane[inside].tolist())
            rg = tr.ranges
            k = ((rg["rank"].to_numpy() == r) & np.isin(rg["lane"].to_numpy(), list(ln))
                 & (rg["start_ns"].to_numpy() >= s) & (rg["end_ns"].to_numpy() <= e)
                 & ((rg["start_ns"].to_numpy() - s > 2) | (e - rg["end_ns"].to_numpy() > 2)))
            kids = _union(list(zip(rg["start_ns"].to_numpy()[k].tolist(),
                                   rg["end_ns"].to_numpy()[k].tolist())))
            spans.append((r, ln, s, e, kids))
    g = state.graph
    keep = 1.0 - 1.0 / t
    # lane lags: op x after its lane's previous op
    lp_pos = g.by_op(g.lane_prev)
    has = (lp_pos >= 0) & ~g.by_op(g.lane_s2s)
    x = np.flatnonzero(has)
    p = g.perm[lp_pos[x]].astype(np.int64)
    ov = _overlap(en[p], st[x], lane[x], rank[x], spans)
    llag = g.lane_lag_ns.copy()
    pos = g.pos[x]
    llag[pos] = np.maximum(0, llag[pos] - np.round(ov * keep)).astype(llag.dtype)
    saved = float((g.lane_lag_ns[pos] - llag[pos]).sum())
    # HOST_ORDER edges hold the same measured gaps
    dst_pos = np.repeat(np.arange(g.n_ops, dtype=np.int64), np.diff(g.pred_ptr))
    ho = np.flatnonzero((g.pred_kind == EdgeKind.HOST_ORDER) & ~g.pred_s2s)
    so, do = g.perm[g.pred_src[ho]].astype(np.int64), g.perm[dst_pos[ho]].astype(np.int64)
    ov2 = _overlap(en[so], st[do], lane[do], rank[do], spans)
    pl = g.pred_lag_ns.copy()
    pl[ho] = np.maximum(0, pl[ho] - np.round(ov2 * keep)).astype(pl.dtype)
    saved += float((g.pred_lag_ns[ho] - pl[ho]).sum())
    state.graph = dataclasses.replace(g, lane_lag_ns=llag, pred_lag_ns=pl)
    # the TP all-reduces, after the call that feeds each
    d = state.dur
    ar_ns, ar_bytes, n_ar = 0.0, 0, 0
    for call, nbytes, _ph in lay.allreduces:
        own = leaves.get(call)
        if own is None or not len(own):
            continue
        x_ns = alpha_ns + 2.0 * (t - 1) / t * nbytes / bw
        d[own[np.argmax(en[own])]] += x_ns
        ar_ns, ar_bytes, n_ar = ar_ns + x_ns, ar_bytes + int(nbytes), n_ar + 1
    ranks = max(1, len(np.unique(c.rank)))
    n_split = sum(L["kind"] != "replicated" for L in lay.layers)
    state.assume(
        f"parallel.tp 1 -> {t} on a CPU run: {n_split} of its {len(lay.layers)} linear "
        f"layer(s) split as Megatron's column/row layers ({len(lay.layers) - n_split} "
        f"replicated), {len(lay.attention)} attention block(s) by heads; "
        f"the host compute inside their {len(calls)} GEMM / attention call(s) (the gaps "
        f"in their spans outside their leaf ops and nested operators) takes exactly 1/{t} "
        "of its measured time "
        f"({saved / 1e6:.3g} ms of host gaps saved; no CPU GEMM efficiency model: an "
        "optimistic end), their leaf ops keep theirs", bounded=True)
    state.assume(
        f"parallel.tp={t}: {n_ar} gloo all-reduce(s) of the TP group added ({ar_bytes / 1e6:.3g}"
        f" MB over {ranks} rank(s)), each alpha + 2(t-1)/t x bytes / busbw from {src}: "
        f"{ar_ns / 1e6:.3g} ms in all, blocking the thread after the call that feeds it "
        "(no wait for a slower peer: each rank stands for its TP group)", bounded=True)
    n_dp = int(((kind == OpKind.COLLECTIVE) & (o["phase"].to_numpy() == Phase.BWD)).sum())
    if n_dp:
        state.assume(f"parallel.tp={t} on a CPU run: its {n_dp} data-parallel collective(s) "
                     "keep their measured times (the split layers' smaller gradients are "
                     "not re-priced on gloo: an upper bound)")
    return {"tp": t, "split_layers": n_split, "replicated_layers": len(lay.layers) - n_split, "attention_blocks": len(lay.attention),
            "split_calls": int(len(calls)), "host_compute_saved_ns": round(saved),
            "tp_allreduces": n_ar, "tp_allreduce_bytes": ar_bytes,
            "tp_allreduce_ns": round(ar_ns)}
