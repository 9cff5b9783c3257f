"""``simulate(graph) -> ReplayResult``: run the replay kernels and wrap their arrays.

Two paths (DESIGN.md §4):

* ``mode="fast"`` — longest-path list scheduling in topological order, O(N + E)
  (:func:`replay._kernels._fast_replay`). Replaying an unmodified graph reproduces the
  measured timeline exactly (identity), by construction of the graph (see
  :mod:`replay.graph`).
* ``mode="contention"`` — an event-driven fluid simulation in which ops running at the
  same time share their device and links (:class:`ContentionModel`). With every sharing
  switched off it gives the fast path's result whenever no start had to be clamped
  (``meta["contention"]["clamped_starts"] == 0``; true on every shared trace; see
  :func:`replay._fluid._fluid_replay`).

What-if policies pass modified durations (``durations_ns``), a modified graph
(:meth:`ReplayGraph.with_edges`, :meth:`ReplayGraph.with_durations`) and/or a contention
model; the engine itself knows no policy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import unique
from retime.collectors.errors import ReplayError
from retime.collectors.steps import step_windows_by_rank, times_checksum, windows_from_arrays
from retime.collectors.trace import Trace

from ._fluid import _fluid_replay
from ._kernels import _fast_replay, _to_op_order, _to_op_order_i64
from ._succ import _fluid_consts, _succ_lists
from .gaps import gap_shares
from .graph import build_graph
from .graph_data import ReplayGraph, _check_durations

__all__ = ["ContentionModel", "ReplayResult", "simulate", "replay"]

MODES = ("fast", "contention")


@dataclass(frozen=True)
class ContentionModel:
    """How concurrent ops share resources on the contention path.

    Parameters
    ----------
    slowdown : float
        Compute/communication interference per device, as a slowdown: while a device runs
        both compute and communication, each progresses at ``1 / (1 + slowdown)`` of its
        rate (0 = perfect overlap, 1 = each at half speed). Not the same quantity as the
        scenario key ``overlap.interference`` (the fraction of ideal overlap achieved, 0..1),
        which the overlap policy converts to this.
    share_compute : bool
        Concurrent compute ops on one device share it equally (processor sharing).
    share_links : bool
        Concurrent communication ops share links by max-min fairness (progressive filling
        over the links of all their members; one link per rank, unit capacity).
    comm_slowdown : float, array or None
        The communication side's own slowdown when interference is asymmetric: a
        communication job touching a computing device progresses at ``1 / (1 +
        comm_slowdown)`` (one value, or one per op in op-id order: a collective takes its
        first member's) while compute keeps ``slowdown``. None: ``slowdown`` for both.
    compute_slowdown : float, array or None
        The compute side's slowdown per op (op-id order) when it differs by kernel (a
        memory-bound kernel loses more to the HBM traffic of concurrent NCCL kernels than a
        compute-bound one: :func:`collectors.costs.interference.interference`'s
        ``intensity``). None: ``slowdown`` for every compute op.
    comm_cap : bool
        Next to compute a communication job's rate is ``min(link share, 1 / (1 +
        comm_slowdown))`` (a cap: it waits on its CPU, not on the link, so concurrent
        transfers each keep it) instead of the product.
    """

    slowdown: float = 0.0
    share_compute: bool = False
    share_links: bool = True
    comm_slowdown: Any = None
    comm_cap: bool = False
    compute_slowdown: Any = None

    def __post_init__(self) -> None:
        if not (np.isfinite(self.slowdown) and self.slowdown >= 0):
            raise ReplayError(f"ContentionModel.slowdown={self.slowdown!r} must be "
                              "a finite number >= 0 (0 = no interference)")
        for name in ("comm_slowdown", "compute_slowdown"):
            v = getattr(self, name)
            if v is None:
                continue
            c = np.asarray(v, np.float64)
            if c.ndim > 1 or not (np.isfinite(c).all() and (c >= 0).all()):
                raise ReplayError(f"ContentionModel.{name} must be a finite number >= 0 "
                                  "or one per op")

    def kernel_args(self, g: ReplayGraph) -> tuple[float, np.ndarray, np.ndarray, bool]:
        """(interference switch, per-position rate of compute next to communication,
        per-position rate of communication next to compute, cap or product) for the fluid
        kernel."""
        on = self.slowdown
        rates = []
        for name, v in (("compute_slowdown", self.compute_slowdown),
                        ("comm_slowdown", self.comm_slowdown)):
            c = np.asarray(self.slowdown if v is None else v, np.float64)
            if c.ndim == 1:
                if len(c) != g.n_ops:
                    raise ReplayError(f"ContentionModel.{name} has {len(c)} values for a "
                                      f"graph of {g.n_ops} ops")
                perm = getattr(g, "perm", None)
                c = c if perm is None else c[perm]
                rates.append(np.ascontiguousarray(1.0 / (1.0 + c)))
            else:
                rates.append(np.full(g.n_ops, 1.0 / (1.0 + float(c))))
            on = max(on, float(c.max()) if c.size else 0.0)
        return float(on), rates[0], rates[1], bool(self.comm_cap)


def _arrays(self) -> tuple:
    """A kernel bundle's arrays in field order (= the kernels' parameter order)."""
    return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class KernelGraph:
    """The graph arrays both replay kernels take, in one dtype each (numba compiles one
    specialization; no copy when the graph comes from ``build_graph``, a copy of just the
    arrays a policy replaced otherwise). Field order is the kernels' parameter order."""

    coll_of: np.ndarray        # int32[N]: collective of each op (-1 none)
    coll_ptr: np.ndarray       # int32[C+1]: CSR of collective members
    coll_members: np.ndarray   # int32[M]
    dur: np.ndarray            # int64[N] ns
    delay: np.ndarray          # int64[N] ns: release delays kept from the trace
    origin: np.ndarray         # int64[N] ns: measured starts (time origin per op)
    lane_prev: np.ndarray      # int32[N]: previous op on the lane (-1 none)
    lane_lag: np.ndarray       # int64[N] ns
    lane_s2s: np.ndarray       # bool[N]: lane link is start-to-start
    pred_ptr: np.ndarray       # int32[N+1]: CSR of dependency predecessors
    pred_src: np.ndarray       # int32[E]
    pred_lag: np.ndarray       # int64[E] ns
    pred_s2s: np.ndarray       # bool[E]
    wait_ptr: np.ndarray       # int32[N+1]: CSR of blocking waits
    wait_src: np.ndarray       # int32[W]
    wait_lag: np.ndarray       # int64[W] ns

    args = _arrays

    @classmethod
    def of(cls, g: ReplayGraph, dur: np.ndarray) -> KernelGraph:
        i32, i64, b = np.int32, np.int64, np.bool_
        a = np.ascontiguousarray
        return cls(a(g.coll_of, i32), a(g.coll_ptr, i32), a(g.coll_members, i32), a(dur, i64),
                   a(g.delay_ns, i64), a(g.origin_ns, i64), a(g.lane_prev, i32),
                   a(g.lane_lag_ns, i64), a(g.lane_s2s, b), a(g.pred_ptr, i32),
                   a(g.pred_src, i32), a(g.pred_lag_ns, i64), a(g.pred_s2s, b),
                   a(g.wait_ptr, i32), a(g.wait_src, i32), a(g.wait_lag_ns, i64))


@dataclass(frozen=True)
class FluidResources:
    """What each op uses on the contention path (kernel parameter order)."""

    device: np.ndarray    # int32[N]: the op's device
    resource: np.ndarray  # int8[N]: 0 none, 1 compute on ``device``, 2 communication on ``link``
    link: np.ndarray      # int32[N]: the op's link

    args = _arrays

    @classmethod
    def of(cls, g: ReplayGraph) -> FluidResources:
        a = np.ascontiguousarray
        return cls(a(g.device, np.int32), a(g.resource, np.int8), a(g.link, np.int32))


@dataclass(frozen=True)
class FluidSetup:
    """The contention path's per-graph set-up (:func:`replay._succ._succ_lists` and
    :func:`replay._succ._fluid_consts`), built once per graph; kernel parameter order."""

    sptr: np.ndarray
    succ: np.ndarray
    cnt0: np.ndarray
    smid: np.ndarray
    pptr: np.ndarray
    pent: np.ndarray
    state0: np.ndarray
    roots: np.ndarray
    wkey: np.ndarray
    dims: np.ndarray

    args = _arrays


class ReplayResult:
    """Replayed start/end of every op (int64 arrays aligned with ``trace.ops`` rows).

    ``start_ns``, ``end_ns`` (int64 ns) and ``crit_pred`` (the op whose end bound the op's
    end, ``-1`` for roots) are in op-id order. The kernels produce them per layout position;
    they are mapped to op ids when first read (:func:`replay.sweep.scenario_metrics` reads
    the layout order and never pays for the mapping). Read-only once built; pickles (to Dask
    workers and back) keep whichever form the result holds. ``graph`` is None for a replay
    computed a window at a time (:mod:`replay.window`): ``meta["gaps"]`` then holds what the
    whole graph's :func:`replay.gaps.gap_shares` gives; ``trace`` is None too for one read
    from a store a window at a time (:mod:`replay.window_store`: ``step_windows`` given).
    """

    # _rc: what replay.whatif.prediction_range needs to compute the what-if's range later
    __slots__ = ("trace", "graph", "meta", "_s", "_e", "_c", "_layout", "_w", "_rc")

    def __init__(self, trace: Trace, graph: ReplayGraph | None, start_ns: np.ndarray | None = None,
                 end_ns: np.ndarray | None = None, crit_pred: np.ndarray | None = None,
                 meta: dict[str, Any] | None = None, *, layout: tuple | None = None,
                 step_windows: pd.DataFrame | None = None) -> None:
        if layout is None and (start_ns is None or end_ns is None or crit_pred is None):
            raise TypeError("ReplayResult needs start_ns, end_ns and crit_pred")
        st = object.__setattr__
        st(self, "trace", trace)
        st(self, "graph", graph)
        st(self, "meta", {} if meta is None else meta)
        st(self, "_s", start_ns)
        st(self, "_e", end_ns)
        st(self, "_c", crit_pred)
        # ("f", start f64, end f64, crit i32 positions, base ns) from the contention path,
        # ("i", start i64, end i64, crit i64 positions, 0) from the fast path
        st(self, "_layout", layout if start_ns is None else None)
        # (a replay of a store computes its step windows a batch of ranks at a time:
        # replay.window_store)
        st(self, "_w", step_windows)
        st(self, "_rc", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ReplayResult is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ReplayResult is read-only (cannot delete {name!r})")

    def __getstate__(self) -> tuple:
        return (self.trace, self.graph, self.meta, self._s, self._e, self._c, self._layout)

    def __setstate__(self, state: tuple) -> None:
        for k, v in zip(self.__slots__[:7], state, strict=True):
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_w", None)  # step windows: recomputed when asked
        object.__setattr__(self, "_rc", None)  # a range not yet computed is not carried

    def __repr__(self) -> str:
        return (f"ReplayResult(ops={len(self.start_ns)}, mode={self.meta.get('mode')!r}, "
                f"scenario={self.meta.get('scenario')!r})")

    def _op_order(self) -> None:
        """Map the kernels' per-position results to op ids (once)."""
        lay = self._layout
        if lay is None:
            return
        kind, start, end, crit, base = lay
        perm = np.ascontiguousarray(self.graph.perm, np.int32)
        n = len(perm)
        s, e, c = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        if kind == "f":  # rounded to int64 ns
            _to_op_order(perm, start, end, crit, base, s, e, c)
        else:
            _to_op_order_i64(perm, start, end, crit, s, e, c)
        st = object.__setattr__
        st(self, "_s", s)
        st(self, "_e", e)
        st(self, "_c", c)
        st(self, "_layout", None)

    @property
    def start_ns(self) -> np.ndarray:
        if self._s is None:
            self._op_order()
        return self._s

    @property
    def end_ns(self) -> np.ndarray:
        if self._e is None:
            self._op_order()
        return self._e

    @property
    def crit_pred(self) -> np.ndarray:
        if self._c is None:
            self._op_order()
        return self._c

    @property
    def dur_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def step_windows(self) -> pd.DataFrame:
        """Per (rank, step): the step's window measured and replayed (one definition for
        every command: :mod:`collectors.steps`): ``rank``, ``step``, ``measured_start_ns``,
        ``measured_end_ns``, ``replayed_start_ns``, ``replayed_end_ns``, ``measured_ns``,
        ``replayed_ns``."""
        hit = getattr(self, "_w", None)
        if hit is not None:
            return hit
        g = self.graph
        t = self.trace
        if g is None:  # a windowed replay: the measured times are the trace's
            ms = t.ops["start_ns"].to_numpy()
            me = ms + t.ops["dur_ns"].to_numpy()
            mw = step_windows_by_rank(t, ms, me)
            rw = mw if (np.array_equal(self.start_ns, ms) and np.array_equal(self.end_ns, me)) \
                else step_windows_by_rank(t, self.start_ns, self.end_ns)
            del ms, me
        elif t is not None and len(t.ops) == g.n_ops:
            memo = g.memo()
            mw = memo.get("measured_step_windows")
            if mw is None:
                mw = memo["measured_step_windows"] = step_windows_by_rank(
                    t, g.meas_start_ns, g.meas_end_ns)
            # same times, same windows (an identity replay): not computed twice
            rw = mw if (np.array_equal(self.start_ns, g.meas_start_ns)
                        and np.array_equal(self.end_ns, g.meas_end_ns)) \
                else step_windows_by_rank(t, self.start_ns, self.end_ns)
        else:  # a bare graph: one window per rank, the span of its ops
            z = np.full(g.n_ops, -1, np.int64)
            mw = windows_from_arrays(g.rank, z, g.meas_start_ns, g.meas_end_ns)
            rw = windows_from_arrays(g.rank, z, self.start_ns, self.end_ns)
        out = pd.DataFrame({
            "rank": mw["rank"].to_numpy(), "step": mw["step"].to_numpy(),
            "measured_start_ns": mw["start_ns"].to_numpy(),
            "measured_end_ns": mw["end_ns"].to_numpy(),
            "replayed_start_ns": rw["start_ns"].to_numpy(),
            "replayed_end_ns": rw["end_ns"].to_numpy()})
        out["measured_ns"] = out["measured_end_ns"] - out["measured_start_ns"]
        out["replayed_ns"] = out["replayed_end_ns"] - out["replayed_start_ns"]
        object.__setattr__(self, "_w", out)
        return out

    def step_times(self) -> pd.DataFrame:
        """Per rank: ``rank``, ``steps``, ``measured_ns`` and ``replayed_ns`` (the rank's
        step windows end to end: its first step's start to its last step's end, see
        :mod:`collectors.steps`), ``measured_step_ns`` and ``replayed_step_ns`` (the mean
        window: the rank's step time, the figure ``retime analyze`` and ``retime report``
        show for it)."""
        w = self.step_windows()
        if len(w) == 0:
            z = np.zeros(0, np.int64)
            return pd.DataFrame({"rank": np.zeros(0, np.int32), "steps": z, "measured_ns": z,
                                 "replayed_ns": z, "measured_step_ns": np.zeros(0),
                                 "replayed_step_ns": np.zeros(0)})
        g = w.groupby("rank", sort=True)
        r = g.agg(steps=("step", "size"), measured_ns=("measured_ns", "sum"),
                  replayed_ns=("replayed_ns", "sum")).reset_index()
        r["rank"] = r["rank"].astype(np.int32)
        r["steps"] = r["steps"].astype(np.int64)
        r["measured_step_ns"] = r["measured_ns"] / r["steps"]
        r["replayed_step_ns"] = r["replayed_ns"] / r["steps"]
        return r

    @property
    def step_time_ns(self) -> int:
        """Replayed time of the longest rank: its step windows end to end
        (:meth:`step_times`)."""
        st = self.step_times()
        return int(st["replayed_ns"].max()) if len(st) else 0

    def to_frame(self) -> pd.DataFrame:
        """The trace's ops frame plus ``replay_start_ns``, ``replay_end_ns``,
        ``replay_dur_ns`` and ``crit_pred``."""
        df = self.trace.ops_frame()
        df["replay_start_ns"] = self.start_ns
        df["replay_end_ns"] = self.end_ns
        df["replay_dur_ns"] = self.end_ns - self.start_ns
        df["crit_pred"] = self.crit_pred
        return df

    def to_trace(self) -> Trace:
        """A copy of the trace with the replayed times (``meta["replay"]`` describes the run).

        Ranges (annotations) are moved with the ops they enclose: a range starts at the
        replayed start of its first op and ends at the replayed end of its last op on the
        same lane (by measured start); a range holding no op shifts with the op before it.
        ``meta["step_windows"]`` holds the replayed step windows (:meth:`step_windows`),
        which the analysis of the returned trace uses.
        """
        t = self.trace
        ops = t.ops.copy()
        ops["start_ns"] = self.start_ns
        ops["dur_ns"] = self.end_ns - self.start_ns
        meta = copy.deepcopy(t.meta)
        meta["replay"] = {k: v for k, v in self.meta.items()}
        # the backlog queued before the trace started is a fact of the recording: the
        # replayed trace's notes say the measured count (analysis.coverage)
        from retime.analysis.coverage import queued_before_trace
        meta["queued_before_trace"] = queued_before_trace(t)
        # the replay's step windows travel with the replayed trace, so that analysis of it
        # (breakdown, report, analyze) uses the very windows step_times() reports
        w = self.step_windows()
        meta["step_windows"] = {"ops": int(len(ops)),
                                "times": times_checksum(self.start_ns, self.end_ns),
                                "rank": w["rank"].tolist(),
                                "step": w["step"].tolist(),
                                "start_ns": w["replayed_start_ns"].tolist(),
                                "end_ns": w["replayed_end_ns"].tolist()}
        return Trace(ops=ops, lanes=t.lanes.copy(), edges=t.edges.copy(),
                     ranges=_move_ranges(t, self.start_ns, self.end_ns),
                     groups=t.groups.copy(), memory=t.memory.copy(), strings=list(t.strings),
                     meta=meta)

    def summary(self) -> dict[str, Any]:
        """The ``retime replay --json`` object (DESIGN.md §6)."""
        st = self.step_times()
        return {
            "step_time_ns": {"measured": int(st["measured_ns"].max()) if len(st) else 0,
                             "replayed": int(st["replayed_ns"].max()) if len(st) else 0,
                             # the step time people read: the slowest rank's mean step (its
                             # windows end to end over their count: the job's period; the
                             # per-step maximum over ranks would add the jitter of where
                             # each rank's profiler step boundaries fall)
                             "per_step": {
                                 "measured": float(st["measured_step_ns"].max()) if len(st)
                                 else 0.0,
                                 "replayed": float(st["replayed_step_ns"].max()) if len(st)
                                 else 0.0}},
            "per_rank": [{"rank": int(r.rank), "steps": int(r.steps),
                          "measured_ns": int(r.measured_ns), "replayed_ns": int(r.replayed_ns),
                          "measured_step_ns": float(r.measured_step_ns),
                          "replayed_step_ns": float(r.replayed_step_ns)}
                         for r in st.itertuples()],
            "scenario": list(self.meta.get("scenario", [])),
            "mode": self.meta["mode"],
            "ideal": self.meta["ideal"],
            "unexplained_delays": {"count": self.meta["unexplained_delay_count"],
                                   "total_ns": self.meta["unexplained_delay_ns"],
                                   "applied": not self.meta["ideal"]},
            "graph": {k: self.meta[k] for k in ("ops", "edges", "wait_edges", "collectives",
                                                 "edges_clamped", "lane_overlaps",
                                                 "intra_collective_edges")},
            # what the measured gaps were (replay/gaps.py): host work, waits, unexplained
            "gaps": self.meta["gaps"] if self.graph is None else gap_shares(self.graph),
            # cross-rank links relaxed to break dependency cycles (build_graph, not strict)
            "relaxed": self.meta.get("relaxed") or {"count": 0, "collectives": [],
                                                    "edges": []},
        }


def simulate(graph: ReplayGraph, *, durations_ns: np.ndarray | None = None,
             mode: str = "fast", contention: ContentionModel | None = None,
             scenario: list | None = None) -> ReplayResult:
    """Replay ``graph``; return the replayed start/end of every op.

    Parameters
    ----------
    graph : ReplayGraph
        From :func:`replay.graph.build_graph` (possibly modified by a policy).
    durations_ns : int64[N], optional
        Modeled durations replacing ``graph.dur_ns`` (same meaning: a collective member's
        value is its transfer tail after the last member arrived).
    mode : {"fast", "contention"}
        ``"contention"`` shares devices/links among concurrent ops per ``contention``.
    contention : ContentionModel, optional
        Sharing rules of the contention path (default ``ContentionModel()``).
    scenario : list, optional
        Description of the policies applied (recorded in ``meta["scenario"]``).
    """
    g = graph
    dur = (g.dur_ns if durations_ns is None
           else np.ascontiguousarray(_check_durations(g, durations_ns)[g.perm]))
    return _simulate_layout(g, dur, durations_ns is not None, mode=mode, contention=contention,
                            scenario=scenario)


def _simulate_layout(graph: ReplayGraph, dur: np.ndarray, modified: bool, *, mode: str,
                     contention: ContentionModel | None, scenario: list | None
                     ) -> ReplayResult:
    """:func:`simulate` with the durations already in layout order and checked (``dur``:
    int64, ``graph.dur_ns`` itself when ``modified`` is false)."""
    if mode not in MODES:
        raise ReplayError(f"mode={mode!r} is not a replay mode; choose one of {', '.join(MODES)}")
    if graph.trace is None:
        raise ReplayError("graph has no trace attached; build it with build_graph(trace)")
    g = graph
    meta: dict[str, Any] = {"mode": mode, "ideal": g.ideal, "scenario": list(scenario or []),
                            "durations_modified": bool(modified)}
    meta.update(g.stats)
    if not g.ideal:
        # the delays this replay applies: a what-if that re-derives a rank's waits (the CPU
        # contention path) or rebuilt its ops has others than the graph measured; the
        # measured ones stay in graph.stats
        meta["unexplained_delay_count"] = int(np.count_nonzero(g.delay_ns))
        meta["unexplained_delay_ns"] = int(np.asarray(g.delay_ns, np.int64).sum())
    kg = KernelGraph.of(g, dur)
    n = g.n_ops
    # outputs allocated here: numpy asks for huge pages (fewer page faults than numba's NRT);
    # they stay in layout order until the result's op-order arrays are read
    if mode == "fast":
        start, end, crit = (np.empty(n, np.int64) for _ in range(3))
        _fast_replay(np.ascontiguousarray(g.order, np.int32), *kg.args(), start, end, crit)
        layout = ("i", start, end, crit, 0)
    else:
        cm = contention or ContentionModel()
        # uninitialized: the kernel writes every entry when every op starts (else it
        # reports a cycle, below), and a zero fill costs ~3% of a scenario at 10^6 ops
        start, end, crit = np.empty(n), np.empty(n), np.empty(n, np.int32)
        res = FluidResources.of(g)
        base, clamped = _fluid_replay(
            *kg.args(), *res.args(), *cm.kernel_args(g), bool(cm.share_compute),
            bool(cm.share_links), *_fluid_setup(g, kg, res).args(), start, end, crit)
        if clamped < 0:
            raise ReplayError("contention replay could not schedule every op (a dependency "
                              "cycle the graph check missed); rebuild the graph")
        del kg
        # per-position floats relative to base: rounded to int64 ns when read
        layout = ("f", start, end, crit, int(base))
        meta["contention"] = {"slowdown": cm.slowdown,
                              "comm_slowdown": (None if cm.comm_slowdown is None else
                                                float(np.max(cm.comm_slowdown))),
                              "share_compute": cm.share_compute,
                              "share_links": cm.share_links, "clamped_starts": int(clamped)}
    return ReplayResult(g.trace, g, meta=meta, layout=layout)


def _fluid_setup(g: ReplayGraph, kg: KernelGraph, res: FluidResources) -> FluidSetup:
    """The contention path's per-graph arrays of ``g``: successor lists and set-up constants
    (built once per graph and memoized on it)."""
    m = g.memo()
    v = m.get("fluid_succ")
    if v is None:
        sptr, succ, cnt0, smid, pptr, pent = _succ_lists(
            kg.lane_prev, kg.lane_lag, kg.lane_s2s, kg.pred_ptr, kg.pred_src, kg.pred_lag,
            kg.pred_s2s)
        state0, roots, wkey, dims = _fluid_consts(
            kg.coll_of, kg.coll_ptr, kg.origin, res.device, res.link, res.resource,
            kg.wait_ptr, kg.wait_src, sptr, smid, cnt0)
        v = m["fluid_succ"] = FluidSetup(sptr, succ, cnt0, smid, pptr, pent, state0, roots,
                                         wkey, dims)
        for x in v.args():
            x.flags.writeable = False
    return v


def replay(trace: Trace, *, ideal: bool = False, mode: str = "fast",
           contention: ContentionModel | None = None) -> ReplayResult:
    """Convenience: ``simulate(build_graph(trace, ideal=ideal), ...)``."""
    return simulate(build_graph(trace, ideal=ideal), mode=mode, contention=contention)


def _move_ranges(t: Trace, start: np.ndarray, end: np.ndarray) -> pd.DataFrame:
    r = t.ranges.copy()
    if len(r) == 0 or len(start) == 0:
        return r
    o = t.ops
    lane = o["lane"].to_numpy().astype(np.int64)
    ms = o["start_ns"].to_numpy()
    order = np.lexsort((np.arange(len(ms)), ms, lane))
    key_l, key_s = lane[order], ms[order]
    rl = r["lane"].to_numpy().astype(np.int64)
    rs = r["start_ns"].to_numpy()
    re_ = r["end_ns"].to_numpy()
    # position in (lane, start) order: encode lane as the major key
    lanes_u, lane_first = unique(key_l, return_index=True)
    lane_last = np.append(lane_first[1:], len(key_l))
    li = np.searchsorted(lanes_u, rl)
    li_ok = (li < len(lanes_u)) & (lanes_u[np.minimum(li, len(lanes_u) - 1)] == rl)
    li = np.minimum(li, len(lanes_u) - 1)
    lo_b, hi_b = lane_first[li], lane_last[li]
    first = np.empty(len(r), np.int64)
    last = np.empty(len(r), np.int64)
    for j, ln in enumerate(lanes_u.tolist()):  # one iteration per lane, not per op
        sel = li_ok & (rl == ln)
        if not sel.any():
            continue
        seg = key_s[lane_first[j]:lane_last[j]]
        first[sel] = lane_first[j] + np.searchsorted(seg, rs[sel], side="left")
        last[sel] = lane_first[j] + np.searchsorted(seg, re_[sel], side="right") - 1
    new_s = rs.copy()
    new_e = re_.copy()
    if li_ok.any():
        st_o, en_o = start[order], end[order]
        has = li_ok & (first <= last) & (first < hi_b) & (last >= lo_b)
        new_s[has] = st_o[first[has]]
        cummax = _segment_cummax(en_o, lane_first, lane_last)
        new_e[has] = np.maximum(cummax[last[has]], new_s[has])
        # empty ranges: shift by the delta of the op just before (or after) them
        emp = li_ok & ~has
        if emp.any():
            prev = np.clip(first[emp] - 1, lo_b[emp], hi_b[emp] - 1)
            delta = st_o[prev] - key_s[prev]
            new_s[emp] = rs[emp] + delta
            new_e[emp] = re_[emp] + delta
    r["start_ns"] = new_s
    r["end_ns"] = np.maximum(new_e, new_s)
    return r


def _segment_cummax(x, first, last) -> np.ndarray:
    out = x.copy()
    for a, b in zip(first.tolist(), last.tolist(), strict=True):  # one per lane
        np.maximum.accumulate(out[a:b], out=out[a:b])
    return out
