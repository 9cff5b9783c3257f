"""Overlap what-ifs: serialize communication with compute, gradient bucketing (bucket size,
per-layer WFBP, one bucket, MG-WFBP merging) and compute/communication interference.

* ``mode = "serial"``: on every device a communication op starts after the compute ops that
  started before it have ended (on each compute lane, the last one that started before it),
  and the next compute op of each compute lane waits for it: no communication is hidden.
  ``"async"`` keeps the trace's overlap (measured, or modeled by the synthesizer).
* ``bucket_mb``: data-parallel gradient bucket size (synthesized runs are re-synthesized
  with each bucket reduced as soon as its gradients are ready, ``grad_overlap``;
  measured traces are re-bucketed by :func:`replay.policies.bucketing.rebucket`; CPU (gloo)
  DDP traces parameter by parameter with the rank's CPU shared by compute and gloo, by
  :func:`replay.policies.bucketing.rebucket_cpu`, whose interference is
  ``1 - overlap.interference``, by default the trace's own: the gloo transfer's CPU-busy
  share from the host's measured copy rate (:func:`host_cpu.cpu_interference_of`), or
  ``CPU_INTERFERENCE`` when the trace cannot tell).
* ``merge``: ``"wfbp"`` one all-reduce per layer (wait-free backprop), ``"single"`` one
  all-reduce after backward, ``"mgwfbp"`` merged-gradient WFBP: the best merge of ``k``
  adjacent layers' gradients per bucket, searched over every ``k`` from one layer to the
  whole model with the synthesizer's alpha-beta costs (it contains both end points, so it is
  never slower than per-layer WFBP or a single bucket; MG-WFBP's optimal merge, Shi et al.
  INFOCOM 2019, restricted to uniform merges).
* ``interference``: fraction of the ideal overlap achieved while compute and communication
  run together on one device (C3: 0.21 naive, 0.42 with prioritization and CU partitioning,
  0.72 with DMA-offloaded collectives; 1.0 = perfect overlap). The contention path runs both
  at ``1 / (2 - f)`` of their rates while they overlap, which achieves exactly the fraction
  ``f = (T_serial - T_overlap) / (T_serial - max(T_comp, T_comm))`` for any pair of lengths.
  Durations are taken as isolated times: on a measured trace, whose kernels already ran
  overlapped, it is an *additional* slowdown.
* ``sm_share``: the share of a GPU's SMs NCCL kernels hold (channels / SMs; 0 = collectives
  on DMA engines): compute and NCCL kernels slow each other where they overlap by the C3
  calibration of :mod:`collectors.costs.interference` (:mod:`.interference_gpu`); measured
  GPU traces re-bucketed by ``bucket_mb`` get the trace's own share on the new overlap.
* ``tp_slices``: tensor-parallel communication overlapped with the GEMM that produces it by
  slicing both into ``k`` chunks (Megatron's TP comm overlap): chunk ``i``'s collective runs
  while the GEMM computes chunk ``i+1``, so only the last chunk's collective stays exposed:
  ``t' = max(t / k, t - T_gemm (k-1) / k) + (k-1) c`` (``c`` the fixed cost of one call:
  the intra-node link's ``base_us``, 8 us when unknown). Applies to collectives on
  tensor-parallel lanes (named ``tp``).
* ``prefetch``: FSDP / ZeRO-3 forward prefetch depth of a synthesized run (the gather of
  layer ``j`` is issued when layer ``j - prefetch`` starts; 0 = when layer ``j - 1`` ends,
  no overlap; the synthesizer's default is 1). Each extra layer in flight keeps one more
  layer of gathered parameters in GPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError

from ..engine import ContentionModel
from ..graph_data import RES_COMM, RES_COMPUTE
from .base import (
    STRUCTURE_COLUMNS,
    Policy,
    WhatIfState,
    by_op,
    check_choice,
    check_fraction,
    check_int,
    check_positive,
    frozen,
    known_fields,
    layout_of,
)

#: interference of communication with compute on a rank's CPU (gloo): the training thread
#: keeps the rank's core busy, so the communication thread time-shares it and both progress
#: at ``1 / (1 + 1)`` of their rate while they overlap (``overlap.interference`` = 0)
CPU_INTERFERENCE = 1.0

__all__ = ["Overlap", "serialize_edges", "MERGES"]

MERGES = ("wfbp", "single", "mgwfbp")
_TINY_MB = 1e-9  # every layer its own bucket


@dataclass(frozen=True)
class Overlap(Policy):
    """Communication/compute overlap what-ifs (see the module docstring)."""

    mode: str | None = None
    bucket_mb: float | None = None
    merge: str | None = None
    interference: float | None = None
    share_links: bool | None = None
    tp_slices: int | None = None
    prefetch: int | None = None
    #: which repetitions of a calibration's overlap probe to use: the median (None) or the
    #: fastest / slowest ("low" / "high": the prediction range's bounds)
    probe_bound: str | None = None
    #: share of the GPU's SMs NCCL kernels hold (channels / SMs; 0 = collectives on DMA
    #: engines): compute and communication slow each other where they overlap
    #: (:mod:`.interference_gpu`)
    sm_share: float | None = None
    #: price NCCL collectives and their interference at the low / high end of the cost
    #: model's range (the prediction range's bounds)
    cost_bound: str | None = None
    #: how a measured bucket's wait for untraced ranks carries to new buckets: "lag" (they
    #: lag as measured), "bytes" (the wait per step spread by bytes); default the smaller
    #: per bucket (:func:`.bucketing.rebucket`); each alone is a bound of the range
    peer_wait: str | None = None
    #: a plain CPU trace's new buckets larger than any transfer its link fit saw: bytes
    #: beyond it at the stated link rate ("stated": the prediction range's upper bound,
    #: :func:`.link_fit.bound_by_stated_rate`); default the fit, extrapolated
    link_bound: str | None = None
    table: ClassVar[str] = "overlap"

    def __post_init__(self) -> None:
        check_choice("overlap", "mode", self.mode, ("serial", "async"))
        check_positive("overlap", "bucket_mb", self.bucket_mb)
        check_choice("overlap", "merge", self.merge, MERGES)
        check_fraction("overlap", "interference", self.interference)
        check_int("overlap", "tp_slices", self.tp_slices)
        check_int("overlap", "prefetch", self.prefetch, lo=0)
        check_choice("overlap", "probe_bound", self.probe_bound, ("low", "high"))
        check_fraction("overlap", "sm_share", self.sm_share)
        check_choice("overlap", "cost_bound", self.cost_bound, ("low", "high"))
        check_choice("overlap", "link_bound", self.link_bound, ("stated",))
        check_choice("overlap", "peer_wait", self.peer_wait, ("bytes", "lag"))
        if self.sm_share is not None and self.interference is not None:
            raise PolicyError("overlap.sm_share and overlap.interference both set: sm_share "
                              "derives the interference of NCCL kernels from the SMs they "
                              "hold; give one of them")
        if self.share_links is not None and not isinstance(self.share_links, bool):
            raise PolicyError(f"overlap.share_links={self.share_links!r} must be true/false")
        if self.bucket_mb is not None and self.merge is not None:
            raise PolicyError("overlap.bucket_mb and overlap.merge both set: the merge rule "
                              "chooses the buckets; give one of them")

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Re-bucketing a measured trace finds the backward all-reduces by phase and builds
        the new buckets from the columns read; the overlap mode, interference and the
        range's bounds re-time what is there: :data:`.base.STRUCTURE_COLUMNS`. ``merge``
        and ``prefetch`` (synthesized runs only) are not audited."""
        return STRUCTURE_COLUMNS if not fields & {"merge", "prefetch"} else None

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store buckets and merges change the run's config
        (re-synthesized) and the other keys re-time the collectives and TP ops where they
        are; ``prefetch`` re-wires the ZeRO-3 gathers by micro-batch, chunk, layer and
        phase."""
        if not fields <= known_fields(cls):
            return None
        return ("phase", "layer", "microbatch", "chunk") if "prefetch" in fields else ()

    def configure(self, state: WhatIfState) -> None:
        if self.cost_bound is not None:
            state.notes["cost_bound"] = self.cost_bound  # parallel.tp's TP all-reduces read it
        if self.bucket_mb is None and self.merge is None:
            return
        if not state.is_synth:
            if self.merge is not None:
                raise PolicyError(
                    "overlap.merge needs the per-layer gradient sizes of a synthesized run; "
                    "this trace is measured (no meta['synth']): give overlap.bucket_mb "
                    "instead, or synthesize the job (`retime synth`)")
            from .bucketing import rebucket, rebucket_cpu
            base_trace = state.trace
            # without a given overlap.interference the trace's own (bucketing_cpu)
            i = None if self.interference is None else 1.0 - self.interference
            cpu = rebucket_cpu(state.trace, self.bucket_mb, i, state.ranks_per_node,
                               self.probe_bound, state.notes.get("stated_inter_node_gbps"),
                               self.link_bound == "stated")
            if cpu is not None:
                state.trace, ids, model_ns, info, state.notes["cpu_model"] = cpu
                lb = info.get("link_bound")
                if lb is not None and self.link_bound is None:
                    _link_bound_line(state, lb)
                fitted = "comm_slowdown_fit" in info
                if fitted:
                    lo_i, hi_i = info["comm_slowdown_bounds"]
                    state.assume(
                        f"overlapped gloo transfers progressed at 1/(1+{info['comm_slowdown_fit']:.2f})"
                        f" of their rate next to compute, fitted on the trace's own transfers "
                        f"({info['transfers_under_compute']} mostly under compute, "
                        f"{info['transfers_free']} mostly not); compute loses "
                        f"i={float(cpu[4].interference):.2f} (from the host's copy rate, not "
                        f"measured); the range spans the fit's {lo_i:.2f}-{hi_i:.2f}; pass "
                        "--calibration (overlap probe) or set overlap.interference",
                        bounded=True, bounds=None if self.probe_bound is not None else
                        [{"overlap.probe_bound": "low"}, {"overlap.probe_bound": "high"}])
                elif "turn_delay_ms" in info:
                    state.assume(
                        f"overlapped gloo transfers each lose {info['turn_delay_ms']:.0f} ms next "
                        "to compute: the trace has no transfer both under compute and not to "
                        "measure it, so each hand-off of the ring waits a scheduler turn "
                        "(Linux's default 3 ms slice; not measured); compute loses "
                        f"i={float(cpu[4].interference):.2f} (from the host's copy rate); the "
                        "range spans half to twice the hand-offs; pass --calibration (overlap "
                        "probe) or set overlap.interference",
                        bounded=True, bounds=None if self.probe_bound is not None else
                        [{"overlap.probe_bound": "low"}, {"overlap.probe_bound": "high"}])
                elif cpu[4].comm_slowdown is not None and self.probe_bound is None:
                    # the probe's repetitions vary: the range replays the fastest and slowest
                    state.notes.setdefault("range_variants", []).extend(
                        [{"overlap.probe_bound": "low"}, {"overlap.probe_bound": "high"}])
                if self.interference is None and cpu[4].comm_slowdown is None:
                    # how a transfer and the training thread share the CPU is not measured
                    # (no calibration): the estimate stands, the range spans its bounds
                    i = float(cpu[4].interference)
                    state.assume(
                        f"CPU interference of overlapped gloo transfers with compute i={i:.2f}, "
                        "estimated from the host's copy rate (not measured: no calibration); "
                        "the range spans i=0 (free overlap) to i=1 (full time-sharing); set "
                        "overlap.interference or pass --calibration",
                        bounds=[{"overlap.interference": 1.0}, {"overlap.interference": 0.0}])
            else:
                state.trace, ids, model_ns, info = rebucket(state.trace, self.bucket_mb,
                                                            state.ranks_per_node,
                                                            self.cost_bound, self.peer_wait)
                for k, line in enumerate(info.get("assumed", [])):
                    # the range: the same what-if priced at the model's ends, and with the
                    # untraced ranks lagging as measured
                    var = None
                    if k == 0 and self.cost_bound is None:
                        var = [{"overlap.cost_bound": "low"}, {"overlap.cost_bound": "high"}]
                    elif k == 1 and self.peer_wait is None:
                        var = [{"overlap.peer_wait": "lag"}, {"overlap.peer_wait": "bytes"}]
                    state.assume(line, bounds=var)
            state.notes["rebucket"] = (ids, model_ns, info)
            if info.get("model") == "nccl":  # GPU: the new overlap's interference is priced
                state.notes["gpu_base"] = (base_trace, info["kept_ops"])
            return
        if state.synth.parallel.get("dp", 1) * state.synth.parallel.get("cp", 1) <= 1:
            raise PolicyError("overlap.bucket_mb / merge: the run has no data parallelism "
                              "(dp*cp = 1): there is no gradient all-reduce to bucket")
        # buckets and merges are the overlapped (wait-free) reduction's knobs
        state.synth.set_parallel(grad_overlap=True)
        if self.bucket_mb is not None:
            state.synth.set_parallel(bucket_mb=float(self.bucket_mb))
        elif self.merge == "wfbp":
            state.synth.set_parallel(bucket_mb=_TINY_MB)
        elif self.merge == "single":
            state.synth.set_parallel(bucket_mb=_grad_mb(state)[1])
        else:
            state.synth.set_parallel(bucket_mb=_best_merge(state))

    def edit(self, state: WhatIfState) -> None:
        if self.prefetch is None:
            return
        if not state.is_synth:
            raise PolicyError("overlap.prefetch re-wires ZeRO-3/FSDP parameter gathers of a "
                              "synthesized run; this trace is measured (no meta['synth'])")
        state.trace, extra = _rewire_prefetch(state.trace, int(self.prefetch))
        state.memory_delta_bytes += extra
        state.pure = True

    def apply(self, state: WhatIfState) -> None:
        d = self.describe()
        if self.tp_slices is not None and self.tp_slices > 1:
            d["tp_ops"] = _slice_tp(state, int(self.tp_slices))
        if "rebucket" in state.notes:
            ids, model_ns, info = state.notes["rebucket"]
            state.dur[ids] = model_ns
            d.update({k: info[k] for k in ("buckets_before", "buckets_after", "model",
                                           "alpha_ns", "busbw_gbps", "interference_fit", "param_sizes",
                                           "contention", "comm_slowdown", "algorithm",
                                           "protocol", "channels", "channels_source",
                                           "priced", "kappa", "kappa_source",
                                           "waiting_kept", "sources", "comm_slowdown_fit",
                                           "comm_slowdown_bounds", "transfers_under_compute",
                                           "transfers_free", "turn_delay_ms")
                      if k in info})
        if self.sm_share is not None or "gpu_base" in state.notes:
            # NCCL kernels slow the compute they overlap (and back): at the share asked, or
            # the trace's own where a re-bucketing moved the overlap
            from .interference_gpu import apply_sm_share
            d.update(apply_sm_share(state, self.sm_share, self.cost_bound,
                                    state.notes.get("gpu_base")))
        if "cpu_model" in state.notes:
            _cpu_contention(state, state.notes["cpu_model"])
            d["interference_used"] = 1.0 - state.contention.slowdown  # derived, not a key
        if self.mode == "serial":
            m = state.graph.memo()
            if "serialize_edges" not in m:  # a per-graph constant: computed once per graph
                m["serialize_edges"] = tuple(frozen(x) for x in serialize_edges(state.graph))
            src, dst = m["serialize_edges"]
            state.add_edges(src, dst)
            state.notes["serialize_edges"] = int(len(src))
        if (self.interference is not None or self.share_links) and "cpu_model" not in state.notes \
                and self.sm_share is None:
            f = 1.0 if self.interference is None else float(self.interference)
            state.mode = "contention"
            state.contention = ContentionModel(slowdown=1.0 - f,
                                               share_links=bool(self.share_links))
        if self.merge == "mgwfbp" and state.is_synth:
            d["chosen_bucket_mb"] = state.synth.parallel["bucket_mb"]
        state.applied.append(d)


def _cpu_contention(state: WhatIfState, cpu) -> None:
    """Replay re-bucketed CPU ranks on the contention path: each rank's CPU is one device
    whose training-thread ops (isolated work) and collectives share it (module docstring)."""
    import dataclasses

    g = state.graph
    have = cpu.compute & np.isfinite(cpu.work_ns)
    state.dur[have] = np.maximum(cpu.work_ns[have], 0.0)
    dev = by_op(g, "device").copy()
    res = by_op(g, "resource").copy()
    delay = by_op(g, "delay_ns").copy()
    rank = np.asarray(g.rank)  # already in op-id order (graph.py), unlike the kernel arrays
    base = int(dev.max()) + 1 if len(dev) else 0
    on = cpu.cpu_rank
    dev[on] = base + np.unique(rank[on], return_inverse=True)[1]
    res[on & cpu.compute] = RES_COMPUTE
    # what is left of a training thread's measured gaps is waiting, re-derived by the replay
    delay[on] = 0
    state.graph = dataclasses.replace(
        g, device=np.ascontiguousarray(layout_of(g, dev).astype(g.device.dtype)),
        resource=np.ascontiguousarray(layout_of(g, res).astype(g.resource.dtype)),
        delay_ns=np.ascontiguousarray(layout_of(g, delay).astype(g.delay_ns.dtype)))
    state.mode = "contention"
    state.contention = ContentionModel(slowdown=cpu.interference, share_compute=False,
                                       share_links=cpu.comm_cap,
                                       comm_slowdown=cpu.comm_slowdown, comm_cap=cpu.comm_cap)


def _grad_mb(state: WhatIfState) -> tuple[float, float, int]:
    """(largest layer's gradient MB, all gradients' MB (one bucket), number of pieces)."""
    spec = state.synth
    from retime.collectors.synth import CommModel, model_template, resolve_parallel
    par = resolve_parallel(dict(spec.parallel))
    tpl = model_template(spec.model, spec.hardware, par, CommModel(spec.hardware, par))
    pieces = [lt for lt in (tpl.embed, *tpl.layers, tpl.head) if lt is not None]
    per_layer = max(lt.params for lt in tpl.layers) * tpl.grad_bytes_per_param / 1e6
    total = sum(lt.params for lt in pieces) * tpl.grad_bytes_per_param / 1e6
    return per_layer, total * 1.001, len(pieces)


def _best_merge(state: WhatIfState) -> float:
    """Bucket size (MB) of the fastest uniform merge of k adjacent layers' gradients."""
    spec = state.synth
    per_layer, total, n_layers = _grad_mb(state)
    ks = sorted(set([1, n_layers] + np.unique(np.geomspace(1, n_layers, 12).round()).astype(int).tolist()))
    best, best_t = _TINY_MB, None
    import copy
    for k in ks:
        mb = _TINY_MB if k == 1 else (total if k >= n_layers else k * per_layer * 0.999)
        trial = copy.copy(spec)
        trial.parallel = dict(spec.parallel, bucket_mb=mb)
        t = trial.synthesize().meta["synth"]["step_time_ns"]
        if best_t is None or t < best_t:
            best, best_t = mb, t
    return float(best)


def serialize_edges(g) -> tuple[np.ndarray, np.ndarray]:
    """Edges that forbid communication from overlapping compute on its device.

    A communication op sits between the compute ops around its measured start; a pipeline
    send or receive paired with its peer (one ``coll_id``) around the pair's transfer start
    (the later member's start), since one that started first spent the time until then
    waiting for its peer, not transferring: placed at its own start, the compute it waited
    through would wait for its peer in turn, a cycle when that compute feeds the peer."""
    dev = by_op(g, "device")
    res = by_op(g, "resource")
    start = _p2p_transfer_starts(g)
    lane = g.lane
    on = dev >= 0
    comm = np.flatnonzero(on & (res == RES_COMM))
    comp = np.flatnonzero(on & (res == RES_COMPUTE))
    if len(comm) == 0 or len(comp) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    src, dst = [], []
    # one pass per compute lane (a handful per device)
    for ln in np.unique(lane[comp]).tolist():
        ops = comp[lane[comp] == ln]
        ops = ops[np.lexsort((ops, start[ops]))]
        d = int(dev[ops[0]])
        cm = comm[dev[comm] == d]
        if len(cm) == 0:
            continue
        pos = np.searchsorted(start[ops], start[cm], side="right")
        before = pos > 0
        src.append(ops[pos[before] - 1])
        dst.append(cm[before])
        after = pos < len(ops)
        src.append(cm[after])
        dst.append(ops[pos[after]])
    return (np.concatenate(src).astype(np.int64) if src else np.zeros(0, np.int64),
            np.concatenate(dst).astype(np.int64) if dst else np.zeros(0, np.int64))


def _p2p_transfer_starts(g) -> np.ndarray:
    """Measured starts in op order, a paired point-to-point op's moved to its pair's later
    member start."""
    start = g.meas_start_ns
    coll = by_op(g, "coll_of")
    p2p = (np.asarray(g.trace.ops["kind"].to_numpy()) == int(OpKind.P2P)) & (coll >= 0)
    if not p2p.any():
        return start
    idx = np.flatnonzero(p2p)
    last = np.full(int(coll[idx].max()) + 1, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last, coll[idx], start[idx])
    out = np.array(start, np.int64, copy=True)
    out[idx] = last[coll[idx]]
    return out


def _tp_ops(trace) -> np.ndarray:
    lanes = trace.lanes
    tp_lanes = lanes["lane"].to_numpy()[np.asarray(
        [str(n).split(" ")[0] == "tp" for n in lanes["name"]], bool)]
    o = trace.ops
    k = o["kind"].to_numpy()
    return np.flatnonzero(np.isin(o["lane"].to_numpy(), tp_lanes)
                          & ((k == OpKind.COLLECTIVE) | (k == OpKind.P2P)))


def _slice_tp(state: WhatIfState, k: int) -> int:
    idx = _tp_ops(state.trace)
    if len(idx) == 0:
        raise PolicyError("overlap.tp_slices: the trace has no tensor-parallel collectives "
                          "(no lane named 'tp'); nothing to overlap")
    t = state.trace
    e = t.edges
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    dur_meas = t.ops["dur_ns"].to_numpy().astype(np.float64)
    # the GEMM that produces the data: the edge predecessor that ends last
    prod = np.zeros(len(dur_meas))
    end = t.ops["start_ns"].to_numpy() + t.ops["dur_ns"].to_numpy()
    m = np.isin(dst, idx)
    best = {}
    for s_, d_ in zip(src[m].tolist(), dst[m].tolist(), strict=True):
        if d_ not in best or end[s_] > end[best[d_]]:
            best[d_] = s_
    for d_, s_ in best.items():
        prod[d_] = dur_meas[s_]
    c = (state.synth.hardware.intra.base_us if state.is_synth else 8.0) * 1e3
    tt = state.dur[idx]
    state.dur[idx] = np.maximum(tt / k, tt - prod[idx] * (k - 1) / k) + (k - 1) * c
    return int(len(idx))


def _rewire_prefetch(trace, depth: int):
    """Re-wire forward ZeRO-3 gathers to prefetch ``depth`` layers ahead."""
    import pandas as pd

    from retime.collectors.trace import Trace
    o = trace.ops
    names = trace.names()
    gat = np.flatnonzero(names == "zero3.allgather_params")
    if len(gat) == 0:
        raise PolicyError("overlap.prefetch: the run has no ZeRO-3/FSDP forward parameter "
                          "gathers; add parallel.zero=3 (or parallel.fsdp=true)")
    lane_name = dict(zip(trace.lanes["lane"].to_numpy().tolist(),
                         [str(x).split(" ")[0] for x in trace.lanes["name"]], strict=True))
    lane = o["lane"].to_numpy()
    comp = np.asarray([lane_name.get(int(x)) == "compute" for x in lane]) \
        & (o["phase"].to_numpy() == 0)
    key_cols = ["rank", "microbatch", "chunk", "layer"]
    c = o.loc[comp, key_cols + ["start_ns"]].assign(op=np.flatnonzero(comp))
    first = c.sort_values("start_ns").groupby(key_cols)["op"].first()
    last = c.sort_values("start_ns").groupby(key_cols)["op"].last()
    g = o.iloc[gat][key_cols].assign(op=gat)
    table = (first if depth >= 1 else last).rename("op_src").reset_index()
    want = g.assign(layer=g["layer"] - max(depth, 1))
    srcs = want.merge(table, on=key_cols, how="left")["op_src"]
    e = trace.edges
    # drop the gathers' edges from compute ops, add the re-wired ones
    drop = np.isin(e["dst"].to_numpy(), gat) & comp[e["src"].to_numpy()]
    ok = srcs.notna().to_numpy()
    add = pd.DataFrame({"src": srcs.to_numpy()[ok].astype(np.int64), "dst": gat[ok],
                        "kind": np.full(int(ok.sum()), 2, np.int8),
                        "lag_ns": np.zeros(int(ok.sum()), np.int64)})
    edges = pd.concat([e[~drop], add], ignore_index=True)
    t = Trace(ops=o, lanes=trace.lanes, edges=edges, ranges=trace.ranges, groups=trace.groups,
              memory=trace.memory, strings=trace.strings, meta=trace.meta)
    per_layer = float(np.median(o["bytes"].to_numpy()[gat]))
    return t, int(max(0, depth - 1) * per_layer)


def _link_bound_line(state: WhatIfState, lb: dict) -> None:
    """The ``assumed:`` line of new buckets larger than any transfer the trace's link fit
    saw (:func:`link_fit.bound_by_stated_rate`)."""
    head = (f"new buckets of up to {lb['largest_new_mb']:.3g} MB exceed the largest transfer "
            f"the link fit saw ({lb['seen_mb']:.3g} MB, fitted {lb['fit_gbps']:.3g} GB/s)")
    if lb["bounded"]:
        # the fit beats the stated link: its transfers rode a token bucket whose burst is at
        # least what they sent; how much more the trace cannot tell
        state.assume(head + f", faster than the stated {lb['stated_gbps']:g} GB/s: a token "
                     "bucket's burst, at least what the fit saw; the fit is extrapolated, the "
                     "range's upper bound moves the bytes beyond it at the stated rate",
                     bounded=True, bounds=[{"overlap.link_bound": "stated"}])
    elif lb["stated_gbps"] is None:
        state.notes.setdefault("unbounded", []).append(
            head + "; extrapolated unbounded: set network.measured_inter_node_gbps (the "
            "link's nominal rate) to bound it")
