"""Parallelism what-ifs on op-level traces (Megatron timers read by :mod:`collectors.oplevel`).

An op-level trace has one ``forward-compute`` / ``backward-compute`` op per micro-batch and
model chunk, the pipeline sends / receives, the data-parallel parameter all-gather and
gradient reduce-scatter, and the once-per-step ops (gc, layernorm / embedding / grad-norm
all-reduces, optimizer). It has no layers and no kernels, so the template is per *virtual
stage* (model chunk ``vs = chunk * pp + stage``) and per stage:

Template (:func:`oplevel_template`), from every step of every rank:

* ``durations="stage"`` (default): each compute op type of a virtual stage at the **median**
  of its measured durations (over micro-batches, DP ranks and steps), each communication op
  type of a stage at the median of its measured *transfer time* (end minus the latest member
  start: waiting for a late peer is not part of it), the once-per-step ops likewise per stage;
* ``durations="ideal"``: every op at the ideal duration of ``retime stragglers`` (compute:
  mean of its op type over the whole job; communication: median transfer time of its op
  type), so that the same layout reproduces the straggler analysis' ideal step.

Layout (``meta["oplevel"]["layout"]``, else detected by :func:`collectors.oplevel.
pipeline_layout`): dp, pp, chunks and the number of micro-batches from the job metadata and
the trace, the schedule from the program order of each rank's computes. The micro-batch
size is not in the trace: ``global_batch`` counts micro-batches of the trace's size (the
trace's global batch is ``microbatches * dp``).

Re-assembly (:func:`relayout_oplevel`): one step, laid out with the program order of
:func:`collectors.synth.schedule.stage_order` (the synthesizer's GPipe / 1F1B / interleaved /
breadth-first orders) and the dependency rules the op-level reader infers from a measured
timeline (see :mod:`collectors.oplevel`: recv -> compute, compute -> send, a recv posted
after the rank's previous compute of its direction, the first backward send/recv after the
second forward before the first backward, params all-gather -> first forward of its chunk,
the post-compute chain gc -> layernorm -> embedding -> reduce-scatter -> grad-norm ->
optimizer), with pipeline pairs and DP / embedding / world all-reduces as collective
instances (members start together). Times come from the synthesizer's list scheduler; the
result is an ordinary op-level trace (``retime stragglers`` and the analysis modules read
it), so re-laying out the same configuration replays to the same step as the measured
timeline's graph with the template durations.

What changes with the layout (physics, stated):

* pipeline degree or chunks (``pp * chunks`` virtual stages ``V -> V'``): a stage's compute
  is its share of the layers plus, on the first / last virtual stage, the embedding / loss
  work. With ``V >= 3`` the extra of the first and last stage is measured against the median
  of the middle stages, the rest (the layers) is spread evenly over ``V'`` (the trace has no
  layer count: the layers are assumed to split evenly). Parameter-proportional times
  (reduce-scatter, all-gather, optimizer) are re-split the same way.
* data-parallel degree: ring collectives, time ``(n-1)/n * bytes / bandwidth`` with the
  measured per-rank bandwidth (the trace has no topology); the distributed optimizer's step
  shrinks as ``1/dp``; no DP communication at ``dp=1``. The global batch is kept, so the
  micro-batches per pipeline become ``global_batch / dp``.
* ZeRO stage (the trace runs ZeRO-1 when it has the distributed optimizer's parameter
  all-gather / gradient reduce-scatter, else ZeRO-0): ZeRO-0 replaces them by one gradient
  all-reduce (``separate-grads-all-reduce`` in the post-compute chain) taking their summed
  time (a ring all-reduce moves what a reduce-scatter plus an all-gather move) and runs the
  optimizer unsharded; ZeRO-1/2 split an all-reduce into halves. ZeRO-2 times as ZeRO-1.
* pipeline sends / receives keep their measured transfer time (activations of one
  micro-batch do not depend on the layout); the embedding all-reduce joins the first and
  last stage (none at ``pp=1``); gc, layernorm and grad-norm all-reduces keep their times.

Refused (PolicyError): tensor / context / sequence parallelism and ZeRO-3 / FSDP (no per-layer
GEMMs, TP collectives or per-layer parameter sizes in an op-level trace), another micro-batch
size (its compute time is not measured), DP communication on a trace that has none, and a
ZeRO change on a trace whose DP communication overlaps the backward pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from retime.collectors.errors import ConfigError, PolicyError
from retime.collectors.oplevel import pipeline_layout
from retime.collectors.trace import Trace

from ._oplevel_build import _DP_T, _DPG, _P2P_T, _REPLICA, _WORLD, _Rep, _to_trace

__all__ = ["oplevel_layout", "oplevel_template", "relayout_oplevel", "DURATIONS"]

DURATIONS = ("stage", "ideal")
_COMPUTE_T = ("forward-compute", "backward-compute")
_STEP_T = ("gc", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
           "optimizer-clip-main-grad", "optimizer")


def oplevel_layout(trace: Trace) -> dict[str, Any]:
    """The measured layout of an op-level trace (see the module docstring)."""
    ol = trace.meta.get("oplevel") if isinstance(trace.meta, dict) else None
    if isinstance(ol, dict) and isinstance(ol.get("layout"), dict):
        lay = dict(ol["layout"])
    else:  # ingested before the reader recorded it
        job = trace.meta.get("job", {})
        o = trace.ops
        st = o["stage"].to_numpy()
        ch = o["chunk"].to_numpy()
        lay = pipeline_layout(
            o["rank"].to_numpy(), o["step"].to_numpy(), st, ch, o["microbatch"].to_numpy(),
            trace.names(), o["start_ns"].to_numpy(),
            {"dp_size": int(job.get("dp_size", 1)), "pp_size": int(job.get("pp_size",
                                                                           st.max() + 1)),
             "tp_size": int(job.get("tp_size", 1)), "dsp_size": int(job.get("dsp_size", 1)),
             "vpp_size": int(job.get("vpp_size", max(int(ch.max()) + 1, 1)))})
    lay["micro_batch"] = 1
    lay["global_batch"] = lay["microbatches"] * lay["dp"]
    return lay


def _op_durations(trace: Trace, durations: str) -> np.ndarray:
    """Per op: measured transfer time (``stage``) or straggler-ideal duration (``ideal``)."""
    from .base import cached_graph
    from .stragglers import _transfer_ns, ideal_durations

    g = cached_graph(trace, ideal=True)
    if durations == "ideal":
        return np.asarray(ideal_durations(trace, g), np.float64)
    return _transfer_ns(g).astype(np.float64)


def oplevel_template(trace: Trace, durations: str = "stage") -> dict[str, Any]:
    """Per-virtual-stage and per-stage durations of an op-level trace (module docstring).

    Returns
    -------
    dict
        ``layout`` (:func:`oplevel_layout`); ``compute`` {optype: float64[V] ns per
        micro-batch}; ``p2p``, ``step``, ``dp`` {optype: float64[pp] ns, NaN where the stage
        has none; DP ops are the total per step}; ``dp_count`` {optype: instances per rank
        and step}; ``dropped`` {optype: ops of types a re-layout does not rebuild}.
    """
    if durations not in DURATIONS:
        raise PolicyError(f"parallel.durations={durations!r}; choose one of "
                          f"{', '.join(DURATIONS)}")
    lay = oplevel_layout(trace)
    p, v = int(lay["pp"]), int(lay["chunks"])
    if lay["microbatches"] < 1:
        raise PolicyError("parallel: the op-level trace has no forward-compute ops: the "
                          "per-stage compute of a micro-batch is unknown")
    d = _op_durations(trace, durations)
    o = trace.ops
    names = trace.names().astype(str)
    stage = o["stage"].to_numpy().astype(np.int64)
    vs = np.maximum(o["chunk"].to_numpy().astype(np.int64), 0) * p + stage
    rank = o["rank"].to_numpy().astype(np.int64)
    step = o["step"].to_numpy().astype(np.int64)

    def med(sel: np.ndarray, key: np.ndarray, n: int) -> np.ndarray:
        out = np.full(n, np.nan)
        for k in np.unique(key[sel]):
            out[int(k)] = float(np.median(d[sel & (key == k)]))
        return out

    tpl: dict[str, Any] = {"layout": lay, "durations": durations, "compute": {}, "p2p": {},
                           "step": {}, "dp": {}, "dp_count": {}, "dropped": {}}
    for t in _COMPUTE_T:
        c = med(names == t, vs, p * v)
        if np.isnan(c).any():
            raise PolicyError(f"parallel: virtual stage(s) {np.flatnonzero(np.isnan(c)).tolist()}"
                              f" have no {t} op: their compute per micro-batch is unknown")
        tpl["compute"][t] = c
    for t in _P2P_T + _STEP_T:
        sel = names == t
        if sel.any():
            tpl["p2p" if t in _P2P_T else "step"][t] = med(sel, stage, p)
    for t in _DP_T:
        sel = names == t
        if sel.any():
            per = np.unique(np.stack([rank[sel], step[sel]]), axis=1, return_counts=True)[1]
            n = int(np.bincount(per).argmax())
            tpl["dp"][t] = med(sel, stage, p) * n
            tpl["dp_count"][t] = n
    # distributed optimizer (ZeRO-1): parameter all-gather / gradient reduce-scatter
    lay["zero"] = int("params-all-gather" in tpl["dp"] or "grads-reduce-scatter" in tpl["dp"])
    known = set(_COMPUTE_T + _P2P_T + _STEP_T + _DP_T)
    for t, n in zip(*np.unique(names, return_counts=True), strict=True):
        if t not in known:
            tpl["dropped"][str(t)] = int(n)
    return tpl


def _resplit(x: np.ndarray, n_new: int) -> np.ndarray:
    """Values per virtual stage (additive over layers) for ``n_new`` virtual stages: the
    first / last stage's extra over the middle stages' median stays on the first / last
    stage, the rest is spread evenly (module docstring)."""
    x = np.asarray(x, np.float64)
    n = len(x)
    if n_new == n:
        return x.copy()
    if n >= 3:
        mid = float(np.median(x[1:-1]))
        e0, e1 = x[0] - mid, x[-1] - mid
    else:  # the extras cannot be told from the layers: uniform
        e0 = e1 = 0.0
    body = float(x.sum()) - e0 - e1
    out = np.full(n_new, body / n_new)
    out[0] += e0
    out[-1] += e1
    return np.maximum(out, 0.0)


def _per_stage(x: np.ndarray, p_new: int, what: str) -> np.ndarray:
    """Per-stage values for ``p_new`` stages: the measured ones when the stage count is
    unchanged (missing stages: the median of the others), else the median over stages."""
    x = np.asarray(x, np.float64)
    if np.isnan(x).all():
        raise PolicyError(f"parallel: the trace has no {what} op: its duration is unknown")
    fill = float(np.nanmedian(x))
    if len(x) == p_new:
        return np.where(np.isnan(x), fill, x)
    return np.full(p_new, fill)


def _span(t: Trace) -> int:
    """First start to last end of a one-step trace (ns)."""
    o = t.ops
    return int((o["start_ns"] + o["dur_ns"]).max() - o["start_ns"].min()) if len(o) else 0


def _mean_step(trace: Trace) -> int:
    """Mean over steps of the step's span over all ranks (ns), as measured."""
    o = trace.ops
    if not len(o):
        return 0
    g = o.assign(end=o["start_ns"] + o["dur_ns"]).groupby("step")
    return int(round(float((g["end"].max() - g["start_ns"].min()).mean())))


def _ring(n: int) -> float:
    return (n - 1) / n


def relayout_oplevel(trace: Trace, new: dict[str, Any], durations: str = "stage") -> tuple[Trace, dict]:
    """Re-lay out an op-level trace (module docstring).

    Parameters
    ----------
    trace : Trace
        An op-level trace (``meta["source_format"] == "oplevel"``).
    new : dict
        Changed fields of :class:`~replay.policies.parallel.Parallel` (``dp``, ``pp``,
        ``chunks``, ``schedule``, ``global_batch``, ``microbatches``, ...).
    durations : {"stage", "ideal"}

    Returns
    -------
    (Trace, dict)
        The re-laid-out one-step trace and the ``relayout`` note (``from``, ``to``,
        ``durations``, ``assumptions``).
    """
    for f, why in (("tp", "tensor parallelism re-shards each layer's GEMMs and adds TP "
                    "collectives, but the trace has one compute op per micro-batch and stage "
                    "(no per-layer GEMMs or TP all-reduces)"),
                   ("cp", "context parallelism needs per-layer attention kernels and their "
                    "all-gathers, which the trace does not have"),
                   ("sequence_parallel", "sequence parallelism needs per-layer TP "
                    "collectives, which the trace does not have"),
                   ("fsdp", "FSDP gathers parameters per layer, but the trace has no "
                    "per-layer parameter sizes")):
        val = new.get(f)
        if val is True or (val is not None and val is not False and val != 1):
            raise PolicyError(f"parallel.{f}={new[f]!r} on an op-level trace: {why}; "
                              "ingest a kernel-level (Kineto/nsys) trace of the job or "
                              "synthesize it with `retime synth`")
    tpl = oplevel_template(trace, durations)
    lay = tpl["layout"]
    zero = lay["zero"] if new.get("zero") is None else int(new["zero"])
    if zero == 3 or (zero != lay["zero"] and "separate-grads-all-reduce" in tpl["dp"]
                     and "grads-reduce-scatter" in tpl["dp"]):
        raise PolicyError(f"parallel.zero={zero} on an op-level trace that runs ZeRO-"
                          f"{lay['zero']}: " + ("ZeRO-3 gathers parameters per layer, but the "
                                                "trace has no per-layer parameter sizes" if
                                                zero == 3 else "its DP communication "
                                                "overlaps the backward pass (reduce-scatter + "
                                                "separate all-reduce); only a non-overlapped "
                                                "trace can switch the distributed optimizer"))
    if new.get("micro_batch") not in (None, lay["micro_batch"]):
        raise PolicyError(f"parallel.micro_batch={new['micro_batch']} on an op-level trace: "
                          "the trace measures one micro-batch size (its size is not recorded) "
                          "and the compute time of another size is not in it; change the "
                          "number of micro-batches with parallel.microbatches or "
                          "parallel.global_batch (counted in the trace's micro-batches)")
    p = int(new.get("pp") or lay["pp"])
    dp = int(new.get("dp") or lay["dp"])
    sched = new.get("schedule") or (lay["schedule"] if lay["schedule"] != "unknown" else None)
    if sched is None:
        raise PolicyError("parallel: the trace's pipeline schedule was not recognized "
                          f"(schedule_match={lay['schedule_match']}); name one with "
                          "parallel.schedule")
    v = new.get("chunks")
    if v is None:
        v = 1 if sched in ("gpipe", "1f1b") else (lay["chunks"] if lay["chunks"] > 1 else 2)
    gb = new.get("global_batch")
    if new.get("microbatches") is not None:
        gb_m = int(new["microbatches"]) * dp
        if gb is not None and gb != gb_m:
            raise PolicyError(f"parallel.microbatches={new['microbatches']} with dp={dp} means "
                              f"global_batch={gb_m}, but parallel.global_batch={gb}; give one")
        gb = gb_m
    gb = int(gb or lay["global_batch"])
    if gb % dp:
        raise PolicyError(f"parallel: global_batch={gb} micro-batches (the trace's "
                          f"{lay['microbatches']} x dp={lay['dp']}) is not divisible by dp={dp}; "
                          "choose dp dividing it or set parallel.global_batch")
    m = gb // dp
    from retime.collectors.synth.schedule import stage_order
    try:
        orders = [stage_order(sched, p, m, v, s) for s in range(p)]
    except ConfigError as exc:
        raise PolicyError(f"parallel: {exc}") from exc
    if dp > 1 and lay["dp"] == 1:
        raise PolicyError(f"parallel.dp={dp} on an op-level trace without data parallelism: "
                          "the trace has no gradient reduce-scatter / parameter all-gather "
                          "to calibrate their time")
    to = {"dp": dp, "pp": p, "tp": 1, "cp": 1, "chunks": int(v), "schedule": sched,
          "microbatches": m, "global_batch": gb, "micro_batch": 1, "zero": zero}
    frm = {k: lay[k] for k in to}
    step = int(trace.ops["step"].min())
    t, assumptions = _assemble(tpl, to, orders, step)
    t.meta["job"] = dict(trace.meta.get("job", {}), dp_size=dp, pp_size=p, vpp_size=int(v),
                         world_size=dp * p)
    note = {"from": frm, "to": to, "durations": durations, "assumptions": assumptions,
            "dropped_optypes": tpl["dropped"], "step_time_ns": _span(t),
            "baseline_step_time_ns": None, "measured_mean_step_time_ns": _mean_step(trace)}
    if to == frm:
        note["baseline_step_time_ns"] = note["step_time_ns"]
    elif frm["schedule"] in ("gpipe", "1f1b", "interleaved", "bfs"):
        # the same layout from the same template: the step this what-if compares with
        base = [stage_order(frm["schedule"], frm["pp"], frm["microbatches"], frm["chunks"], s)
                for s in range(frm["pp"])]
        note["baseline_step_time_ns"] = _span(_assemble(tpl, frm, base, step)[0])
    t.meta["relayout"] = note
    return t, note


def _assemble(tpl: dict, to: dict, orders: list, step: int) -> tuple[Trace, list[str]]:
    lay = tpl["layout"]
    p, v, dp = to["pp"], to["chunks"], to["dp"]
    V, V0 = p * v, int(lay["pp"]) * int(lay["chunks"])
    notes: list[str] = []
    if V != V0:
        notes.append(f"{V0} -> {V} virtual stages: the layers split evenly; the first / last "
                     "stage keep their measured extra (embedding / loss)"
                     + ("" if V0 >= 3 else " (not separable with < 3 stages: uniform)"))
    F = _resplit(tpl["compute"]["forward-compute"], V)
    B = _resplit(tpl["compute"]["backward-compute"], V)
    p2p = {t: _per_stage(x, p, t) for t, x in tpl["p2p"].items()} if p > 1 else {}
    if p > 1:
        for t in _P2P_T:
            if t not in p2p:
                raise PolicyError(f"parallel.pp={p} on an op-level trace without {t} ops: "
                                  "the pipeline transfer time is unknown")
    stp = {t: _per_stage(x, p, t) for t, x in tpl["step"].items()
           if t not in ("optimizer", "embedding-grads-all-reduce")}
    emb = tpl["step"].get("embedding-grads-all-reduce")
    # parameter-proportional times, per measured virtual stage (a stage's chunks alike)
    d0, v0 = int(lay["dp"]), int(lay["chunks"])

    def per_vs(x: np.ndarray) -> np.ndarray:
        x = np.where(np.isnan(x), np.nanmedian(x), x)
        return np.tile(x / v0, v0)

    z0, z = int(lay["zero"]), int(to["zero"])
    dpt: dict[str, np.ndarray] = {}
    if dp > 1:
        ratio = _ring(dp) / _ring(d0)
        # per new virtual stage (= per chunk instance)
        src = {t: _resplit(per_vs(x), V) * ratio for t, x in tpl["dp"].items()}
        if dp != d0:
            notes.append(f"dp {d0} -> {dp}: ring collectives scale by (n-1)/n "
                         f"(x{ratio:.3f}) at the measured per-rank bandwidth")
        rs_t, ag_t, ar_t = _DP_T[1], _DP_T[0], _DP_T[2]
        if (z0 >= 1) == (z >= 1):
            dpt = src
        elif z == 0:  # ring all-reduce = reduce-scatter + all-gather of the same bytes
            rs = src.get(rs_t, src.get(ag_t))
            dpt = {ar_t: rs + src.get(ag_t, rs)}
            notes.append("ZeRO-0: the gradient all-reduce takes the measured reduce-scatter "
                         "+ all-gather time, the optimizer runs unsharded")
        else:
            dpt = {rs_t: src[ar_t] / 2, ag_t: src[ar_t] / 2}
            notes.append(f"ZeRO-{z}: the measured all-reduce splits into a reduce-scatter and "
                         "an all-gather of half its time each; the optimizer runs sharded")
        if z == 2:
            notes.append("ZeRO-2 shards gradients too: same communication as ZeRO-1 here "
                         "(memory is not modeled on op-level traces)")
    opt = tpl["step"].get("optimizer")
    opt_new = None
    if opt is not None:
        # the step's optimizer runs on 1/dp of the parameters with a distributed optimizer
        shrink = (1.0 / dp if z >= 1 else 1.0) / (1.0 / d0 if z0 >= 1 else 1.0)
        if V == V0 and p == int(lay["pp"]):
            opt_new = _per_stage(opt, p, "optimizer") * shrink
        else:
            w = per_vs(next((tpl["dp"][t] for t in (_DP_T[1], _DP_T[0], _DP_T[2])
                             if t in tpl["dp"]), np.ones(int(lay["pp"]))))
            wn = _resplit(w, V)
            ws0 = w.reshape(v0, -1).sum(axis=0)
            rate = float(np.nanmedian(opt / ws0))
            opt_new = rate * wn.reshape(v, p).sum(axis=0) * shrink
        if shrink != 1.0:
            notes.append(f"optimizer step x{shrink:g} (ZeRO-{z0} -> ZeRO-{z}, dp {d0} -> {dp}: "
                         "a distributed optimizer updates 1/dp of the parameters)")
    ovlp = all(t in dpt for t in _DP_T[1:])  # reduce-scatters overlap the backward pass
    rep = _Rep()
    for s in range(p):
        ags = {}
        if "params-all-gather" in dpt:
            for c in range(v):
                ags[c] = rep.add(s, "params-all-gather", dpt["params-all-gather"][c * p + s],
                                 chunk=c, ckey=("ag", s, c), scope=_DPG)
        prev = {False: None, True: None}
        comps: list[int] = []
        first_fwd: dict[int, int] = {}
        last_bwd: dict[int, int] = {}
        first_brecv = first_bsend = None
        for bwd, mb, c in orders[s]:
            vs = c * p + s
            t = "backward-compute" if bwd else "forward-compute"
            comp = rep.add(s, t, (B if bwd else F)[vs], mb, c)
            comps.append(comp)
            if bwd:
                last_bwd[c] = comp
            else:
                first_fwd.setdefault(c, comp)
            has_recv = vs > 0 if not bwd else vs < V - 1
            has_send = vs < V - 1 if not bwd else vs > 0
            d = "backward" if bwd else "forward"
            if has_recv:
                src_vs = vs + 1 if bwd else vs - 1
                r = rep.add(s, f"{d}-recv", p2p[f"{d}-recv"][s], mb, c,
                            ckey=("p2p", bwd, mb, src_vs), scope=_REPLICA, peer=src_vs % p)
                rep.edges.append((r, comp))
                if prev[bwd] is not None:
                    rep.edges.append((prev[bwd], r))
                if bwd and first_brecv is None:
                    first_brecv = r
            if has_send:
                sn = rep.add(s, f"{d}-send", p2p[f"{d}-send"][s], mb, c,
                             ckey=("p2p", bwd, mb, vs), scope=_REPLICA,
                             peer=(vs - 1 if bwd else vs + 1) % p)
                rep.edges.append((comp, sn))
                if bwd and first_bsend is None:
                    first_bsend = sn
            prev[bwd] = comp
        for c, a in ags.items():
            rep.edges.append((a, first_fwd[c]))
        # the first backward send/recv wait for the second forward before the first backward
        kb = next((i for i, (b, _, _) in enumerate(orders[s]) if b), -1)
        if kb >= 2 and not orders[s][kb - 2][0]:
            for x in (first_brecv, first_bsend):
                if x is not None:
                    rep.edges.append((comps[kb - 2], x))
        # post-compute chain: last compute -> gc -> (layernorm -> embedding -> [separate
        # all-reduce] or reduce-scatters -> grad-norm -> optimizer); overlapped DP: each
        # reduce-scatter follows its chunk's last backward, the last one feeds layernorm
        head = [comps[-1]]
        if "gc" in stp:
            head.append(rep.add(s, "gc", stp["gc"][s]))
        post: list[int] = []
        if "layernorm-grads-all-reduce" in stp:
            post.append(rep.add(s, "layernorm-grads-all-reduce",
                                stp["layernorm-grads-all-reduce"][s], ckey=("ln", s),
                                scope=_REPLICA))
        if emb is not None and p > 1 and s in (0, p - 1):
            e = emb[0 if s == 0 else -1]
            post.append(rep.add(s, "embedding-grads-all-reduce",
                                float(np.nanmedian(emb)) if np.isnan(e) else e, ckey=("emb",),
                                scope=_REPLICA))
        rs = [rep.add(s, "grads-reduce-scatter", dpt["grads-reduce-scatter"][c * p + s],
                      chunk=c, ckey=("rs", s, c), scope=_DPG)
              for c in range(v)] if "grads-reduce-scatter" in dpt else []
        if not ovlp:
            post.extend(rs)
        if _DP_T[2] in dpt:
            post.append(rep.add(s, _DP_T[2], dpt[_DP_T[2]].reshape(v, p)[:, s].sum(),
                                ckey=("sar", s), scope=_DPG))
        if ovlp:
            for c, r in enumerate(rs):
                rep.edges.append((last_bwd[c], r))
            rep.edges.append((rs[-1], post[0]))
        if "optimizer-clip-main-grad" in stp:
            post.append(rep.add(s, "optimizer-clip-main-grad",
                                stp["optimizer-clip-main-grad"][s], ckey=("clip",),
                                scope=_WORLD))
        if opt_new is not None:
            post.append(rep.add(s, "optimizer", opt_new[s]))
        rep.chain(head + post)
    return _to_trace(rep, to, step), notes
