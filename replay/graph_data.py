"""ReplayGraph: the contiguous arrays the replay kernels run on, and its copy-with methods.

Built by :func:`replay.graph.build_graph` / :func:`replay.graph.graph_from_arrays` (the model
of what one op waits for is in :mod:`replay.graph`'s docstring); policies derive new graphs
with :meth:`ReplayGraph.with_durations`, :meth:`ReplayGraph.with_edges` or
``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from retime.collectors.enums import EdgeKind
from retime.collectors.errors import ReplayError
from retime.collectors.trace import Trace

from .graph_arrays import _csr
from .graph_order import _node_of, _order_or_raise

__all__ = ["ReplayGraph", "RES_NONE", "RES_COMPUTE", "RES_COMM"]

_I64 = np.int64
_I32 = np.int32

# resource class of an op in the contention model
RES_NONE, RES_COMPUTE, RES_COMM = 0, 1, 2


@dataclass(frozen=True, eq=False)
class ReplayGraph:
    """Contiguous arrays of a replay graph (all ``int64`` unless noted; N ops).

    **Layout.** The kernel arrays below are indexed by *layout position*, not op id: ops are
    laid out in a topological order close to measured time (collective members adjacent),
    so the kernels walk memory almost sequentially. ``perm[k]`` is the op id at position
    ``k``, ``pos[op_id]`` its position; :meth:`by_op` turns a per-position array into op-id
    order. Everything that crosses the API (``durations_ns``, :meth:`with_durations`,
    :meth:`with_edges`, results) uses op ids; ``rank``, ``lane``, ``measured_delay_ns`` and
    ``meas_*`` are in op-id order too.

    Attributes
    ----------
    dur_ns : modeled duration (collective members: transfer tail after the last arrival;
        blocking calls: the part not spent waiting)
    delay_ns : unexplained release delay (zeros when ``ideal``); ``measured_delay_layout_ns``
        keeps it (the same array when not ``ideal``; :attr:`measured_delay_ns` in op-id order)
    origin_ns : ready time of ops without predecessors (their rank's first measured start)
    lane_prev (int32), lane_lag_ns, lane_s2s (bool) : previous op on the same lane (-1), the lag
        after its end (after its start where ``lane_s2s``: the two overlapped when measured)
    pred_ptr (int32, N+1), pred_src (int32), pred_lag_ns, pred_kind (int8), pred_s2s (bool) : CSR of start
        edges by dst; ``pred_s2s`` edges count ``pred_lag_ns`` from the source's *start*
    wait_ptr (int32, N+1), wait_src (int32), wait_lag_ns : CSR of end constraints
        (``end >= src end + lag``)
    coll_of (int32) : dense collective index per op (-1); coll_ptr (int32, C+1), coll_members
        (int32) : members
    order (int32) : representatives (an op, or a collective's first member) in topological
        order
    device (int32, dense, -1 on CPU lanes), resource (int8: 0 none, 1 compute,
        2 communication), link (int32, -1 none) : for the contention path
    perm, pos (int32) : layout position -> op id, and op id -> layout position
    rank (int32), lane (int32), meas_start_ns, meas_dur_ns : op-id order (the measured times
        are the trace's own arrays; :attr:`meas_end_ns` is computed on demand)

    Index arrays are int32 (graphs up to 2**30 - 1 ops and edges); the engine converts arrays
    a policy replaced with other integer types.
    """

    dur_ns: np.ndarray
    delay_ns: np.ndarray
    measured_delay_layout_ns: np.ndarray
    origin_ns: np.ndarray
    lane_prev: np.ndarray
    lane_lag_ns: np.ndarray
    lane_s2s: np.ndarray
    pred_ptr: np.ndarray
    pred_src: np.ndarray
    pred_lag_ns: np.ndarray
    pred_kind: np.ndarray
    pred_s2s: np.ndarray
    wait_ptr: np.ndarray
    wait_src: np.ndarray
    wait_lag_ns: np.ndarray
    coll_of: np.ndarray
    coll_ptr: np.ndarray
    coll_members: np.ndarray
    order: np.ndarray
    perm: np.ndarray
    pos: np.ndarray
    rank: np.ndarray
    lane: np.ndarray
    device: np.ndarray
    resource: np.ndarray
    link: np.ndarray
    meas_start_ns: np.ndarray
    meas_dur_ns: np.ndarray
    ideal: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    trace: Trace | None = field(default=None, repr=False)

    @property
    def n_ops(self) -> int:
        return int(self.dur_ns.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.pred_src.shape[0])

    @property
    def n_collectives(self) -> int:
        return int(self.coll_ptr.shape[0] - 1)

    @property
    def nbytes(self) -> int:
        """Bytes held by the graph's own arrays (the measured times are views of the trace;
        an array held by two fields counts once)."""
        own = {id(v): v for k, v in self.__dict__.items()
               if isinstance(v, np.ndarray) and k not in ("meas_start_ns", "meas_dur_ns")}
        return int(sum(a.nbytes for a in own.values()))

    @property
    def meas_end_ns(self) -> np.ndarray:
        """Measured end of every op (op-id order; computed on demand, not stored)."""
        return self.meas_start_ns + self.meas_dur_ns

    @property
    def measured_delay_ns(self) -> np.ndarray:
        """Unexplained release delay of every op as measured (op-id order; kept even when
        ``ideal`` or a policy changed :attr:`delay_ns`)."""
        return self.measured_delay_layout_ns[self.pos]

    def by_op(self, layout_array: np.ndarray) -> np.ndarray:
        """A per-position kernel array (``dur_ns``, ``delay_ns``, ...) in op-id order."""
        return np.asarray(layout_array)[self.pos]

    def memo(self) -> dict[Any, Any]:
        """Values derived from this graph alone (op-order arrays, the contention path's
        successor lists, ...), kept with the graph. Graphs are never modified in place
        (policies derive new ones with ``dataclasses.replace``, which starts a new memo);
        cached arrays are read-only."""
        d = self.__dict__.get("_memo")
        if d is None:
            d = {}
            object.__setattr__(self, "_memo", d)
        return d

    def __getstate__(self) -> dict[str, Any]:
        """Pickles and copies leave the memo behind (rebuilt on demand)."""
        d = dict(self.__dict__)
        d.pop("_memo", None)
        return d

    def op_order(self, name: str) -> np.ndarray:
        """Kernel array ``name`` in op-id order (``by_op(getattr(self, name))``), cached and
        read-only."""
        m = self.memo()
        key = ("op_order", name)
        a = m.get(key)
        if a is None:
            a = np.asarray(getattr(self, name))[self.pos]
            a.flags.writeable = False
            m[key] = a
        return a

    @property
    def op_dur_ns(self) -> np.ndarray:
        """Modeled durations in op-id order (what ``simulate(durations_ns=...)`` takes)."""
        return self.dur_ns[self.pos]

    def with_durations(self, dur_ns: np.ndarray) -> ReplayGraph:
        """A copy with other modeled durations (op-id order; meaning of :attr:`dur_ns`)."""
        return replace(self, dur_ns=np.ascontiguousarray(_check_durations(self, dur_ns)[self.perm]))

    def with_edges(self, src, dst, lag_ns=0, kind: int = int(EdgeKind.DATA)) -> ReplayGraph:
        """A copy with extra start edges ``src -> dst`` (op ids; re-checked for cycles)."""
        src = np.ascontiguousarray(src, _I64)
        dst = np.ascontiguousarray(dst, _I64)
        lag = np.ascontiguousarray(np.broadcast_to(np.asarray(lag_ns, _I64), src.shape))
        src = src.astype(_I32)
        dst = dst.astype(_I32)
        n = self.n_ops
        if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise ReplayError(f"with_edges: op ids must lie in 0..{n - 1}; got src/dst "
                              f"{int(min(src.min(), dst.min()))}..{int(max(src.max(), dst.max()))}")
        src, dst = self.pos[src], self.pos[dst]
        old_dst = np.repeat(np.arange(n, dtype=_I64), np.diff(self.pred_ptr))
        a_src = np.concatenate([self.pred_src, src])
        a_dst = np.concatenate([old_dst, dst])
        a_lag = np.concatenate([self.pred_lag_ns, lag])
        a_kind = np.concatenate([self.pred_kind, np.full(len(src), kind, np.int8)])
        a_s2s = np.concatenate([self.pred_s2s, np.zeros(len(src), bool)])
        node_of = _node_of(n, self.coll_of, self.coll_ptr, self.coll_members)
        keep = node_of[a_src] != node_of[a_dst]
        ptr, s, lg, kd, s2 = _csr(n, a_dst[keep], a_src[keep], a_lag[keep], a_kind[keep],
                                  a_s2s[keep])
        key = self.meas_start_ns[self.perm]  # layout order; collectives keyed by first member
        order = _order_or_raise(node_of, self.lane_prev, ptr, s, self.wait_ptr, self.wait_src,
                                self.trace, self.meas_start_ns, key=key, perm=self.perm)
        return replace(self, pred_ptr=ptr, pred_src=s, pred_lag_ns=lg, pred_kind=kd,
                       pred_s2s=s2, order=order)


def _check_durations(g: ReplayGraph, dur_ns) -> np.ndarray:
    d = np.ascontiguousarray(dur_ns, dtype=_I64)
    if d.shape != (g.n_ops,):
        raise ReplayError(f"durations_ns has shape {d.shape}, expected ({g.n_ops},): one "
                          "duration per op, aligned with trace.ops")
    neg = d < 0
    if not neg.any():
        return d
    bad = neg & (g.op_order("coll_of") < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ReplayError(f"durations_ns[{i}] = {int(d[i])} is negative (op {i}, rank "
                          f"{int(g.rank[i])}); durations must be >= 0")
    return d
