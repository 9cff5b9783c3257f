"""Small helpers shared by the analysis modules: input normalization and op classification."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.errors import RetimeError
from retime.collectors.trace import Trace

__all__ = ["as_trace", "device_mask", "host_mask", "op_ends_ns", "step_windows",
           "COMPUTE_KINDS", "COMM_KINDS", "MEM_KINDS", "HOST_KINDS"]

#: op kinds counted as device compute, communication, memory traffic and host work
COMPUTE_KINDS = (int(OpKind.KERNEL), int(OpKind.COMPUTE))
COMM_KINDS = (int(OpKind.COLLECTIVE), int(OpKind.P2P))
MEM_KINDS = (int(OpKind.MEMCPY), int(OpKind.MEMSET))
HOST_KINDS = (int(OpKind.CPU_OP), int(OpKind.RUNTIME))


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


def op_ends_ns(trace: Trace) -> np.ndarray:
    o = trace.ops
    return o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()


def _lane_kind_of_ops(trace: Trace) -> np.ndarray:
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
    o = trace.ops
    lk = _lane_kind_of_ops(trace)
    dev = (lk == int(LaneKind.GPU_STREAM)) | (lk == int(LaneKind.OP_STREAM))
    if len(o) == 0:
        return dev
    ranks = o["rank"].to_numpy()
    has_dev = pd.Series(dev).groupby(ranks).any()
    cpu_only = has_dev.index.to_numpy()[~has_dev.to_numpy()]
    if len(cpu_only):
        dev = dev | np.isin(ranks, cpu_only)
    return dev


def host_mask(trace: Trace) -> np.ndarray:
    """Host ops (CPU ops and runtime calls on CPU threads) of ranks that have a device."""
    lk = _lane_kind_of_ops(trace)
    return (lk == int(LaneKind.CPU_THREAD)) & ~device_mask(trace)


def step_windows(trace: Trace) -> pd.DataFrame:
    """Per (rank, step): the step window ``[start_ns, end_ns)`` spanned by the step's ops.

    Ops with ``step == -1`` are left out when the rank has step attribution; a rank without
    any step attribution has one window (step -1) spanning all its ops.
    """
    o = trace.ops
    if len(o) == 0:
        return pd.DataFrame({"rank": np.zeros(0, np.int32), "step": np.zeros(0, np.int32),
                             "start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64)})
    ranks = o["rank"].to_numpy().astype(np.int64)
    steps = o["step"].to_numpy().astype(np.int64)
    keep = _keep_step_mask(ranks, steps)
    key = (ranks * (1 << 32) + (steps + 1))[keep]
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, int)
    s = o["start_ns"].to_numpy()[keep][order]
    e = op_ends_ns(trace)[keep][order]
    uk = key[first]
    return pd.DataFrame({
        "rank": (uk >> 32).astype(np.int32),
        "step": ((uk & 0xFFFFFFFF) - 1).astype(np.int32),
        "start_ns": np.minimum.reduceat(s, first) if len(first) else s[:0],
        "end_ns": np.maximum.reduceat(e, first) if len(first) else e[:0]})


def _keep_step_mask(ranks: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """True for ops that belong to a reported step window (see :func:`step_windows`)."""
    if len(ranks) == 0:
        return np.zeros(0, bool)
    ranks_with_steps = np.unique(ranks[steps >= 0])
    return (steps >= 0) | ~np.isin(ranks, ranks_with_steps)
