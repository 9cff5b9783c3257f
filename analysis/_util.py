"""Small helpers shared by the analysis modules: input normalization and op classification."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.errors import RetimeError
from retime.collectors.kernel_classes import is_comm_kernel
from retime.collectors.steps import step_windows as _step_windows
from retime.collectors.trace import Trace

from ._kernels import _clip_to_windows

__all__ = ["as_trace", "device_mask", "host_mask", "op_ends_ns", "step_windows",
           "clip_to_windows", "rank_windows", "comm_mask",
           "COMPUTE_KINDS", "COMM_KINDS", "MEM_KINDS", "HOST_KINDS", "memo_scope"]

#: op kinds counted as device compute, communication, memory traffic and host work
COMPUTE_KINDS = (int(OpKind.KERNEL), int(OpKind.COMPUTE))
COMM_KINDS = (int(OpKind.COLLECTIVE), int(OpKind.P2P))
MEM_KINDS = (int(OpKind.MEMCPY), int(OpKind.MEMSET))
HOST_KINDS = (int(OpKind.CPU_OP), int(OpKind.RUNTIME))


# Per-trace values several analyses need (step windows, masks), shared while a scope is open:
# a report runs a dozen analyses on one trace that nothing edits meanwhile. Outside a scope
# nothing is cached (a notebook may edit a trace's columns between calls).
_SCOPES: list[dict[tuple[int, str], tuple[Trace, Any]]] = []


@contextlib.contextmanager
def memo_scope() -> Iterator[None]:
    """Compute each trace's step windows and op masks once until the block ends (nothing may
    edit the traces' tables in place meanwhile). Nested scopes share the outer one."""
    _SCOPES.append(_SCOPES[-1] if _SCOPES else {})
    try:
        yield
    finally:
        _SCOPES.pop()


def _memo(trace: Trace, key: str, fn: Callable[[], Any]) -> Any:
    if not _SCOPES:
        return fn()
    m = _SCOPES[-1]
    hit = m.get((id(trace), key))
    if hit is not None and hit[0] is trace:
        return hit[1]
    v = fn()
    if isinstance(v, np.ndarray):
        v.flags.writeable = False
    m[(id(trace), key)] = (trace, v)  # holds the trace: its id cannot be reused meanwhile
    return v


def as_trace(x: Any) -> Trace:
    """Return the Trace behind ``x``: a Trace itself, or a ReplayResult's replayed trace.

    A ReplayResult (anything with a ``to_trace()`` method) becomes the Trace whose ops carry
    the replayed ``start_ns``/``dur_ns``, so every analysis function works on both.
    """
    if isinstance(x, Trace):
        return x
    to_trace = getattr(x, "to_trace", None)
    if callable(to_trace):
        t = to_trace()
        if isinstance(t, Trace):
            return t
    raise RetimeError(
        f"expected a Trace or a ReplayResult, got {type(x).__name__}; load one with "
        "collectors.read_trace(path) or replay.simulate(...)")


def comm_mask(trace: Trace) -> np.ndarray:
    """Communication ops: collective/p2p kinds, and kernels whose name the kernel-class table
    calls communication (a store ingested before the table knew a name: NVLS, DeepEP ...),
    so that the breakdown counts as communication what kernel stats call communication."""
    o = trace.ops
    kind = o["kind"].to_numpy()
    m = isin(kind, COMM_KINDS)
    if len(o) and len(trace.strings) and "name_id" in o.columns:
        k = kind == int(OpKind.KERNEL)
        nid = o["name_id"].to_numpy()
        used = unique(nid[k])
        by_name = np.zeros(len(trace.strings), bool)
        by_name[used] = [is_comm_kernel(str(trace.strings[i])) for i in used.tolist()]
        m |= k & by_name[nid]
    return m


def op_ends_ns(trace: Trace) -> np.ndarray:
    o = trace.ops
    return o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()


def _lane_kind_of_ops(trace: Trace) -> np.ndarray:
    return _memo(trace, "lane_kind", lambda: _lane_kind_of_ops_(trace))


def _lane_kind_of_ops_(trace: Trace) -> np.ndarray:
    lanes = trace.lanes
    if len(lanes) == 0 or len(trace.ops) == 0:
        return np.zeros(len(trace.ops), np.int8)
    lid = lanes["lane"].to_numpy().astype(np.int64)
    lk = lanes["lane_kind"].to_numpy().astype(np.int8)
    lut = np.full(int(lid.max()) + 1, -1, np.int8)
    lut[lid] = lk
    return lut[trace.ops["lane"].to_numpy()]


def device_mask(trace: Trace) -> np.ndarray:
    """Ops that run on the device of their rank (GPU streams and op-level streams).

    A rank without any device lane (CPU-only training, e.g. gloo) uses its CPU-thread leaf
    ops as its "device": that is where its compute and communication run.
    """
    return _memo(trace, "device", lambda: _device_mask(trace))


def _device_mask(trace: Trace) -> np.ndarray:
    o = trace.ops
    lk = _lane_kind_of_ops(trace)
    dev = (lk == int(LaneKind.GPU_STREAM)) | (lk == int(LaneKind.OP_STREAM))
    if len(o) == 0:
        return dev
    ranks = o["rank"].to_numpy().astype(np.int64)
    has_dev = np.bincount(ranks[dev], minlength=int(ranks.max()) + 1) > 0
    present = np.bincount(ranks, minlength=len(has_dev)) > 0
    if (present & ~has_dev).any():
        dev = dev | ~has_dev[ranks]
    return dev


def host_mask(trace: Trace) -> np.ndarray:
    """Host ops (CPU ops and runtime calls on CPU threads) of ranks that have a device."""
    lk = _lane_kind_of_ops(trace)
    return (lk == int(LaneKind.CPU_THREAD)) & ~device_mask(trace)


def step_windows(trace: Trace) -> pd.DataFrame:
    """Per (rank, step): the step window ``[start_ns, end_ns)``; the one definition of
    :mod:`collectors.steps` (windows tile each rank's timeline; a rank without step
    attribution has one window, step -1, spanning all its ops). Shared inside a
    :func:`memo_scope` (a report asks for them a dozen times)."""
    return _memo(trace, "windows", lambda: _step_windows(trace))


def clip_to_windows(trace: Trace, mask: np.ndarray, w: pd.DataFrame,
                    start_ns: np.ndarray | None = None, end_ns: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ops in ``mask`` cut at the windows ``w`` of their rank (rows of ``w`` sorted by
    rank, then start): ``(op index, window row, start, end)`` of every non-empty piece. An
    op counts in every window it overlaps, for the part inside it, whichever step issued
    it: the windows tile the timeline, so time is never counted twice."""
    o = trace.ops
    z = np.zeros(0, np.int64)
    if len(o) == 0 or len(w) == 0 or not mask.any():
        return z, z, z, z
    s = o["start_ns"].to_numpy() if start_ns is None else start_ns
    e = (s + o["dur_ns"].to_numpy()) if end_ns is None else end_ns
    wr = w["rank"].to_numpy().astype(np.int64)
    ur = unique(wr)
    wptr = np.searchsorted(wr, np.r_[ur, ur[-1] + 1]).astype(np.int64)
    ranks = o["rank"].to_numpy().astype(np.int64)
    pos = np.minimum(np.searchsorted(ur, ranks), len(ur) - 1)
    op_r = np.where(mask & (ur[pos] == ranks), pos, -1).astype(np.int64)
    return clip_arrays(op_r, s, e, wptr, w["start_ns"].to_numpy(), w["end_ns"].to_numpy())


def _ro_i64(x) -> np.ndarray:
    """``x`` as a contiguous int64 array seen read-only (a view, no copy when it already
    is int64): pandas hands out writable and read-only arrays alike, and numba compiles one
    specialization for each mix."""
    v = np.ascontiguousarray(x, np.int64).view()
    v.flags.writeable = False
    return v


def clip_arrays(op_r, s, e, wptr, ws, we) -> tuple[np.ndarray, ...]:
    """:func:`._kernels._clip_to_windows` on any int arrays, in one specialization."""
    return _clip_to_windows(*(_ro_i64(x) for x in (op_r, s, e, wptr, ws, we)))


def rank_windows(trace: Trace) -> pd.DataFrame:
    """Per rank: one window from its first step's start to its last step's end (the union
    of its :func:`step_windows`), step -1."""
    w = step_windows(trace)
    g = w.groupby("rank", sort=True).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    return pd.DataFrame({"rank": g.index.to_numpy().astype(np.int32),
                         "step": np.full(len(g), -1, np.int32),
                         "start_ns": g["start_ns"].to_numpy().astype(np.int64),
                         "end_ns": g["end_ns"].to_numpy().astype(np.int64)})


def _keep_step_mask(ranks: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """True for ops issued by a reported step (step >= 0), or by any op of a rank without
    step attribution (its one window, step -1)."""
    if len(ranks) == 0:
        return np.zeros(0, bool)
    r = np.asarray(ranks).astype(np.int64, copy=False)
    st = np.asarray(steps) >= 0
    if r.min() < 0:  # not a rank number: the general (sorting) way
        return st | ~isin(r, unique(r[st]))
    has = np.bincount(r[st], minlength=int(r.max()) + 1) > 0
    return st | ~has[r]
