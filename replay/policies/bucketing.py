"""Re-bucket the data-parallel gradient all-reduces of a measured trace (``overlap.bucket_mb``).

Model, per rank and step:

* the gradient buckets are the step's all-reduces with bytes (backward phase when the trace
  attributes phases), in issue order, with cumulative sizes ``C_k``;
* gradients become ready along the backward pass: bucket ``k`` was ready when it was issued
  (``R_k``: the end of its latest predecessor, or its measured start); in between, bytes
  become ready at a constant rate from the start of backward (``(T0, 0), (R_1, C_1), ...``);
* new buckets of ``bucket_mb`` close at cumulative sizes ``j * S`` (the last one holds the
  remainder) and are issued when that many bytes are ready, after the op of the issuing lane
  (the lane that fed the old buckets, else the rank's busiest lane) running at that time;
* a new bucket's transfer takes ``kappa * (a + S f / B)`` with ``a`` and ``B`` the alpha-beta
  fit of the trace's own all-reduces (:func:`replay.policies.link_fit.calibrate`; with one
  bucket size only, ``a`` is the ring latency of ``DEFAULT_ALPHA_US`` per step) and
  ``kappa`` = measured / modeled time of the old buckets (the trace's own efficiency);
* NCCL/RCCL all-reduces on GPU streams are priced instead by the cost layer's NCCL model
  on the trace's GPU and platform (:func:`_nccl_model`, :mod:`.nccl_trace`), scaled by
  ``kappa`` only where fully traced last arrivers measure it; with untraced members the
  measured time beyond the modeled transfer is waiting for them, carried to the new buckets
  as :func:`rebucket` says (never as transfer time);
* every op that waited for an old bucket waits for the new bucket that covers it; new
  buckets rendezvous across ranks like the old ones (same index = same instance).

The new ops get placeholder measured times between their ready time and the old buckets'
end, no earlier than the communication lane's previous op (so the replay graph keeps the
stream's order and smaller buckets can start before the first old one did); their modeled
durations come from the fit.

CPU (gloo) DDP traces get a parameter-level model instead: :mod:`.bucketing_cpu`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from retime.collectors.enums import CommOp, OpKind, Phase
from retime.collectors.errors import PolicyError
from retime.collectors.trace import Trace

from ..graph import build_graph
from .base import by_op
from .bucketing_cpu import CpuModel, rebucket_cpu
from .gloo_fit import GLOO_STEP_US
from .link_fit import DEFAULT_ALPHA_US, bus_factor, calibrate, collective_table

__all__ = ["rebucket", "rebucket_cpu", "CpuModel", "GLOO_STEP_US"]


def rebucket(trace: Trace, bucket_mb: float, ranks_per_node: int | None = None,
             bound: str | None = None, peer_wait: str | None = None
             ) -> tuple[Trace, np.ndarray, np.ndarray, dict]:
    """A copy of ``trace`` with its gradient all-reduces re-bucketed.

    NCCL/RCCL all-reduces on GPU streams are priced by the cost layer's NCCL model
    (:func:`_nccl_model`; ``bound`` ``"low"``/``"high"``: at the ends of its range), gloo
    ones and GPU traces without device properties by the trace's alpha-beta fit.
    Returns ``(new trace, new op ids, their modeled transfer durations ns, info)``;
    ``info["assumed"]`` holds the ``assumed:`` lines of what the trace could not tell.

    Untraced members (NCCL model): the part of a measured bucket's time the modeled
    transfer does not explain is waiting for them. Two readings of it, each a limit on a
    new bucket's wait: ``"lag"``, the peers reach each gradient byte as late as they
    reached the old buckets' (interpolated) and a new bucket's kernel spins until they do
    (merged buckets wait no longer than the last old one did); ``"bytes"``, a rank's
    waiting per step stays what it was, spread over the new buckets by their bytes (many
    small buckets do not each wait the whole lag). ``peer_wait`` None: the smaller of the
    two per bucket, except the step's last bucket, which waits for the peers' last measured
    arrival (``"lag"``: no bucketing ends the step before the late ranks get there);
    ``"lag"`` / ``"bytes"``: that one alone (the range's bounds).
    """
    o = trace.ops
    kind = o["kind"].to_numpy()
    cop = o["comm_op"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    phase = o["phase"].to_numpy()
    is_ar = (kind == OpKind.COLLECTIVE) & (cop == CommOp.ALL_REDUCE) & (nbytes > 0)
    if (phase[is_ar] == Phase.BWD).any():
        is_ar &= phase == Phase.BWD
    if not is_ar.any():
        raise PolicyError("overlap.bucket_mb: the trace has no gradient all-reduces with "
                          "sizes (collective ops with comm_op all_reduce and bytes > 0) to "
                          "re-bucket")
    g = build_graph(trace)
    tab = collective_table(trace, g, ranks_per_node)
    cal = calibrate(trace, g, tab)
    sel_tab = np.isin(tab["op"], np.flatnonzero(is_ar))
    n_group = int(np.median(tab["n"][sel_tab]))
    lv = int(np.median(tab["old_level"][sel_tab]))
    c = cal.get(lv) or next(iter(cal.values()), None)
    if c is None:
        raise PolicyError("overlap.bucket_mb: no measured all-reduce has a positive size and "
                          "duration to calibrate the transfer time on")
    f = float(bus_factor(np.array([CommOp.ALL_REDUCE]), np.array([n_group]))[0])
    alpha = c["alpha_ns"]
    if alpha == 0.0:  # one bucket size: the fit has no intercept; use the ring's latency
        alpha = 2 * (n_group - 1) * DEFAULT_ALPHA_US[lv] * 1e3

    def model(b):
        return alpha + np.asarray(b, np.float64) * f / c["busbw_gbps"]

    dur_meas = by_op(g, "dur_ns")
    last = tab["last"] & sel_tab
    meas_ops = tab["op"][last]
    kappa = float(dur_meas[meas_ops].clip(0).sum() / model(nbytes[meas_ops]).sum()) \
        if len(meas_ops) else 1.0
    nc = _nccl_model(trace, tab, sel_tab, dur_meas, n_group, ranks_per_node, bound, peer_wait)
    if nc is None and tab["partial"][sel_tab].all():
        # gloo (no NCCL model to price the transfer on): every all-reduce's time is its
        # transfer plus waiting for the members the trace lacks, and the trace cannot split
        # them; a fit on it would price the waiting as link time
        have = len(np.unique(o["rank"].to_numpy()[is_ar]))
        raise PolicyError(
            f"overlap.bucket_mb: the trace holds {have} of the {n_group} ranks of every "
            "gradient all-reduce, so each all-reduce's time includes waiting for untraced "
            "ranks, which cannot be told apart from the gloo transfer it would re-price; "
            "ingest every rank's trace of the step (retime ingest rank-*.json -o RUN.retime)")
    if nc is not None:
        model, kappa = nc["model"], nc["kappa"]
    S = float(bucket_mb) * 1e6
    rank = o["rank"].to_numpy()
    step = o["step"].to_numpy()
    lane = o["lane"].to_numpy()
    start = o["start_ns"].to_numpy()
    end = start + o["dur_ns"].to_numpy()
    e = trace.edges
    esrc, edst = e["src"].to_numpy(), e["dst"].to_numpy()
    pred_end = np.full(len(o), -1, np.int64)
    if len(esrc):
        np.maximum.at(pred_end, edst, end[esrc])
    new_rows: list[dict] = []
    redirect: dict[int, list] = {}  # old bucket -> [(new row, synthetic start)] up to its bytes
    ready_edges: list[tuple[int, int]] = []  # (existing op, new row)
    coll_base = int(o["coll_id"].max()) + 1 if len(o) else 0
    name_id = int(o["name_id"].to_numpy()[np.flatnonzero(is_ar)[0]])
    for (r, s), idx in pd.Series(np.flatnonzero(is_ar)).groupby(
            [rank[is_ar], step[is_ar]]).groups.items():
        ids = np.flatnonzero(is_ar)[np.asarray(idx)]
        ids = ids[np.lexsort((ids, start[ids]))]
        ready = np.where(pred_end[ids] >= 0, np.minimum(pred_end[ids], start[ids]), start[ids])
        ready = np.maximum.accumulate(ready)
        cum = np.cumsum(nbytes[ids].astype(np.float64))
        own = (rank == r) & (step == s)
        bwd = own & (phase == Phase.BWD)
        t0 = int(start[bwd].min()) if bwd.any() else int(start[own].min())
        t0 = min(t0, int(ready[0]))
        xs = np.concatenate([[0.0], cum])
        ts = np.concatenate([[float(t0)], ready.astype(np.float64)])
        total = cum[-1]
        k_new = max(1, int(np.ceil(total / S - 1e-9)))
        bounds = np.minimum(np.arange(1, k_new + 1) * S, total)
        sizes = np.diff(np.concatenate([[0.0], bounds]))
        t_ready = np.interp(bounds, xs, ts)
        # issuing lane: the lane of the old buckets' predecessors, else the rank's busiest
        feed = esrc[np.isin(edst, ids)]
        if len(feed):
            il = int(np.bincount(lane[feed]).argmax())
        else:
            ol = lane[own & ~is_ar & (kind != OpKind.COLLECTIVE)]
            il = int(np.bincount(ol).argmax()) if len(ol) else int(lane[ids[0]])
        lane_ops = np.flatnonzero(own & (lane == il))
        lane_ops = lane_ops[np.argsort(start[lane_ops], kind="stable")]
        span_hi = int(end[ids].max())
        # a new bucket may be issued as soon as its gradients are ready: bounded below by
        # the communication lane's previous op (the stream is FIFO), not by the first old
        # bucket's start (which would keep smaller buckets from ever starting earlier)
        cl = int(lane[ids[0]])
        before = np.flatnonzero((rank == r) & (lane == cl) & ~is_ar & (start < start[ids[0]]))
        span_lo = max(int(end[before].max()) if len(before) else t0, t0)
        span_lo = min(span_lo, int(start[ids[0]]))
        # untraced members (NCCL model): when each new bucket's peers are ready, from when
        # the old buckets' peers were (their end less the modeled transfer)
        peer_t = None
        wait_j = np.zeros(k_new)
        if nc is not None and nc["partial"]:
            t_old = kappa * nc["model"](nbytes[ids]).astype(np.float64)
            if peer_wait != "bytes":
                pk = np.maximum.accumulate(end[ids] - t_old)
                peer_t = np.interp(bounds, xs, np.concatenate([[t0 + pk[0] - ts[1]], pk]))
            if peer_wait != "lag":
                waited = float(np.maximum(end[ids] - start[ids] - t_old, 0.0).sum())
                wait_j = waited * sizes / total
        sigma_prev = -(2**62)
        busy_until = -(2**62)  # the stream's modeled end of the previous new bucket
        syn: list[tuple[int, int, int]] = []  # (ready op or -1, synthetic start, row)
        for j in range(k_new):
            pos = np.searchsorted(start[lane_ops], t_ready[j], side="right") - 1
            rop = int(lane_ops[pos]) if pos >= 0 else -1
            sig = int(end[rop]) if rop >= 0 else int(t_ready[j])
            sig = min(max(sig, sigma_prev, span_lo, busy_until), span_hi)
            sigma_prev = sig
            t_model = float(kappa * model(sizes[j]))
            if nc is not None and nc["partial"]:
                # the kernel spins until the untraced peers arrive, then transfers: the wait
                # is kernel time, as it was in the measured buckets
                w_lag = max(0.0, float(peer_t[j]) - sig) if peer_t is not None else math.inf
                w_bytes = float(wait_j[j]) if peer_wait != "lag" else math.inf
                # the last bucket cannot end before the peers' last measured arrival
                t_model += w_lag if j == k_new - 1 and peer_t is not None \
                    else min(w_lag, w_bytes)
                busy_until = int(sig + t_model)
            syn.append((rop, sig, len(new_rows)))
            new_rows.append({"rank": r, "lane": int(lane[ids[0]]), "step": s,
                             "start_ns": sig, "bytes": int(round(sizes[j])),
                             "coll_j": j, "group_id": int(o["group_id"].iat[ids[0]]),
                             "model_ns": t_model})
        for j, (rop, sig, row) in enumerate(syn):
            nxt = syn[j + 1][1] if j + 1 < len(syn) else max(span_hi, busy_until)
            new_rows[row]["dur_ns"] = max(0, nxt - sig)
            if rop >= 0:
                ready_edges.append((rop, row))
        # a consumer of old bucket k needs the new bucket that completes its bytes (but
        # not one issued after the consumer ran: that wait was not for these gradients)
        for k_old, i in enumerate(ids.tolist()):
            j = int(np.searchsorted(bounds, cum[k_old] - 0.5))
            redirect[i] = [(row, sig) for _, sig, row in syn[:min(j, len(syn) - 1) + 1]]
    # coll ids: same bucket index of the same step over the ranks of one group
    keys = {}
    for row in new_rows:
        key = (row["step"], row["group_id"], row["coll_j"])
        keys.setdefault(key, coll_base + len(keys))
        row["coll_id"] = keys[key]
    info = {"buckets_before": int(is_ar.sum()), "buckets_after": len(new_rows),
            "kappa": kappa, "alpha_ns": alpha, "busbw_gbps": c["busbw_gbps"],
            "bucket_mb": float(bucket_mb), "model": "generic"}
    if nc is not None:
        info = {"buckets_before": int(is_ar.sum()), "buckets_after": len(new_rows),
                "bucket_mb": float(bucket_mb), **nc["info"], "assumed": nc["assumed"]}
    return _assemble(trace, is_ar, new_rows, redirect, ready_edges, name_id, esrc, edst, start,
                     info)


def _assemble(trace, is_ar, new_rows, redirect, ready_edges, name_id, esrc, edst, start, info):
    o = trace.ops
    keep = np.flatnonzero(~is_ar)
    n_keep = len(keep)
    new_id = np.full(len(o), -1, np.int64)
    new_id[keep] = np.arange(n_keep)
    add = pd.DataFrame({
        "rank": np.asarray([r["rank"] for r in new_rows], np.int32),
        "lane": np.asarray([r["lane"] for r in new_rows], np.int32),
        "kind": np.full(len(new_rows), int(OpKind.COLLECTIVE), np.int8),
        "name_id": np.full(len(new_rows), name_id, np.int32),
        "start_ns": np.asarray([r["start_ns"] for r in new_rows], np.int64),
        "dur_ns": np.asarray([r["dur_ns"] for r in new_rows], np.int64),
        "step": np.asarray([r["step"] for r in new_rows], np.int32),
        "phase": np.full(len(new_rows), int(Phase.BWD), np.int8),
        "coll_id": np.asarray([r["coll_id"] for r in new_rows], np.int64),
        "comm_op": np.full(len(new_rows), int(CommOp.ALL_REDUCE), np.int8),
        "bytes": np.asarray([r["bytes"] for r in new_rows], np.int64),
        "group_id": np.asarray([r["group_id"] for r in new_rows], np.int32),
    })
    defaults = {"layer": -1, "microbatch": -1, "stage": -1, "chunk": -1, "peer": -1,
                "flops": np.nan, "correlation": -1, "external_id": -1}
    for col in o.columns:
        if col not in add.columns:
            add[col] = defaults.get(col, 0)
        add[col] = add[col].astype(o[col].dtype)
    ops = pd.concat([o.iloc[keep], add[list(o.columns)]], ignore_index=True)
    ops["op_id"] = np.arange(len(ops), dtype=np.int64)
    # edges: drop those into old buckets, redirect those out of them
    e = trace.edges
    src_old_ar = is_ar[esrc]
    dst_old_ar = is_ar[edst]
    keep_e = ~src_old_ar & ~dst_old_ar
    src = list(new_id[esrc[keep_e]])
    dst = list(new_id[edst[keep_e]])
    kinds = list(e["kind"].to_numpy()[keep_e])
    lags = list(e["lag_ns"].to_numpy()[keep_e])
    for k in np.flatnonzero(src_old_ar & ~dst_old_ar).tolist():
        cands = [row for row, sig in redirect[int(esrc[k])] if sig <= start[edst[k]]]
        if not cands:
            continue
        row = cands[-1]
        src.append(n_keep + row)
        dst.append(new_id[edst[k]])
        kinds.append(int(e["kind"].iat[k]))
        lags.append(0)
    for rop, row in ready_edges:
        if new_id[rop] >= 0:
            src.append(new_id[rop])
            dst.append(n_keep + row)
            kinds.append(2)
            lags.append(0)
    edges = pd.DataFrame({"src": np.asarray(src, np.int64), "dst": np.asarray(dst, np.int64),
                          "kind": np.asarray(kinds, np.int8), "lag_ns": np.asarray(lags, np.int64)})
    t = Trace(ops=ops, lanes=trace.lanes, edges=edges, ranges=trace.ranges, groups=trace.groups,
              memory=trace.memory, strings=trace.strings, meta=dict(trace.meta))
    new_ids = np.arange(n_keep, len(ops), dtype=np.int64)
    info["kept_ops"] = keep  # the measured op each of the new trace's first ops is
    model_ns = np.asarray([r["model_ns"] for r in new_rows])
    return t, new_ids, model_ns, info


def _nccl_model(trace: Trace, tab: dict, sel_tab: np.ndarray, dur_meas: np.ndarray,
                n_group: int, ranks_per_node: int | None, bound: str | None,
                peer_wait: str | None = None) -> dict | None:
    """The NCCL model of a GPU trace's gradient all-reduces (:mod:`.nccl_trace`): ``model``
    (bytes -> ns), ``kappa`` (fitted on fully traced last arrivers, else 1), ``partial``
    (untraced members: the rest of their time is waiting, kept by the caller), ``info``.
    None for gloo collectives or a trace without GPU device properties."""
    from retime.collectors.enums import CommOp as C

    from .base import ranks_per_node_of
    from .nccl_trace import (
        NcclPricer,
        anchor,
        channels_text,
        forced_choice,
        gpu_collectives,
        measured_channels,
        peer_text,
        trace_cluster,
    )

    ops = tab["op"][sel_tab]
    if not gpu_collectives(trace, ops):
        return None
    world = int(max(np.max(tab["n"]), trace.meta.get("world_size") or 0))
    rpn = ranks_per_node_of(trace, ranks_per_node)
    try:
        cl, src = trace_cluster(trace, rpn, world)
    except PolicyError:
        return None
    chan = measured_channels(trace)
    pricer = NcclPricer(cl, bound=bound, channels=chan)
    sizes = tab["bytes"][sel_tab]
    forced, why = forced_choice(trace, ops, pricer, n_group, sizes)
    pricer.forced = forced
    mod = pricer.times_ns(np.full(len(ops), int(C.ALL_REDUCE)), sizes, tab["n"][sel_tab])
    part = tab["partial"][sel_tab]
    a = anchor(dur_meas[ops].astype(np.float64), mod, tab["last"][sel_tab], part)
    k = a["kappa"]

    def model(b):
        b = np.asarray(b, np.float64)
        return np.vectorize(lambda x: pricer.time_ns(C.ALL_REDUCE, x, n_group),
                            otypes=[np.float64])(b)

    ex = pricer.cost(C.ALL_REDUCE, float(np.median(sizes)), n_group)
    assumed = [f"all-reduce transfer priced by the NCCL model on {src['gpu']} "
               f"({src['platform']}, {src['nominal_intra_gbps']:g} GB/s nominal: "
               f"{src['nominal_source']}; {n_group} ranks, {src['ranks_per_node']} per node): "
               f"{why}; {channels_text(chan, ex.channels)}; {ex.time_us:.0f} us at the median measured "
               f"{float(np.median(sizes)) / 1e6:.3g} MB (range {ex.range_us[0]:.0f}-"
               f"{ex.range_us[1]:.0f} us)"]
    if a["source"] == "fitted":
        assumed[0] += (f"; scaled by {k:.2f}, the measured / modeled time of "
                       f"{a['points']} fully traced last arriver(s) (fitted)")
    partial = bool(part.any())
    if partial:
        assumed.append(peer_text(int(part.sum()), dur_meas[ops[part]].astype(np.float64),
                                 mod[part]) + ": " + _peer_text(peer_wait))
    sources = {"transfer": "fitted" if a["source"] == "fitted" else
               "model: published and assumed parameters (collectors/costs/nccl_params.py)",
               "platform": "stated" if "stated" in src["nominal_source"] else "assumed"}
    if partial:
        sources["wait"] = "assumed (the range replays each reading)"
    info = {"model": "nccl", "algorithm": ex.algorithm, "protocol": ex.protocol,
            "channels": ex.channels, "channels_source": "measured" if chan else "assumed",
            # what the replay charged for one bucket of the median size: `retime cost
            # collective` prints the same for the same cluster, ranks and channels
            "priced": {"bytes": int(float(np.median(sizes))), "ranks": int(n_group),
                       "time_us": ex.time_us, "algorithm": ex.algorithm,
                       "protocol": ex.protocol},
            "kappa": k, "kappa_source": a["source"],
            "cluster": src, "waiting_kept": partial, "sources": sources}
    return {"model": model, "kappa": k, "partial": partial, "info": info, "assumed": assumed}


_LAG = ("the untraced ranks reach each gradient byte as late after this rank as they reached "
        "the measured buckets' (interpolated; a new bucket's kernel spins until they do)")
_BYTES = "this rank's waiting per step stays as measured, spread over the new buckets by bytes"


def _peer_text(mode: str | None) -> str:
    if mode == "lag":
        return _LAG
    if mode == "bytes":
        return _BYTES
    return (f"each new bucket waits the smaller of two readings: {_LAG}, or {_BYTES}; the "
            "step's last bucket waits for the untraced ranks' last measured arrival; the "
            "range replays each reading alone (overlap.peer_wait=lag / bytes)")
