"""What-if machinery shared by every policy family: the working state and small validators.

A what-if runs in two phases over one :class:`WhatIfState`:

1. ``configure(state)`` — policies that change *how the step is laid out* (parallelism,
   recompute, network/hardware of a synthesized run, topology, ideal mode) edit the state's
   configuration. On a synthesized trace (``meta["synth"]`` carries the model, hardware and
   parallel configs) a changed configuration is re-synthesized by the same builder synth
   uses, so the new trace is exactly what ``retime synth`` would model.
2. ``apply(state)`` — policies that *re-time a laid-out trace* edit per-op durations
   (``state.dur``: a collective member's value is its transfer tail after the last member
   arrived, as in :mod:`replay.graph`), add dependency edges (``state.add_edges``) or ask for
   the contention path (``state.contention``).

Then the engine replays the graph once. Every policy appends what it did to
``state.applied`` (recorded in ``ReplayResult.meta["scenario"]``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from retime.collectors.enums import OpKind
from retime.collectors.errors import ConfigError, PolicyError
from retime.collectors.trace import Trace

from .._kernels import _layout_durations, _layout_durations_scaled, _scale_by_class
from ..engine import ContentionModel
from ..graph import build_graph
from ..graph_data import ReplayGraph

__all__ = ["Policy", "WhatIfState", "SynthSpec", "check_positive", "check_fraction",
           "check_choice", "check_int", "ranks_per_node_of", "node_span", "by_op", "layout_of",
           "trace_memo", "fingerprint_scope", "frozen", "drop_run_caches"]


# ---------------------------------------------------------------------------- graph order
# The graph of the last few traces replayed: a sweep asks many what-ifs of one trace, and
# building the graph costs far more than a replay. Policies never modify a graph in place
# (they derive new ones), and the key includes a fingerprint of the tables, so a trace
# edited in place after a what-if gets a fresh graph.
_GRAPH_CACHE: dict[tuple, tuple[weakref.ref, ReplayGraph]] = {}
_GRAPH_CACHE_SIZE = 4


def _fingerprint(trace: Trace) -> tuple:
    """Cheap content summary of the tables caches derive from (op times, lanes, kinds,
    names, edges): a trace edited in place after a what-if gets a new one. Inside one
    :func:`fingerprint_scope` (one what-if) a trace's fingerprint is computed once."""
    if _FP_SCOPE:
        hit = _FP_SCOPE[-1].get(id(trace))
        if hit is not None and hit[0]() is trace:
            return hit[1]
    o, e = trace.ops, trace.edges

    def tot(df, col):
        return int(df[col].to_numpy().sum())
    fp = (len(o), len(e), tot(o, "start_ns"), tot(o, "dur_ns"), tot(o, "lane"),
          tot(o, "kind"), tot(o, "name_id"), tot(e, "src"), tot(e, "dst"), tot(e, "lag_ns"))
    if _FP_SCOPE:
        _FP_SCOPE[-1][id(trace)] = (weakref.ref(trace), fp)
    return fp


_FP_SCOPE: list[dict[int, tuple[weakref.ref, tuple]]] = []


@contextmanager
def fingerprint_scope(memo: dict | None = None):
    """Fingerprint each trace at most once until the block ends (one what-if, or a sweep's
    scenarios: nothing edits a trace's tables in place while it runs). ``memo`` (a dict the
    caller keeps) carries the fingerprints from one block to the next; a scope opened inside
    another shares the outer one's. Entries hold their traces weakly."""
    if memo is None:
        memo = _FP_SCOPE[-1] if _FP_SCOPE else {}
    _FP_SCOPE.append(memo)
    try:
        yield
    finally:
        _FP_SCOPE.pop()


# per-trace derived constants (measured step time, kernel classes, traffic, ...), valid while
# the trace object lives and its fingerprint is unchanged
_MEMO: dict[int, tuple[weakref.ref, tuple, dict[Any, Any]]] = {}


def trace_memo(trace: Trace) -> dict[Any, Any]:
    """A dict of values derived from ``trace`` alone, emptied when the trace is edited in
    place (its fingerprint changes) and dropped with the trace. Callers store arrays
    read-only (``arr.flags.writeable = False``) so that nobody edits a shared value."""
    fp = _fingerprint(trace)
    k = id(trace)
    hit = _MEMO.get(k)
    if hit is not None and hit[0]() is trace:
        if hit[1] == fp:
            return hit[2]
    d: dict[Any, Any] = {}

    def gone(ref, k=k):
        cur = _MEMO.get(k)
        if cur is not None and cur[0] is ref:
            del _MEMO[k]
    _MEMO[k] = (weakref.ref(trace, gone), fp, d)
    return d


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only (a cached array shared by what-ifs)."""
    a.flags.writeable = False
    return a


def cached_graph(trace: Trace, *, ideal: bool = False) -> ReplayGraph:
    """``build_graph(trace, ideal=ideal)``, reused while the same unchanged Trace is asked."""
    key = (id(trace), bool(ideal), _fingerprint(trace))
    hit = _GRAPH_CACHE.get(key)
    if hit is not None and hit[0]() is trace:
        return hit[1]
    g = build_graph(trace, ideal=ideal)
    while len(_GRAPH_CACHE) >= _GRAPH_CACHE_SIZE:
        _GRAPH_CACHE.pop(next(iter(_GRAPH_CACHE)))
    _GRAPH_CACHE[key] = (weakref.ref(trace), g)
    return g


def drop_run_caches(keep: Trace | None = None) -> None:
    """Forget the re-synthesized runs and the cached graphs of traces other than ``keep``.
    A sweep worker calls this when it moves on to another re-synthesizing group
    (replay.sweep deals whole groups), keeping its shipped trace's graph (a measured trace
    is never re-synthesized: all its scenarios use that graph): the next group's runs and
    graphs then reuse the memory instead of the process growing by ~340 MB per group at
    10^6 ops, each fresh page a page fault."""
    _SYNTH_CACHE.clear()
    for k in [k for k, (ref, _g) in _GRAPH_CACHE.items() if keep is None or ref() is not keep]:
        del _GRAPH_CACHE[k]


def by_op(g: ReplayGraph, name: str) -> np.ndarray:
    """Graph array ``name`` (a per-op kernel array: ``dur_ns``, ``coll_of``, ``device``,
    ``resource``, ...) in op-id order, whether or not the graph lays its ops out in another
    order (``perm``/``pos``)."""
    if isinstance(g, ReplayGraph):
        return g.op_order(name)
    a = getattr(g, name)
    pos = getattr(g, "pos", None)
    return a if pos is None else a[pos]


def layout_of(g: ReplayGraph, op_array: np.ndarray) -> np.ndarray:
    """An op-id-ordered per-op array in the graph's layout order (identity without one)."""
    perm = getattr(g, "perm", None)
    return op_array if perm is None else np.asarray(op_array)[perm]


# ---------------------------------------------------------------------------- validators
def check_positive(where: str, name: str, v: Any, *, allow_none: bool = True,
                   strict: bool = True) -> None:
    """Raise PolicyError unless ``v`` is a finite number > 0 (>= 0 when not strict)."""
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (v <= 0 if strict else v < 0):
        raise PolicyError(f"{where}.{name}={v!r} must be a finite number "
                          f"{'> 0' if strict else '>= 0'}")


def check_fraction(where: str, name: str, v: Any) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise PolicyError(f"{where}.{name}={v!r} must be a number in [0, 1]")


def check_int(where: str, name: str, v: Any, *, lo: int = 1) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise PolicyError(f"{where}.{name}={v!r} must be an integer >= {lo}")


def check_choice(where: str, name: str, v: Any, choices: tuple) -> None:
    if v is None:
        return
    if v not in choices:
        raise PolicyError(f"{where}.{name}={v!r}; choose one of "
                          f"{', '.join(map(str, choices))}")


# ---------------------------------------------------------------------------- policy base
#: the ops' place in the training step (13 bytes per op): what the what-ifs that find
#: backward all-reduces, forward passes or micro-batches in a measured trace read beyond
#: :data:`replay.footprint.WHATIF_COLUMNS` (never ``op_id``, ``flops`` or ``external_id``)
STRUCTURE_COLUMNS = ("phase", "layer", "microbatch", "stage", "chunk")


def known_fields(cls) -> frozenset[str]:
    """The keys of a policy class (its dataclass fields)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class Policy:
    """Base of every what-if policy (frozen; validated in ``__post_init__``).

    ``table`` is the scenario table (``[network]``) whose keys are the dataclass fields.
    Fields left ``None`` mean "unchanged".
    """

    table: ClassVar[str] = ""

    def ops_columns(self, *, synth: bool = False) -> tuple[str, ...] | None:
        """The ``ops`` columns this policy reads, beyond :data:`WHATIF_COLUMNS` (what
        :func:`replay.whatif` itself reads); ``None``: every column
        (:meth:`columns_for`, or on a synthesized store :meth:`synth_columns_for`, of the
        fields that are set)."""
        fields = frozenset(self.fields())
        return self.synth_columns_for(fields) if synth else self.columns_for(fields)

    @classmethod
    def columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """The ``ops`` columns a policy with these fields set reads, beyond
        :data:`replay.footprint.WHATIF_COLUMNS`; ``None``: every column. ``None`` is the
        default and the answer for any key not audited, so a projected read is used only
        where the policy says so (``retime replay``, issue 30). A policy that re-lays out
        ops builds its new rows from the columns that were read: ``retime replay -o``
        writes such a trace only from a full read (:mod:`replay.projection`)."""
        return None

    @classmethod
    def synth_columns_for(cls, fields: frozenset[str]) -> tuple[str, ...] | None:
        """:meth:`columns_for` on a synthesized store (``meta["synth"]``), whose what-ifs
        mostly change its configs and re-synthesize it (the new trace has every column);
        what they read of the loaded trace is declared apart. ``None`` (the default):
        every column."""
        return None

    def configure(self, state: WhatIfState) -> None:  # phase 1 (optional)
        return None

    def edit(self, state: WhatIfState) -> None:  # between phases: rewrite trace tables
        return None

    def apply(self, state: WhatIfState) -> None:  # phase 2 (optional)
        return None

    def fields(self) -> dict[str, Any]:
        """The fields that are set (not None), for ``meta["scenario"]``."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def describe(self) -> dict[str, Any]:
        return {"policy": self.table, **self.fields()}


# ---------------------------------------------------------------------------- synth spec
@dataclass
class SynthSpec:
    """Mutable copies of a synthesized trace's configs (re-synthesized when ``changed``)."""

    model: Any
    hardware: Any
    parallel: dict[str, Any]
    changed: bool = False

    @classmethod
    def from_trace(cls, trace: Trace) -> SynthSpec | None:
        syn = trace.meta.get("synth") if isinstance(trace.meta, dict) else None
        if not syn or not all(k in syn for k in ("model", "hardware", "parallel")):
            return None
        # the configs parsed once per trace (frozen dataclasses, shared); each what-if gets
        # its own parallel dict. Keyed by the meta dict too: meta edited in place re-parses.
        memo = trace_memo(trace)
        src = (syn["model"], syn["hardware"], syn["parallel"])
        hit = memo.get("synth_spec")
        if hit is not None and hit[0] == src:
            model, hw, par = hit[1]
            return cls(model=model, hardware=hw, parallel=dict(par))
        spec = cls._parse(syn)
        memo["synth_spec"] = (copy.deepcopy(src), (spec.model, spec.hardware,
                                                   dict(spec.parallel)))
        return spec

    @classmethod
    def _parse(cls, syn: dict[str, Any]) -> SynthSpec:
        from retime.collectors.synth import resolve_model
        try:
            hw = hardware_from_dict(syn["hardware"])
            model = resolve_model(dict(syn["model"]))
        except (TypeError, ConfigError) as exc:  # a synth trace from another version
            raise PolicyError(f"cannot rebuild the synthesized run's configs from "
                              f"meta['synth'] ({exc}); re-synthesize the trace with this "
                              "version of retime") from exc
        par = {k: v for k, v in syn["parallel"].items()
               if k not in ("world_size", "num_microbatches")}
        return cls(model=model, hardware=hw, parallel=par)

    def set_parallel(self, **kw: Any) -> None:
        for k, v in kw.items():
            if v is not None and self.parallel.get(k) != v:
                self.parallel[k] = v
                self.changed = True

    def set_hardware(self, hw: Any) -> None:
        if hw != self.hardware:
            self.hardware = hw
            self.changed = True

    def synthesize(self, step: int = 0) -> Trace:
        """The synthesized run of these configs, reused while the same configs are asked
        again and the trace it returned was not edited in place (sweeps re-synthesize the
        same network or layout for many scenarios)."""
        from retime.collectors.synth import synthesize
        key = self._key(step)
        hit = _SYNTH_CACHE.get(key)
        if hit is not None and _fingerprint(hit[0]) == hit[1]:
            _SYNTH_CACHE[key] = _SYNTH_CACHE.pop(key)  # most recently used last
            return hit[0]
        try:
            t = synthesize(self.model, self.hardware, dict(self.parallel), step=step,
                           check_memory=False)
        except ConfigError as exc:
            raise PolicyError(f"the scenario's layout is impossible: {exc}") from exc
        _SYNTH_CACHE.pop(key, None)
        while len(_SYNTH_CACHE) >= _SYNTH_CACHE_SIZE:
            _SYNTH_CACHE.pop(next(iter(_SYNTH_CACHE)))
        _SYNTH_CACHE[key] = (t, _fingerprint(t))
        return t

    def _key(self, step: int) -> str:
        # json.dumps of [model, hardware, parallel, step], the configs' parts reused while
        # the same (frozen) config objects come back: a sweep's what-ifs share the model
        parts = [_config_json(self.model), _config_json(self.hardware),
                 json.dumps(self.parallel, sort_keys=True, default=repr), str(int(step))]
        return "[" + ", ".join(parts) + "]"


def _config_json(x: Any) -> str:
    """``json.dumps(asdict(x))`` of a frozen config dataclass, cached for the last few
    objects (held, so that their ids stay theirs)."""
    hit = _CONFIG_JSON.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    plain = dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x
    js = json.dumps(plain, sort_keys=True, default=repr)
    frozen_dc = dataclasses.is_dataclass(x) and x.__dataclass_params__.frozen
    if frozen_dc:
        while len(_CONFIG_JSON) >= 8:
            _CONFIG_JSON.pop(next(iter(_CONFIG_JSON)))
        _CONFIG_JSON[id(x)] = (x, js)
    return js


_CONFIG_JSON: dict[int, tuple[Any, str]] = {}
_SYNTH_CACHE: dict[str, tuple[Trace, tuple]] = {}
_SYNTH_CACHE_SIZE = 2


def hardware_from_dict(d: dict[str, Any]):
    """A HardwareConfig from ``HardwareConfig.to_dict()`` output (unknown keys ignored): the
    synthesizer's own reader (``collectors.synth.hardware.hardware_from_dict``)."""
    from retime.collectors.synth.hardware import hardware_from_dict as _from_dict
    return _from_dict(d)


# ---------------------------------------------------------------------------- state
@dataclass
class WhatIfState:
    """Everything a what-if accumulates before the one replay (see the module docstring)."""

    trace: Trace
    synth: SynthSpec | None = None
    ranks_per_node: int | None = None
    ideal: bool = False
    mode: str = "fast"
    contention: ContentionModel | None = None
    graph: ReplayGraph | None = None
    _dur: np.ndarray | None = None  # float64 per op (phase 2): see the ``dur`` property
    _scale: tuple[np.ndarray, np.ndarray] | None = None  # pending (class per op, factors)
    _base_dur: np.ndarray | None = None  # the graph's float durations (op-id order, frozen)
    _base_of: tuple | None = None  # (perm, dur_ns) of the graph _base_dur comes from
    applied: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    memory_delta_bytes: int = 0
    pure: bool = False  # edited synthesized tables: every dependency has lag 0 (see edit)
    _esrc: list[np.ndarray] = field(default_factory=list)
    _edst: list[np.ndarray] = field(default_factory=list)
    phase: int = 1

    @property
    def is_synth(self) -> bool:
        return self.synth is not None

    def materialize(self, policies: list | None = None) -> None:
        """End of phase 1: re-synthesize a changed synthesized run, let policies edit the
        trace's tables (``Policy.edit``), build the graph."""
        if self.synth is not None and self.synth.changed:
            memo = trace_memo(self.trace)
            step = memo.get("first_step")
            if step is None:
                step = memo["first_step"] = (int(self.trace.ops["step"].min())
                                             if self.trace.n_ops else 0)
            self.trace = self.synth.synthesize(step=step)
            self.notes["resynthesized"] = True
        for p in policies or []:
            p.edit(self)
        self.graph = cached_graph(self.trace, ideal=self.ideal)
        if self.pure:
            # edited edges contradict the tables' scheduled times (which the graph would
            # clamp them to); a synthesized run's dependencies all have lag 0, so use them as
            # pure dependencies instead
            g = self.graph
            z = np.zeros_like
            self.graph = dataclasses.replace(
                g, lane_lag_ns=z(g.lane_lag_ns), lane_s2s=z(g.lane_s2s),
                pred_lag_ns=z(g.pred_lag_ns), pred_s2s=z(g.pred_s2s), delay_ns=z(g.delay_ns))
        m = self.graph.memo()  # the graph's durations as float64, op-id order (read-only)
        d = m.get("op_dur_f64")
        if d is None:
            d = m["op_dur_f64"] = frozen(by_op(self.graph, "dur_ns").astype(np.float64))
        self._base_dur = d  # copied when a policy first reads or writes state.dur
        self._base_of = (self.graph.perm, self.graph.dur_ns)  # the layout d comes from
        self._dur = None
        self._scale = None
        self.phase = 2

    @property
    def dur(self) -> np.ndarray | None:
        """The modeled durations, float64 ns per op (op-id order; phase 2), for policies to
        read and edit in place. Made on first use: until then the what-if's durations are
        the graph's own, scaled per class by :meth:`scale_by_class` if asked, and
        :meth:`layout_durations` computes them in one pass in layout order (no op-order
        copy: what most sweep scenarios need)."""
        if self._dur is None and self._base_dur is not None:
            d = self._base_dur.copy()
            if self._scale is not None:
                cls, f = self._scale
                _scale_by_class(d, cls, f)
                self._scale = None
            self._dur = d
        return self._dur

    @dur.setter
    def dur(self, value: np.ndarray | None) -> None:
        self._dur = value
        self._scale = None

    def scale_by_class(self, cls: np.ndarray, factor: np.ndarray) -> None:
        """``dur *= factor[cls]`` (``cls``: a class per op, op-id order; ``factor``: float64
        per class), deferred while nothing else has touched the durations."""
        cls = np.ascontiguousarray(cls)
        factor = np.ascontiguousarray(factor, np.float64)
        if self._dur is None and self._scale is None and self._base_dur is not None:
            self._scale = (cls, factor)
        else:
            _scale_by_class(self.dur, cls, factor)

    def assume(self, text: str, *, bounded: bool = False, bounds: list | None = None) -> None:
        """Record an ``assumed:`` line. ``bounded``: the prediction's range covers it (it was
        fitted against a stated fact, or ``bounds`` -- key/value dicts -- are the same
        what-if replayed at its limits), so it does not widen the model's share of the range
        (:func:`replay.whatif.step_range`)."""
        self.notes.setdefault("assumed", []).append(text)
        if bounds:
            self.notes.setdefault("range_variants", []).extend(bounds)
        if bounded or bounds:
            self.notes["bounded_assumptions"] = self.notes.get("bounded_assumptions", 0) + 1

    def add_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Extra start edges ``src -> dst`` (dst starts after src ends)."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        keep = src != dst
        if keep.all() and not (src.flags.writeable or dst.flags.writeable):
            # read-only (a per-graph memo, as overlap.mode = "serial" passes): kept as is, so
            # that final_graph recognizes the edges it derived a graph from by identity
            self._esrc.append(src)
            self._edst.append(dst)
            return
        self._esrc.append(src[keep])
        self._edst.append(dst[keep])

    def final_graph(self) -> ReplayGraph:
        g = self.graph
        if self._esrc:
            one = len(self._esrc) == 1 and not self._esrc[0].flags.writeable
            src = self._esrc[0] if one else np.concatenate(self._esrc)
            dst = self._edst[0] if one else np.concatenate(self._edst)
            if len(src):
                # the same extra edges on the same graph (a sweep's serial scenarios): the
                # derived graph is reused (graphs are never modified in place)
                m = g.memo()
                hit = m.get("with_edges")
                if hit is not None and ((hit[0] is src and hit[1] is dst) or (
                        np.array_equal(hit[0], src) and np.array_equal(hit[1], dst))):
                    return hit[2]
                g2 = g.with_edges(src, dst)
                m["with_edges"] = (frozen(src), frozen(dst), g2)
                g = g2
        return g

    def final_durations(self) -> np.ndarray:
        """The durations to replay, int64 ns in op-id order (see :meth:`layout_durations`)."""
        g = self.graph
        return g.by_op(self.layout_durations(g)[0])

    def layout_durations(self, g: ReplayGraph) -> tuple[np.ndarray, bool]:
        """``state.dur`` rounded to int64 ns in ``g``'s layout order (what the kernels take),
        with negative values set to 0 except on collective members (a skewed clock's
        negative transfer tail), and whether they differ from the graph's own (``g.dur_ns``
        itself is returned when they do not)."""
        out = np.empty(g.n_ops, np.int64)
        if self._dur is None and self._scale is not None and self._base_of is not None \
                and g.perm is self._base_of[0] and g.dur_ns is self._base_of[1]:
            # durations not materialized: the graph's own, scaled per class, computed in
            # layout order in one pass (same float products, same rounding)
            cls, f = self._scale
            m = g.memo()
            hit = m.get("class_layout")
            if hit is None or hit[0] is not cls:
                hit = m["class_layout"] = (cls, frozen(np.ascontiguousarray(cls[g.perm])))
            changed = _layout_durations_scaled(g.dur_ns, hit[1], f,
                                               np.ascontiguousarray(g.coll_of, np.int32),
                                               out)
        else:
            changed = _layout_durations(np.ascontiguousarray(self.dur, np.float64),
                                        np.ascontiguousarray(g.perm, np.int32),
                                        np.ascontiguousarray(g.coll_of, np.int32), g.dur_ns,
                                        out)
        return (out, True) if changed else (g.dur_ns, False)

    def require_phase(self, policy: str, phase: int) -> None:
        if self.phase != phase:  # programming error guard, not user input
            raise RuntimeError(f"{policy} called in phase {self.phase}, expected {phase}")

    # ---------------------------------------------------------------- op helpers
    def kinds(self) -> np.ndarray:
        return self.trace.ops["kind"].to_numpy()

    def comm_mask(self) -> np.ndarray:
        k = self.kinds()
        return (k == OpKind.COLLECTIVE) | (k == OpKind.P2P)


def ranks_per_node_of(trace: Trace, override: int | None = None) -> int:
    """Ranks per node: the override, else ranks sharing a host name in ``meta``, else the
    synthesized run's NVLink domain (its GPUs per node where the domain is one node), else
    every rank on one node."""
    if override:
        return int(override)
    m = trace.meta if isinstance(trace.meta, dict) else {}
    hosts = m.get("hostnames") or m.get("hosts")
    if isinstance(hosts, dict) and hosts:
        from collections import Counter
        return max(Counter(hosts.values()).values())
    syn = m.get("synth")
    if isinstance(syn, dict) and isinstance(syn.get("hardware"), dict):
        return int(syn.get("nvlink_domain") or syn["hardware"].get("gpus_per_node", 8))
    return max(int(m.get("world_size") or 0), int(trace.ops["rank"].max()) + 1 if trace.n_ops else 1)


def node_span(ranks: np.ndarray | list[int], ranks_per_node: int) -> int:
    """Number of nodes a set of ranks touches (rank r is on node ``r // ranks_per_node``)."""
    r = np.asarray(ranks, np.int64)
    if len(r) == 0:
        return 1
    return int(len(np.unique(r // max(1, ranks_per_node))))
