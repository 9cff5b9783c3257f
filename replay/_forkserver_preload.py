"""Imported by the forkserver of local sweep workers (:func:`replay.sweep._mp_context`).

Importing this module is its purpose: it imports retime's replay stack and runs two-op
replays (fast and contention paths) and the row-metric kernels once, so the numba kernels
are loaded from their cache in the forkserver, before it
forks the workers. Each worker then starts hot instead of paying seconds of JIT-cache
loading (the forkserver is single-threaded, so forking it is safe).
"""

from __future__ import annotations

import contextlib

import numpy as np

from retime.collectors.errors import RetimeError
from retime.collectors.trace import Trace

from .engine import simulate
from .graph import build_graph
from .sweep import scenario_metrics


def _warm() -> None:
    """Best effort: a failure here must never take the forkserver down (workers would then
    only start slower), so every error is swallowed."""
    try:
        _run_once()
    except Exception:  # noqa: BLE001 - warm-up is an optimization, not a requirement
        pass


def _run_once() -> None:
    t = Trace.build(
        ops={"rank": np.zeros(2, np.int32), "lane": np.zeros(2, np.int32),
             "kind": np.zeros(2, np.int8), "name_id": np.zeros(2, np.int32),
             "start_ns": np.array([0, 10], np.int64), "dur_ns": np.array([5, 5], np.int64)},
        lanes={"lane": np.zeros(1, np.int32), "rank": np.zeros(1, np.int32),
               "lane_kind": np.ones(1, np.int8)},
        strings=["warm-up"])
    scenario_metrics(simulate(build_graph(t)))
    _warm_layout_kernels()
    with contextlib.suppress(ImportError, RetimeError):
        from . import whatif  # the what-if policies and their kernels

        whatif(t, {})
        # the contention path (replay._fluid) and the deferred per-class scaling
        whatif(t, {"hardware.compute_speedup": 1.5, "overlap.interference": 0.5})


def _warm_layout_kernels() -> None:
    """The row metrics' layout-order kernel, for both result forms (the fast path's int64
    ns, the contention path's floats), with the argument types scenario_metrics passes (the
    two-op trace has no device op, so scenario_metrics itself skips it)."""
    from ._metric_kernels import _metric_spans_layout

    i64 = np.int64
    slot, kind = np.array([0, -1], np.int32), np.array([2, 0], np.int8)
    for st in (np.array([0.0, 1.0]), np.array([0, 1], i64)):
        _metric_spans_layout(st, st + st.dtype.type(2), i64(0), slot, kind, np.zeros(2, i64),
                             np.array([0, 1], i64), np.zeros(1, i64), np.zeros(1, i64),
                             np.zeros(1, i64), np.zeros(1, i64), np.zeros(1, np.bool_),
                             np.empty(1, i64), np.empty(1, i64), np.empty(1, np.bool_))


_warm()
