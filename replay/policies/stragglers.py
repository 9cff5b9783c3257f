"""Stragglers: remove unexplained delays, set ops to their ideal durations, inject slowdowns,
and attribute a job's slowdown to ranks, stages and op types (what-if analysis).

Method (after ByteDance's "Understanding Stragglers in Large Model Training Using What-if
Analysis"; our own implementation on the replay engine):

* **measured** step time: last end of the step's ``optimizer`` ops (any op where the trace
  has none) minus the step's first start over all ranks.
* **simulated** ("no delay"): each step is replayed on its own, starting at its measured
  start, with every op at its measured duration (a collective member at its measured
  *transfer time*: its end minus the latest member start, so waiting for late ranks is not
  part of it) and no unexplained delay (gaps no dependency explains are dropped).
* **ideal** ("no blocking"): the same replay with every op at its *ideal duration*:

  - compute ops (forward/backward compute, optimizer, gc, kernels): the **mean** duration of
    the same op type over all ranks, stages, micro-batches and steps;
  - communication ops (pipeline send/recv, data-parallel all-gather / reduce-scatter /
    all-reduce, layernorm / embedding all-reduce, the gradient-norm all-reduce): the
    **median** transfer time of the same op type (the median is robust to the long waits a
    straggler causes on its peers).

  On op-level traces the op type is the Megatron timer name (``optype``). On kernel traces
  (Kineto/nsys/synth) the op type is "the same op on another rank": the k-th op of a name on
  a rank within a step, matched across ranks, and the ideal is the **median** over ranks for
  compute too (with a handful of ranks a mean would keep a straggler's share).
* ``slowdown`` = mean simulated / mean ideal step time.
* **attribution**: for a group of ops (one stage, one DP rank, one op type; send and recv of
  a direction count as one ``forward-pp-comm`` / ``backward-pp-comm`` type), replay the ideal
  run with only that group's ops back at their measured durations; the group's figure is
  that mean step time over the mean ideal step time (1.0 = the group explains none of the
  slowdown).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from retime.collectors.enums import OpKind
from retime.collectors.errors import PolicyError
from retime.collectors.steps import job_step_windows, step_windows
from retime.collectors.trace import Trace

from ..engine import simulate
from ..graph import build_graph
from ..graph_data import ReplayGraph
from .base import (
    Policy,
    WhatIfState,
    by_op,
    check_int,
    check_positive,
    known_fields,
    layout_of,
)

__all__ = ["Stragglers", "straggler_analysis", "ideal_durations", "COMM_OPTYPES"]

#: op-level optypes that are communication (ideal = median transfer time)
COMM_OPTYPES = frozenset({
    "forward-send", "forward-recv", "backward-send", "backward-recv", "params-all-gather",
    "grads-reduce-scatter", "separate-grads-all-reduce", "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce", "optimizer-clip-main-grad"})
_PP_GROUP = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
             "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}
_NEG_TRANSFER_CLIP_NS = 10_000_000  # transfer times below -10 ms are clock artefacts -> 0


@dataclass(frozen=True)
class Stragglers(Policy):
    """Straggler what-ifs.

    Parameters
    ----------
    ideal : bool
        Drop unexplained delays (gaps no dependency explains).
    ideal_durations : bool
        Set every op to its ideal duration (see the module docstring).
    slow_ranks : tuple of int
        Ranks to slow down by ``slowdown`` (their compute and memcpy ops).
    slowdown : float
        Factor for ``slow_ranks`` (> 0; 1.5 = 50 % slower).
    """

    ideal: bool | None = None
    ideal_durations: bool | None = None
    slow_ranks: tuple[int, ...] | None = None
    slowdown: float | None = None
    table: ClassVar[str] = "stragglers"

    def __post_init__(self) -> None:
        for f in ("ideal", "ideal_durations"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise PolicyError(f"stragglers.{f}={v!r} must be true or false")
        if self.slow_ranks is not None:
            if isinstance(self.slow_ranks, int):
                object.__setattr__(self, "slow_ranks", (self.slow_ranks,))
            if not isinstance(self.slow_ranks, (list, tuple)):
                raise PolicyError(f"stragglers.slow_ranks={self.slow_ranks!r} must be a list "
                                  "of rank numbers")
            object.__setattr__(self, "slow_ranks", tuple(self.slow_ranks))
            for r in self.slow_ranks:
                check_int("stragglers", "slow_ranks[]", r, lo=0)
        check_positive("stragglers", "slowdown", self.slowdown)
        if (self.slowdown is None) != (self.slow_ranks is None):
            raise PolicyError("stragglers.slow_ranks and stragglers.slowdown go together: "
                              "give both (e.g. slow_ranks=[3], slowdown=1.5)")

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """Dropped delays, slowed ranks (rank and kind) and ideal durations (the k-th op of
        a name per rank and step) read :data:`replay.footprint.WHATIF_COLUMNS` alone."""
        return ()

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """On a synthesized store the ranks' stages and data-parallel ranks come from
        ``meta['synth']['parallel']``: no ops column beyond
        :data:`replay.footprint.WHATIF_COLUMNS`."""
        return () if fields <= known_fields(cls) else None

    def configure(self, state: WhatIfState) -> None:
        if self.ideal:
            state.ideal = True

    def apply(self, state: WhatIfState) -> None:
        g = state.graph
        if self.ideal_durations:
            state.dur = ideal_durations(state.trace, g).astype(np.float64)
        if self.slow_ranks:
            inject_slowdown(state, self.slow_ranks, self.slowdown)
        state.applied.append(self.describe())


def inject_slowdown(state: WhatIfState, ranks: tuple[int, ...], factor: float) -> None:
    """Multiply the compute and memcpy durations of ``ranks`` by ``factor``."""
    rank = state.trace.ops["rank"].to_numpy()
    present = set(np.unique(rank).tolist())
    missing = [r for r in ranks if r not in present]
    if missing:
        raise PolicyError(f"slow_ranks: rank(s) {missing} are not in the trace (ranks "
                          f"{min(present)}..{max(present)})")
    k = state.kinds()
    work = (k == OpKind.KERNEL) | (k == OpKind.COMPUTE) | (k == OpKind.MEMCPY) \
        | (k == OpKind.MEMSET)
    state.dur[work & np.isin(rank, np.asarray(ranks))] *= factor


# ---------------------------------------------------------------------------- helpers
def _transfer_ns(g: ReplayGraph) -> np.ndarray:
    """Measured duration; a collective member's transfer time (end - latest member start)."""
    d = by_op(g, "dur_ns").copy()
    d[(by_op(g, "coll_of") >= 0) & (d <= -_NEG_TRANSFER_CLIP_NS)] = 0
    return d


def _optype_keys(trace: Trace) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(group key per op, is-communication per op, key labels)."""
    o = trace.ops
    names = np.asarray(trace.strings, dtype=object)
    name_id = o["name_id"].to_numpy().astype(np.int64)
    if trace.meta.get("source_format") == "oplevel":
        is_comm = np.isin(names, list(COMM_OPTYPES))[name_id] if len(names) else np.zeros(0, bool)
        return name_id, is_comm, [str(s) for s in names]
    # (every op takes the median: see the module docstring)
    # kernel traces: the k-th op of a name on a rank within a step, across ranks
    rank = o["rank"].to_numpy().astype(np.int64)
    step = o["step"].to_numpy().astype(np.int64)
    start = o["start_ns"].to_numpy()
    order = np.lexsort((start, name_id, step, rank))
    r, s, nm = rank[order], step[order], name_id[order]
    new = np.ones(len(order), bool)
    new[1:] = (r[1:] != r[:-1]) | (s[1:] != s[:-1]) | (nm[1:] != nm[:-1])
    grp_start = np.flatnonzero(new)
    occ_sorted = np.arange(len(order)) - np.repeat(grp_start, np.diff(np.append(grp_start, len(order))))
    occ = np.empty(len(order), np.int64)
    occ[order] = occ_sorted
    key3 = np.stack([step, name_id, occ], axis=1)
    _, key = np.unique(key3, axis=0, return_inverse=True) if len(key3) else (None, np.zeros(0, np.int64))
    return key.reshape(-1).astype(np.int64), np.ones(len(o), bool), [str(s) for s in names]


def ideal_durations(trace: Trace, graph: ReplayGraph | None = None) -> np.ndarray:
    """Every op's ideal duration (int64 ns, graph semantics; see the module docstring)."""
    g = graph if graph is not None else build_graph(trace, ideal=True)
    key, is_comm, _ = _optype_keys(trace)
    tr = _transfer_ns(g).astype(np.float64)
    out = tr.copy()
    if len(key) == 0:
        return out.astype(np.int64)
    nk = int(key.max()) + 1
    # compute: mean per key
    cm = ~is_comm
    sums = np.bincount(key[cm], weights=tr[cm], minlength=nk)
    cnts = np.bincount(key[cm], minlength=nk)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / cnts
    out[cm] = mean[key[cm]]
    # communication: median per key
    idx = np.flatnonzero(is_comm)
    if len(idx):
        o = idx[np.lexsort((tr[idx], key[idx]))]
        ks = key[o]
        first = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        last = np.r_[first[1:], len(o)]
        vals = tr[o]
        n = last - first
        lo = vals[first + (n - 1) // 2]
        hi = vals[first + n // 2]
        med = np.zeros(nk)
        med[ks[first]] = (lo + hi) / 2.0
        out[idx] = med[key[idx]]
    return out


def _step_info(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step index per op, unique steps, measured step start per step)."""
    o = trace.ops
    step = o["step"].to_numpy().astype(np.int64)
    steps, sidx = np.unique(step, return_inverse=True)
    start = o["start_ns"].to_numpy()
    s0 = np.full(len(steps), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(s0, sidx, start)
    return sidx.astype(np.int64), steps, s0


def isolate_steps(g: ReplayGraph, sidx: np.ndarray, step_start: np.ndarray, *,
                  zero_lags: bool = False) -> ReplayGraph:
    """A copy of ``g`` in which each step replays on its own from its measured start (no
    lane order or edge across steps; ops without predecessors start at the step start; no
    unexplained delays). ``sidx`` is per op id; the graph's own arrays may be laid out in
    another order (``perm``), handled here. ``zero_lags``: pure dependencies (an op starts when its lane
    predecessor and its edge sources have ended, no measured lag or offset), the semantics
    of op-level timelines whose timers carry no launch latency."""
    sidx = layout_of(g, sidx)
    lp = g.lane_prev.copy()
    cross = (lp >= 0) & (sidx[np.maximum(lp, 0)] != sidx)
    lp[cross] = -1
    lag = g.lane_lag_ns.copy()
    lag[cross] = 0
    s2s = g.lane_s2s.copy()
    s2s[cross] = False
    if zero_lags:
        lag[:] = 0
        s2s[:] = False
    n = g.n_ops
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.pred_ptr))
    keep = sidx[g.pred_src] == sidx[dst]
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=ptr[1:])
    wdst = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.wait_ptr))
    wkeep = sidx[g.wait_src] == sidx[wdst]
    wptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(wdst[wkeep], minlength=n), out=wptr[1:])
    plag = np.ascontiguousarray(g.pred_lag_ns[keep])
    ps2s = np.ascontiguousarray(g.pred_s2s[keep])
    if zero_lags:
        plag[:] = 0
        ps2s[:] = False
    return dataclasses.replace(
        g, lane_prev=lp, lane_lag_ns=lag, lane_s2s=s2s, pred_ptr=ptr,
        pred_src=np.ascontiguousarray(g.pred_src[keep]), pred_lag_ns=plag,
        pred_kind=np.ascontiguousarray(g.pred_kind[keep]), pred_s2s=ps2s, wait_ptr=wptr,
        wait_src=np.ascontiguousarray(g.wait_src[wkeep]),
        wait_lag_ns=np.ascontiguousarray(g.wait_lag_ns[wkeep]),
        origin_ns=np.ascontiguousarray(step_start[sidx]),
        delay_ns=np.zeros(n, np.int64), ideal=True)


def _rank_roles(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(stage, dp_rank) per op."""
    o = trace.ops
    rank = o["rank"].to_numpy().astype(np.int64)
    nr = int(rank.max()) + 1 if len(rank) else 0
    stage_of = np.zeros(nr, np.int64)
    dp_of = np.arange(nr, dtype=np.int64)
    m = trace.meta
    if isinstance(m.get("oplevel"), dict) and m["oplevel"].get("ranks"):
        for row in m["oplevel"]["ranks"]:
            if row["rank"] < nr:
                stage_of[row["rank"]] = row["stage"]
                dp_of[row["rank"]] = row["dp_rank"]
    elif isinstance(m.get("synth"), dict) and isinstance(m["synth"].get("parallel"), dict):
        p = m["synth"]["parallel"]
        tp, cp, dp = int(p["tp"]), int(p["cp"]), int(p["dp"])
        r = np.arange(nr)
        dp_of = (r // (tp * cp)) % dp
        stage_of = r // (tp * cp * dp)
    else:
        st = o["stage"].to_numpy().astype(np.int64)
        if (st >= 0).any():
            np.maximum.at(stage_of, rank, np.maximum(st, 0))
    return stage_of[rank], dp_of[rank]


def straggler_analysis(trace: Trace, *, strict: bool = False) -> dict[str, Any]:
    """What-if attribution of a run's slowdown (``retime stragglers --json``).

    Returns
    -------
    dict
        ``step_time_s``: {step: {measured, simulated, ideal}}; ``slowdown`` (mean
        simulated / mean ideal); ``by_stage``, ``by_dp_rank``, ``by_optype`` (mean step time
        with only that group at its measured durations, over mean ideal); ``method``.
    """
    if trace.n_ops == 0:
        raise PolicyError("stragglers: the trace has no ops; ingest a trace with ops first")
    g0 = build_graph(trace, ideal=True, strict=strict)
    sidx, steps, s0 = _step_info(trace)
    g = isolate_steps(g0, sidx, s0, zero_lags=trace.meta.get("source_format") == "oplevel")
    names = trace.names() if trace.strings else np.asarray([""] * trace.n_ops, dtype=object)
    is_opt = np.asarray(names == "optimizer")
    end_meas = g.meas_end_ns
    ns = len(steps)

    # each step's measured window: the job-level tiling of collectors.steps (the latest
    # rank's end of the step; the next step starts there)
    jw = job_step_windows(step_windows(trace)).set_index("step")
    w0 = s0.copy()
    if len(jw):
        have = np.isin(steps, jw.index.to_numpy())
        w0[have] = jw["start_ns"].reindex(steps[have]).to_numpy()

    def step_times(end: np.ndarray) -> np.ndarray:
        sel = is_opt if is_opt.any() else np.ones(len(end), bool)
        hi = np.full(ns, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(hi, sidx[sel], end[sel])
        return hi - w0

    # ops outside any step (step -1: set-up before the first profiled step) are replayed
    # but not reported as a step when real steps exist
    valid = steps >= 0 if (steps >= 0).any() else np.ones(ns, bool)
    if len(jw):
        ends = jw["end_ns"].reindex(steps, fill_value=0).to_numpy().astype(np.int64)
        meas_win = ends - w0

    def run(dur: np.ndarray) -> np.ndarray:
        r = simulate(g, durations_ns=np.rint(dur).astype(np.int64))
        return step_times(r.end_ns)[valid]

    measured = (meas_win if len(jw) else step_times(end_meas))[valid]
    meas_dur = _transfer_ns(g0).astype(np.float64)
    sim = run(meas_dur)
    ideal_d = ideal_durations(trace, g0)
    ideal = run(ideal_d)
    mean_ideal = float(ideal.mean())

    stage, dp_rank = _rank_roles(trace)
    key, _, labels = _optype_keys(trace)
    if trace.meta.get("source_format") == "oplevel":
        optype = np.asarray([_PP_GROUP.get(s, s) for s in labels], dtype=object)[key]
    else:
        optype = np.asarray(names, dtype=object)
        k = trace.ops["kind"].to_numpy()
        optype = np.where((k == OpKind.COLLECTIVE) | (k == OpKind.P2P), "communication",
                          np.where(k == OpKind.MEMCPY, "memcpy", "compute")).astype(object)

    def attribute(labels_per_op: np.ndarray) -> dict[str, float]:
        out = {}
        for lab in np.unique(labels_per_op.astype(str)):
            sel = labels_per_op.astype(str) == lab
            d = ideal_d.copy()
            d[sel] = meas_dur[sel]
            out[str(lab)] = float(run(d).mean() / mean_ideal) if mean_ideal else float("nan")
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    return {
        "step_time_s": {int(s): {"measured": float(measured[i]) / 1e9,
                                 "simulated": float(sim[i]) / 1e9,
                                 "ideal": float(ideal[i]) / 1e9}
                        for i, s in enumerate(steps[valid])},
        "slowdown": float(sim.mean() / mean_ideal) if mean_ideal else float("nan"),
        "by_stage": attribute(stage),
        "by_dp_rank": attribute(dp_rank),
        "by_optype": attribute(optype),
        "relaxed": g0.stats.get("relaxed") or {"count": 0, "collectives": [], "edges": []},
        "method": ("each step replayed from its measured start without unexplained delays; "
                   "ideal: compute ops at the mean, communication at the median transfer "
                   "time of their op type; groups: only that group at measured durations"),
    }
