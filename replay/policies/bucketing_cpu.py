"""Gradient re-bucketing of a CPU (gloo) DDP trace (used by ``overlap.bucket_mb``).

The all-reduces run on CPU threads and the trace has the DDP reducer's per-parameter ranges,
so :func:`rebucket_cpu` models parameters, not buckets:

* parameters: the reducer's ``mul_out`` ranges of a step, in order (the copy of a gradient
  into its bucket: the gradient's ready time), each matched to its ``copy_bucket_to_grad``
  range after backward; a parameter belongs to the old bucket whose issue call follows it;
* parameter sizes: exact when the trace's ``meta["ddp_param_bytes"]`` lists the gradient
  bytes of the model's parameters (``[p.numel() * p.element_size() for p in
  model.parameters()]``: whoever captured the run has the model; the Kineto trace does not
  keep the shapes of the reducer's ranges). They are matched to the ready order as DDP's
  initial buckets are (reverse registration order), else taken as listed (a list in ready
  order), else by the rank of their copy times (the first copy of a step is slow: a few-byte
  parameter can swap with a few-KB one), and accepted only if every old bucket's bytes are
  exactly the sum of its parameters';
  otherwise a :class:`PolicyError` says so. Without the list, a parameter's size is its
  old bucket's bytes split in proportion to the median (over ranks and steps) of its two
  copy times less the smallest (memory-bound copies: time ~ bytes; a few-KB parameter
  comes out tens of KB: the copies' fixed cost is not all removed);
* new buckets by DDP's rule (``compute_bucket_assignment_by_size``, as in the rebuilt
  buckets after the first iteration): parameters in ready order join the open bucket, which
  closes once it holds ``>= bucket_mb`` bytes; no separate first-bucket cap (DDP applies
  its 1 MiB first bucket only when ``bucket_cap_mb`` is left at its default);
* a new bucket is issued when its last gradient is ready (after the training-thread op
  running then) and the training thread waits for it before copying its first parameter
  back; the old issue calls stay, costing the fastest measured issue call; the buckets of
  a rank run in order on one gloo thread;
* the rank's CPU is one shared device: the training thread keeps a core busy, so while a
  gloo all-reduce runs both progress at ``1 / (1 + i)`` of their rate (``i = 1``: the two
  threads time-share one core; ``overlap.interference = f`` gives ``i = 1 - f``). The
  measured durations already carry that slowdown where they overlapped, so the isolated work
  of every training-thread op and the isolated transfer of every old bucket are the
  measured ones less ``i / (1 + i)`` of their overlap with the other kind; the replay runs
  on the contention path and puts the slowdown back wherever the new buckets overlap.
  Which ``i``: a gloo transfer that alone keeps ``rho`` of a core busy (it waits on the
  peer's socket the rest of the time) overlapped with a training thread that keeps one core
  busy, on ``c`` cores per rank, ends ``i T`` late with ``i = min(1, max(0, 1 + rho - c))``
  (the engine's ``T_c + i T_m``); bench/whatif_real.py probes ``rho`` (0.95 with the
  ranks undisturbed on a 2-core machine: ``i`` ~ 1, the default; 0.5-0.8 when other
  processes take the core while the transfer waits);
* **with the capture's overlap probe** (``overlap_probe`` in the job record,
  :class:`host_cpu.OverlapProbe`; the pair kit measures it before training) the two sides
  are not slowed alike, and the measured values replace ``i``: compute is slowed by the
  probe's compute slowdown (the CPU the transfer's copies take, 15-30% measured) and a
  transfer next to compute is capped so that, overlapping compute throughout, it takes the
  probe's time under compute at its size (under SCHED_RR a transfer waits for the
  scheduler at each hand-off: 1 MiB at 1600 Mbit/s took 18-27 ms next to compute, 1-5 ms
  alone). A cap, not a product with the link share: gloo runs a rank's all-reduces on its
  worker threads (the lanes the old buckets ran on), which the new buckets take in turn,
  and two transfers waiting on the scheduler each keep their own rate; on the link alone
  they share it (``ContentionModel(share_links=True, comm_cap=True)``);
* **without the probe**, the comm side's slowdown is fitted on the trace's own transfers
  (:func:`cpu_overlap.fit_comm_slowdown`: some ran under compute, some not); where the
  trace cannot show it (a one-bucket trace: no transfer ran under compute) a new bucket
  next to compute is capped, as with the probe, to last its link time plus the scheduler
  turns its ring's hand-offs wait (:func:`cpu_overlap.turn_delay_ns`: a fixed cost, not a
  rate, so a slow link hides it and a fast one does not), on the worker threads the trace
  shows; the compute side keeps the copy-rate estimate;
* the gaps between consecutive training-thread ops are the CPU time of their parent ops
  (the Kineto reader keeps leaf ops): each is folded into the op after it, so it is shared
  too; only a gap spent waiting for an old bucket (up to that bucket's end) is not;
* transfer time ``a + S f / B`` fitted on the isolated transfers (:mod:`.gloo_fit`; the
  intercept only when the sizes differ by 1.5x or more and the old buckets ran one at a
  time, else ``a`` is
  ``GLOO_STEP_US`` per ring step and ``B`` the link's aggregate: the total bytes over the
  total isolated time of the transfers, less the (rank, step)s whose transfers took over
  ``DISTURBED_X`` times the median time per byte: descheduled on a shared machine). Old
  buckets that ran concurrently on gloo's worker threads (``CONCURRENT_SHARE``) share one
  link: the isolated times split each shared instant equally, so a line through them
  charges a small latency-bound bucket half the link and fits a bandwidth the link never
  ran at (the emb pair's six buckets, two at a time: an intercept of 5.2 ms and 4.9
  Gbit/s on a 1600 Mbit/s link, the one 10 MB bucket replayed at 3.7 Gbit/s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retime.collectors.enums import CommOp, EdgeKind, LaneKind, OpKind, Phase
from retime.collectors.intervals import interval_union
from retime.collectors.trace import Trace

from .base import ranks_per_node_of
from .cpu_overlap import (
    alone_mask,
    fit_comm_slowdown,
    fit_interference,
    isolated_transfer,
    overlap_ns,
    turn_delay_ns,
)
from .ddp_params import bucket_of, exact_sizes
from .gloo_fit import _fit_cpu, _new_credits, _probe_alone_ns, _ran_concurrently
from .host_cpu import OverlapProbe, cpu_interference_of, ddp_ranges, overlap_probe
from .link_fit import TCP_GOODPUT, bound_by_stated_rate, shaped_link

__all__ = ["rebucket_cpu", "CpuModel"]


# ---------------------------------------------------------------------------- CPU (gloo) DDP
@dataclass
class CpuModel:
    """What :class:`~replay.policies.overlap.Overlap` needs to replay re-bucketed CPU ranks
    on the contention path (op-id order of the new trace)."""

    work_ns: np.ndarray  # isolated work of the ranks' training-thread ops (NaN: unchanged)
    compute: np.ndarray  # bool: training-thread ops (compute resource of their rank's CPU)
    cpu_rank: np.ndarray  # bool: ops of ranks modeled as one shared CPU
    interference: float  # the interference the isolated work was derived with
    #: the communication side's own slowdown per op (the capture's overlap probe,
    #: host_cpu.OverlapProbe); None: ``interference`` for both sides
    comm_slowdown: np.ndarray | None = None
    #: transfers share their ranks' links and are capped, not slowed, next to compute
    #: (engine.ContentionModel.comm_cap): set with the probe's model
    comm_cap: bool = False


def _cpu_lanes_only(trace: Trace, ids: np.ndarray) -> bool:
    lanes = trace.lanes
    lk = dict(zip(lanes["lane"].to_numpy().tolist(), lanes["lane_kind"].to_numpy().tolist(),
                  strict=True))
    return all(lk.get(int(x)) == LaneKind.CPU_THREAD
               for x in np.unique(trace.ops["lane"].to_numpy()[ids]))


def rebucket_cpu(trace: Trace, bucket_mb: float, interference: float | None,
                 ranks_per_node: int | None = None, probe_bound: str | None = None,
                 stated_gbps: float | None = None, link_bound: bool = False):
    """Re-bucket a CPU (gloo) DDP trace parameter by parameter (module docstring).
    ``stated_gbps``: the user's nominal rate of the inter-host link (bytes per ns), which
    bounds the bytes of a new bucket beyond the largest old one where ``link_bound`` (the
    range's upper bound; plain traces only, :func:`link_fit.bound_by_stated_rate`).

    Returns ``(new trace, new op ids, modeled transfer ns, info, CpuModel)`` or None when the
    trace lacks what the model needs (collectives off CPU threads, no DDP reducer ranges,
    parameter counts that do not match between steps).
    """
    o = trace.ops
    kind = o["kind"].to_numpy()
    cop = o["comm_op"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    is_ar = (kind == OpKind.COLLECTIVE) & (cop == CommOp.ALL_REDUCE) & (nbytes > 0)
    phase = o["phase"].to_numpy()
    if (phase[is_ar] == Phase.BWD).any():
        is_ar &= phase == Phase.BWD
    ar_ids = np.flatnonzero(is_ar)
    rr = ddp_ranges(trace)
    if len(ar_ids) == 0 or rr is None or not _cpu_lanes_only(trace, ar_ids):
        return None
    rank = o["rank"].to_numpy()
    step = o["step"].to_numpy()
    lane = o["lane"].to_numpy()
    start = o["start_ns"].to_numpy().astype(np.int64)
    dur = o["dur_ns"].to_numpy().astype(np.int64)
    end = start + dur
    coll = o["coll_id"].to_numpy()
    e = trace.edges
    esrc, edst = e["src"].to_numpy(), e["dst"].to_numpy()
    # transfer start of each old bucket: its last member's start
    a_start = start.copy()
    cs = pd.Series(start[ar_ids]).groupby(coll[ar_ids]).transform("max").to_numpy()
    a_start[ar_ids] = np.where(coll[ar_ids] >= 0, cs, start[ar_ids])
    # issue ops: the non-collective predecessors of the old buckets
    feed = np.isin(edst, ar_ids) & ~is_ar[esrc] & (kind[esrc] != OpKind.COLLECTIVE)
    issue_of = dict(zip(edst[feed].tolist(), esrc[feed].tolist(), strict=True))
    if len(issue_of) < len(ar_ids):
        return None
    issue = np.zeros(len(o), bool)
    issue[list(issue_of.values())] = True
    floor_ns = float(np.min(dur[issue]))
    keys = pd.Series(ar_ids).groupby([rank[ar_ids], step[ar_ids]]).groups
    # per (rank, step): its parameters in ready order
    per = {}
    for (r, s), idx in keys.items():
        ids = ar_ids[np.asarray(idx)]
        ids = ids[np.lexsort((ids, start[ids]))]
        main = int(lane[issue_of[int(ids[0])]])
        own = np.flatnonzero((rank == r) & (step == s) & (lane == main))
        lo, hi = int(start[own].min()), int(end[own].max())
        tabs = []
        for key in ("ready", "back"):
            x = rr[key]
            x = x[(x["rank"].to_numpy() == r) & (x["lane"].to_numpy() == main)
                  & (x["start_ns"].to_numpy() >= lo) & (x["start_ns"].to_numpy() < hi)]
            tabs.append(x)
        if len(tabs[0]) == 0 or len(tabs[0]) != len(tabs[1]):
            return None
        per[(r, s)] = (ids, main, tabs[0], tabs[1])
    n_par = {len(v[2]) for v in per.values()}
    if len(n_par) != 1:
        return None
    # parameter size weights: median copy time per parameter index over ranks and steps
    # (memory-bound copies: time ~ bytes), less the smallest one (the fixed cost)
    cost = np.median(np.stack([
        (v[2]["end_ns"].to_numpy() - v[2]["start_ns"].to_numpy())
        + (v[3]["end_ns"].to_numpy() - v[3]["start_ns"].to_numpy()) for v in per.values()]),
        axis=0).astype(np.float64)
    weight = np.maximum(cost - cost.min(), 1e-3 * max(cost.max(), 1.0))
    exact, source = exact_sizes(trace, per, weight, issue_of, start, nbytes)
    # the capture's own measurement of how a transfer and compute share the CPU, unless
    # overlap.interference was given
    given = interference is not None
    probe = overlap_probe(trace, probe_bound) if interference is None else None
    own_link = None
    if probe is not None:
        # the link as the trace's own buckets show it, without the probe: it prices the
        # floor of a new bucket's alone time (_probe_alone_ns)
        own = _build_cpu(trace, bucket_mb, cpu_interference_of(
            trace, per, exact, a_start, end, nbytes, ar_ids), ranks_per_node, per, weight,
            issue, issue_of, floor_ns, a_start, is_ar, exact, source, None, fit_comm=True,
            probe_bound=probe_bound)
        own_link = (own[3]["alpha_ns"], 1.0 / own[3]["busbw_gbps"])
        interference = probe.compute_slowdown
    elif interference is None:
        interference = cpu_interference_of(trace, per, exact, a_start, end, nbytes, ar_ids)
    return _build_cpu(trace, bucket_mb, interference, ranks_per_node, per, weight, issue,
                      issue_of, floor_ns, a_start, is_ar, exact, source, probe,
                      fit_comm=probe is None and not given, probe_bound=probe_bound,
                      own_link=own_link, stated_gbps=stated_gbps,
                      link_bound=link_bound)


def _build_cpu(trace, bucket_mb, interference, ranks_per_node, per, weight, issue, issue_of,
               floor_ns, a_start, is_ar, exact=None, source="copy times",
               probe: OverlapProbe | None = None, fit_comm: bool = False,
               probe_bound: str | None = None, own_link: tuple[float, float] | None = None,
               stated_gbps: float | None = None, link_bound: bool = False):
    o = trace.ops
    rank = o["rank"].to_numpy()
    lane = o["lane"].to_numpy()
    nbytes = o["bytes"].to_numpy()
    start = o["start_ns"].to_numpy().astype(np.int64)
    end = start + o["dur_ns"].to_numpy().astype(np.int64)
    S = float(bucket_mb) * 1e6
    keep_frac = interference / (1.0 + interference)  # wall time lost per overlapped ns
    main_of = {}
    for (r, _s), v in per.items():
        main_of.setdefault(int(r), v[1])
    # the gloo worker threads of each rank (the lanes its old buckets ran on, in order of
    # first use): with a capped model (the probe's, or the scheduler turns below) the new
    # buckets take them in turn, as the process group's work queue hands them out; without
    # it, one thread runs them in order (set once the model is known)
    workers = {}
    for r in main_of:
        x = np.flatnonzero(is_ar & (rank == r))
        x = x[np.argsort(start[x], kind="stable")]
        workers[r] = [int(v) for v in pd.unique(lane[x])]
    lane_ops = {}
    for r, m in main_of.items():
        x = np.flatnonzero((rank == r) & (lane == m))
        lane_ops[r] = x[np.lexsort((x, start[x]))]
    new_rows: list[dict] = []
    ready_edges, wait_edges = [], []
    wait_gap = {}  # old wait target -> ns of its measured gap spent waiting
    for (r, s), (ids, _main, rdy, back) in per.items():
        r = int(r)
        lops = lane_ops[r]
        ls = start[lops]
        mo_end = rdy["end_ns"].to_numpy()
        cb_start = back["start_ns"].to_numpy()
        cb_end = back["end_ns"].to_numpy()
        k_of = bucket_of(ids, rdy, issue_of, start)
        size = np.zeros(len(mo_end)) if exact is None else exact
        for k, i in enumerate(ids.tolist()):
            m = k_of == k
            if not m.any():
                return None
            if exact is None:
                size[m] = nbytes[i] * weight[m] / weight[m].sum()
            # where the thread waited for old bucket k: the longest gap on the training
            # thread after backward (after the previous bucket's copies back) up to the
            # first op copying this bucket's first parameter back
            p0 = int(np.flatnonzero(m)[0])
            lo_t = cb_end[p0 - 1] if p0 > 0 and k > 0 else mo_end[-1]
            a = int(np.searchsorted(ls, lo_t, side="left"))
            b = int(np.searchsorted(ls, cb_start[p0], side="left"))
            if 0 < a <= b < len(lops):
                win = lops[a:b + 1]
                gaps = start[win] - end[lops[a - 1:b]]
                j = int(np.argmax(gaps))
                t, prev = int(win[j]), int(lops[a - 1 + j])
                wait_gap[t] = int(np.clip(end[i] - end[prev], 0, max(int(gaps[j]), 0)))
        # DDP's rule (reducer.cpp compute_bucket_assignment_by_size): parameters in ready
        # order join the open bucket, which closes once it holds >= bucket_cap bytes
        groups, cur, acc = [], [], 0.0
        for p in range(len(size)):
            cur.append(p)
            acc += size[p]
            if acc >= S:
                groups.append(cur)
                cur, acc = [], 0.0
        if cur:
            groups.append(cur)
        cum = np.rint(np.cumsum([size[g].sum() for g in groups])).astype(np.int64)
        cum[-1] = int(nbytes[ids].sum())
        b_new = np.diff(np.concatenate([[0], cum]))
        prev_sig = -(2**62)
        for j, g in enumerate(groups):
            pos = int(np.searchsorted(ls, mo_end[g[-1]], side="left")) - 1
            rop = int(lops[max(pos, 0)])
            sig = max(int(end[rop]), prev_sig)
            prev_sig = sig
            row = len(new_rows)
            wl = workers[r]
            new_rows.append({"rank": r, "lane": wl[j % len(wl)], "step": int(s),
                             "start_ns": sig, "dur_ns": 0, "bytes": int(b_new[j]),
                             "coll_j": j, "group_id": int(o["group_id"].iat[ids[0]])})
            ready_edges.append((rop, row))
            wpos = int(np.searchsorted(ls, cb_start[g[0]], side="left"))
            if wpos < len(lops):
                wait_edges.append((row, int(lops[wpos])))
    keys: dict = {}
    coll_base = int(o["coll_id"].max()) + 1
    for row in new_rows:
        key = (row["step"], row["group_id"], row["coll_j"])
        keys.setdefault(key, coll_base + len(keys))
        row["coll_id"] = keys[key]
    # training threads: fold the CPU time between consecutive ops into the later op
    new_start = start.copy()
    fold = np.zeros(len(o), np.int64)
    compute = np.zeros(len(o), bool)
    for lops in lane_ops.values():
        compute[lops] = True
        gap = start[lops[1:]] - end[lops[:-1]]
        wg = np.asarray([wait_gap.get(int(t), 0) for t in lops[1:]], np.int64)
        fold[lops[1:]] = np.maximum(gap - wg, 0)
    new_start -= fold
    # isolated work (see the module docstring): undo the measured interference
    cpu_rank = np.isin(rank, list(lane_ops))
    busy_hi = np.where(issue, start + int(floor_ns), end)
    work = np.full(len(o), np.nan)
    y = np.zeros(len(o))
    over_pts: list[np.ndarray] = []
    spans = {}
    for r, lops in lane_ops.items():
        tr = np.flatnonzero(is_ar & (rank == r))
        blo, bhi = interval_union(new_start[lops], np.maximum(busy_hi[lops], new_start[lops]))
        spans[r] = (tr, blo, bhi)
    comm_i, comm_fit, turns = None, None, False
    if probe is None and fit_comm:
        got = fit_comm_slowdown([(a_start[tr], end[tr], nbytes[tr], blo, bhi)
                                  for tr, blo, bhi in spans.values()], probe_bound)
        if got is not None:
            comm_i, comm_fit = got
        else:
            # the trace cannot show the comm side's slowdown (e.g. one bucket: no transfer
            # ran under compute): the scheduler turns its hand-offs wait (turn_delay_ns)
            turns = True
    if probe is None and not turns:
        for row in new_rows:  # one worker thread runs a rank's new buckets in order
            row["lane"] = workers[row["rank"]][0]
    for r, lops in lane_ops.items():
        tr, blo, bhi = spans[r]
        tlo, thi = interval_union(a_start[tr], end[tr])
        ov = overlap_ns(new_start[lops], busy_hi[lops], tlo, thi)
        work[lops] = (busy_hi[lops] - new_start[lops]) - keep_frac * ov
        y[tr] = isolated_transfer(a_start[tr], end[tr], blo, bhi,
                                   (interference if comm_i is None else comm_i)
                                   if probe is None else probe.comm_slowdown(nbytes[tr]))
        solo = alone_mask(a_start[tr], end[tr])
        over_pts.append(np.stack([nbytes[tr][solo].astype(np.float64),
                                  overlap_ns(a_start[tr][solo], end[tr][solo], blo, bhi),
                                  (end[tr] - a_start[tr])[solo].astype(np.float64)], axis=1))
    alpha, inv_b, f = _fit_cpu(trace, is_ar, nbytes, y, ranks_per_node,
                               concurrent=_ran_concurrently(spans, a_start, end))
    n_ring = int(round(2.0 / max(2.0 - f, 1e-9)))  # f = 2 (n - 1) / n
    shaper = shaped_link(trace) if _crosses_hosts(trace) else None
    credit = np.zeros(len(new_rows))
    if shaper is not None:
        # a declared shaped link (link_fit.shaped_link): its own rate paces the transfers,
        # not a fit on transfers that shared the core with the backward pass; each new
        # bucket spends the tokens saved since the one before
        inv_b = 1.0 / (shaper[0] * TCP_GOODPUT)
        credit = _new_credits(new_rows, alpha, inv_b, f, shaper)
    model_ns = np.asarray([alpha + max(row["bytes"] * f - c, 0.0) * inv_b
                           for row, c in zip(new_rows, credit, strict=True)])
    bound = None
    if shaper is None and probe is None and _crosses_hosts(trace):
        # a plain trace's fit beyond its largest transfer: at most the stated link rate
        bounded_ns, bound = bound_by_stated_rate(
            np.asarray([row["bytes"] for row in new_rows], np.float64) * f, model_ns, alpha,
            inv_b, float(nbytes[is_ar].max()) * f, stated_gbps)
        if link_bound:
            model_ns = bounded_ns
    if probe is not None and shaper is None:
        # no declared link: the calibration measured this cluster's all-reduce alone (the
        # link's own behaviour, e.g. a token bucket's burst, is in those times)
        b_new = np.asarray([row["bytes"] for row in new_rows], np.float64)
        model_ns = _probe_alone_ns(probe, b_new, f, own_link)
    if probe is not None or turns:
        # the members of a ring all-reduce finish together (the last chunk reaches both), and
        # one cap per collective: each member's transfer as long as the slowest one's (its
        # ranks' token credits differ); without that, a member left running alone after its
        # peers finished would be capped by their next compute
        cid = np.asarray([row["coll_id"] for row in new_rows])
        model_ns = pd.Series(model_ns).groupby(cid).transform("max").to_numpy()
    t, new_ids, keep = _assemble_cpu(trace, is_ar, new_rows, ready_edges, wait_edges,
                                     new_start, fold, compute)
    n_new = len(new_rows)
    pad = lambda a, v: np.concatenate([a[keep], np.full(n_new, v, a.dtype)])  # noqa: E731
    comm = None
    if probe is not None:
        # new buckets: stretched to the probe's time under compute; other ops of the ranks
        # (kept collectives): the probe's own ratio at their size
        b_new = np.asarray([row["bytes"] for row in new_rows], np.float64)
        kb = nbytes[keep].astype(np.float64)
        kept = np.where(kb > 0, probe.comm_slowdown(np.maximum(kb, 1.0)), interference)
        comm = np.concatenate([kept, probe.comm_slowdown(b_new, model_ns)])
    if comm is None and comm_i is not None:
        comm = np.full(len(keep) + n_new, float(comm_i))
    turn_ns = turn_delay_ns(n_ring, probe_bound) if turns else None
    if turns:
        # a new bucket overlapping compute throughout lasts its link time plus the turns
        # (a cap, as the probe's: each worker thread waits on the scheduler, not the
        # link); kept collectives and compute keep the copy-rate estimate
        comm = np.concatenate([np.full(len(keep), float(interference)),
                               turn_ns / np.maximum(model_ns, 1.0)])
    cpu = CpuModel(work_ns=pad(work, np.nan), compute=pad(compute, False),
                   cpu_rank=pad(cpu_rank, True), interference=float(interference),
                   comm_slowdown=comm, comm_cap=probe is not None or turns)
    info = {"buckets_before": int(is_ar.sum()), "buckets_after": n_new, "alpha_ns": alpha,
            "busbw_gbps": 1.0 / inv_b if inv_b > 0 else float("inf"),
            "bucket_mb": float(bucket_mb), "interference": float(interference),
            "interference_fit": fit_interference(np.concatenate(over_pts)),
            "param_sizes": source, "model": "cpu-ddp",
            "contention": ("the capture's overlap probe" if probe is not None else
                           "fitted on the trace's transfers" if comm_fit is not None else
                           "scheduler turns per hand-off (assumed)" if turns else
                           "symmetric, from the host's copy rate")}
    if turns:
        info["turn_delay_ms"] = turn_ns / 1e6
    if bound is not None:
        info["link_bound"] = bound
    if comm_fit is not None:
        info.update(comm_fit)
    if comm is not None:
        info["comm_slowdown"] = float(np.median(comm[len(keep):])) if n_new else 0.0
    return t, new_ids, model_ns, info, cpu


def _crosses_hosts(trace: Trace) -> bool:
    """Whether the trace's ranks sit on more than one host (its all-reduces cross a link)."""
    return ranks_per_node_of(trace) < len(np.unique(trace.ops["rank"].to_numpy()))


def _assemble_cpu(trace, is_ar, new_rows, ready_edges, wait_edges, new_start, fold, compute):
    o = trace.ops
    keep = np.flatnonzero(~is_ar)
    n_keep = len(keep)
    new_id = np.full(len(o), -1, np.int64)
    new_id[keep] = np.arange(n_keep)
    kept = o.iloc[keep].copy()
    kept["start_ns"] = new_start[keep]
    kept["dur_ns"] = o["dur_ns"].to_numpy()[keep] + fold[keep]
    first_ar = int(np.flatnonzero(is_ar)[0])
    add = pd.DataFrame({c: np.repeat(o[c].to_numpy()[first_ar:first_ar + 1], len(new_rows))
                        for c in o.columns})
    for c in ("rank", "lane", "start_ns", "dur_ns", "step", "bytes", "group_id", "coll_id"):
        add[c] = np.asarray([row[c] for row in new_rows]).astype(o[c].dtype)
    add["phase"] = np.int8(Phase.BWD)
    ops = pd.concat([kept, add[list(o.columns)]], ignore_index=True)
    ops["op_id"] = np.arange(len(ops), dtype=np.int64)
    e = trace.edges
    esrc, edst = e["src"].to_numpy(), e["dst"].to_numpy()
    ok = ~is_ar[esrc] & ~is_ar[edst]
    lag = e["lag_ns"].to_numpy().copy()
    # a training-thread gap is now inside the later op (compute) or a wait on a new bucket
    lane = o["lane"].to_numpy()
    same = compute[edst] & (lane[esrc] == lane[edst])
    lag[same] = 0
    src = [new_id[esrc[ok]]]
    dst = [new_id[edst[ok]]]
    kinds = [e["kind"].to_numpy()[ok]]
    lags = [lag[ok]]
    if ready_edges:
        rs, rd = np.asarray(ready_edges, np.int64).T
        src.append(new_id[rs])
        dst.append(n_keep + rd)
        kinds.append(np.full(len(rs), int(EdgeKind.DATA), np.int8))
        lags.append(np.zeros(len(rs), np.int64))
    if wait_edges:
        ws, wd = np.asarray(wait_edges, np.int64).T
        src.append(n_keep + ws)
        dst.append(new_id[wd])
        kinds.append(np.full(len(ws), int(EdgeKind.SYNC), np.int8))
        lags.append(np.zeros(len(ws), np.int64))
    edges = pd.DataFrame({"src": np.concatenate(src).astype(np.int64),
                          "dst": np.concatenate(dst).astype(np.int64),
                          "kind": np.concatenate(kinds).astype(np.int8),
                          "lag_ns": np.concatenate(lags).astype(np.int64)})
    t = Trace(ops=ops, lanes=trace.lanes, edges=edges, ranges=trace.ranges, groups=trace.groups,
              memory=trace.memory, strings=trace.strings, meta=dict(trace.meta))
    return t, np.arange(n_keep, len(ops), dtype=np.int64), keep
