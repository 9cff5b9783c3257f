"""Step-time breakdown by interval unions: the parts add up to the step time exactly.

For one rank and one step window ``W`` (:mod:`collectors.steps`: windows tile the rank's
timeline, so no time is counted in two steps) let, on the rank's device lanes,

``C`` = union of compute intervals (kernels, op-level compute),
``M`` = union of communication intervals (collective and p2p kernels/ops; a matched
point-to-point send or receive counts from the moment both sides have started: the part
before its peer starts is waiting on the other stage, the pipeline bubble, not transfer),
``Y`` = union of memcpy/memset intervals, and on its CPU threads
``H`` = union of host ops, runtime calls and enclosing host ranges (operator and python
time between leaf ops; ``ProfilerStep#`` markers excluded), every op clipped to ``W``
(the part of an op inside the window counts, whichever step launched it).

The parts, each a length in ns, are disjoint and cover ``W``::

    compute_ns          |C \\ M|                       compute with no communication running
    overlapped_comm_ns  |C ∩ M|                       communication hidden under compute
    exposed_comm_ns     |M \\ C|                       communication nothing else hides
    memcpy_ns           |Y \\ (C ∪ M)|                 copies/memsets alone on the device
    host_bound_ns       |H \\ (C ∪ M ∪ Y)|             device idle while the host is busy
                                                      (waiting for launches)
    idle_ns             |W \\ (C ∪ M ∪ Y ∪ H)|         nothing runs anywhere on the rank
                                                      (or only a send/recv waits for its peer)

so ``compute + overlapped + exposed + memcpy + host_bound + idle == step_ns`` holds exactly
in integer nanoseconds. ``gpu_busy_frac = |C ∪ M ∪ Y| / step_ns``. A rank without device
lanes (CPU-only) uses its CPU ops as the device; its ``host_bound_ns`` is then the time
its enclosing ranges (Python functions, annotations) run outside every op: host work, not idle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import LaneKind, OpKind

from ._kernels import _union_lens_coded
from ._util import (
    COMPUTE_KINDS,
    HOST_KINDS,
    MEM_KINDS,
    _lane_kind_of_ops,
    _memo,
    as_trace,
    clip_arrays,
    clip_to_windows,
    comm_mask,
    device_mask,
    host_mask,
    rank_windows,
    step_windows,
)

__all__ = ["breakdown", "summarize_breakdown", "PARTS", "p2p_peer_starts"]

#: the disjoint parts of a step, in display order
PARTS = ("compute_ns", "overlapped_comm_ns", "exposed_comm_ns", "memcpy_ns",
         "host_bound_ns", "idle_ns")


#: the op sets :func:`_breakdown` unions (bits of its codes: 1 compute, 2 communication,
#: 4 copies, 8 host): C, M, C|M, C|M|Y and everything (with the host ranges)
_SETS = np.array([1, 2, 3, 7, 15], np.int64)
_WITH_RANGES = np.array([False, False, False, False, True])

_STEP_RANGE_RE = r"^ProfilerStep#"


def _host_ranges_in_windows(t, w: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host ranges (on CPU threads; step markers excluded) clipped to every window of their
    rank: (window index, start, end) arrays."""
    r = t.ranges
    z = np.zeros(0, np.int64)
    if len(r) == 0 or len(w) == 0:
        return z, z, z
    lanes = t.lanes
    cpu_lanes = lanes["lane"].to_numpy()[lanes["lane_kind"].to_numpy() == int(LaneKind.CPU_THREAD)]
    names = np.asarray(t.strings, dtype=object)
    is_step = pd.Series(names).str.contains(_STEP_RANGE_RE, regex=True).to_numpy()
    keep = isin(r["lane"].to_numpy(), cpu_lanes) & ~is_step[r["name_id"].to_numpy()]
    if not keep.any():
        return z, z, z
    wr = w["rank"].to_numpy().astype(np.int64)
    ur = unique(wr)
    wptr = np.searchsorted(wr, np.r_[ur, ur[-1] + 1]).astype(np.int64)
    rk = r["rank"].to_numpy().astype(np.int64)
    pos = np.minimum(np.searchsorted(ur, rk), len(ur) - 1)
    op_r = np.where(keep & (ur[pos] == rk), pos, -1).astype(np.int64)
    _, g, s, e = clip_arrays(op_r, r["start_ns"].to_numpy(), r["end_ns"].to_numpy(), wptr,
                             w["start_ns"].to_numpy(), w["end_ns"].to_numpy())
    return g, s, e


def p2p_peer_starts(ops: pd.DataFrame) -> pd.Series:
    """Per ``coll_id`` of the point-to-point ops in ``ops``, the latest start among them
    (a send and its receive share a ``coll_id``): data moves from then on."""
    if "coll_id" not in ops.columns:
        return pd.Series([], dtype=np.int64)
    p2p = (ops["kind"].to_numpy() == int(OpKind.P2P)) & (ops["coll_id"].to_numpy() >= 0)
    return (pd.Series(ops["start_ns"].to_numpy()[p2p].astype(np.int64))
            .groupby(ops["coll_id"].to_numpy()[p2p]).max())


def p2p_transfer_start(t: Any, later: pd.Series | None = None) -> np.ndarray:
    """Every op's start, where a matched point-to-point op (a send and its receive share a
    ``coll_id``) starts when the later of the two does (at most at its own end): before
    that it waits for the other rank, the pipeline bubble, and moves no data. ``later``:
    :func:`p2p_peer_starts` of every rank (a batch of ranks lacks its peers' ops)."""
    o = t.ops
    start = o["start_ns"].to_numpy().astype(np.int64)
    if "coll_id" not in o.columns:
        return start
    p2p = (o["kind"].to_numpy() == int(OpKind.P2P)) & (o["coll_id"].to_numpy() >= 0)
    if not p2p.any():
        return start
    if later is None:
        later = p2p_peer_starts(o)
    s = start[p2p]
    peer = later.reindex(o["coll_id"].to_numpy()[p2p]).fillna(-1).to_numpy().astype(np.int64)
    end = s + o["dur_ns"].to_numpy()[p2p].astype(np.int64)
    out = start.copy()
    out[p2p] = np.minimum(np.maximum(s, peer), end)
    return out


def breakdown(x: Any, *, by: str = "step", p2p_later: pd.Series | None = None
              ) -> pd.DataFrame:
    """Per rank (and step) breakdown of the step time into disjoint parts.

    Parameters
    ----------
    x : Trace or ReplayResult
    by : ``"step"`` (one row per rank and step) or ``"rank"`` (one row per rank, window =
        the union of its step windows, from its first step's start to its last step's end;
        a ``steps`` column counts them: the row is their sum, not one step)

    Returns
    -------
    DataFrame with ``rank``, ``step``, ``start_ns``, ``end_ns``, ``step_ns``, the
    :data:`PARTS` columns (summing exactly to ``step_ns``), ``busy_ns`` and
    ``gpu_busy_frac``.
    """
    if by not in ("step", "rank"):
        from retime.collectors.errors import RetimeError
        raise RetimeError(f"breakdown(by={by!r}): choose 'step' or 'rank'")
    t = as_trace(x)
    # a report asks for it from several sections: computed once per trace in a memo scope
    if p2p_later is not None:
        return _breakdown(t, by, p2p_later)
    return _memo(t, f"breakdown:{by}", lambda: _breakdown(t, by)).copy()


def _breakdown(t: Any, by: str, p2p_later: pd.Series | None = None) -> pd.DataFrame:
    o = t.ops
    kind = o["kind"].to_numpy()
    w = step_windows(t) if by == "step" else rank_windows(t)
    n = len(w)
    dev = device_mask(t)
    host = host_mask(t) & isin(kind, HOST_KINDS)
    # a CPU-only rank computes on its CPU threads
    cpu_dev = dev & (_lane_kind_of_ops(t) == int(LaneKind.CPU_THREAD))
    is_comm = comm_mask(t)
    c = dev & ~is_comm & (isin(kind, COMPUTE_KINDS) | (cpu_dev & isin(kind, HOST_KINDS)))
    m = dev & is_comm
    y = dev & isin(kind, MEM_KINDS)
    # one code per op (bits: compute, comm, copies, host), every op of interest cut at the
    # windows it overlaps (once: the codes select pieces)
    code = (c.astype(np.int64) | (m.astype(np.int64) << 1) | (y.astype(np.int64) << 2)
            | (host.astype(np.int64) << 3))
    idx, gidx, start, end = clip_to_windows(
        t, code != 0, w, start_ns=p2p_transfer_start(t, p2p_later),
        end_ns=(o["start_ns"].to_numpy() + o["dur_ns"].to_numpy()).astype(np.int64))
    code = code[idx]

    # one sort by (window, start) of every piece; the host ranges (operator and python time
    # between leaf ops, clipped to each window of the rank) sorted alone and merged in; the
    # unions of C, M, C|M, C|M|Y and of everything with the host ranges in one pass
    order = np.lexsort((start, gidx)) if len(gidx) else gidx
    hr_g, hr_s, hr_e = _host_ranges_in_windows(t, w)
    ho = np.lexsort((hr_s, hr_g))
    u = _union_lens_coded(*(np.ascontiguousarray(x[order], dtype=np.int64)
                            for x in (gidx, start, end, code)), _SETS,
                          *(np.ascontiguousarray(x[ho], dtype=np.int64)
                            for x in (hr_g, hr_s, hr_e)), _WITH_RANGES, n)
    u_c, u_m, u_cm, u_cmy, u_all = (np.ascontiguousarray(u[:, k]) for k in range(5))
    step_ns = (w["end_ns"].to_numpy() - w["start_ns"].to_numpy()).astype(np.int64)
    out = pd.DataFrame({
        "rank": w["rank"].to_numpy().astype(np.int32),
        "step": w["step"].to_numpy().astype(np.int32),
        "start_ns": w["start_ns"].to_numpy().astype(np.int64),
        "end_ns": w["end_ns"].to_numpy().astype(np.int64),
        "step_ns": step_ns,
        "compute_ns": u_cm - u_m,
        "overlapped_comm_ns": u_c + u_m - u_cm,
        "exposed_comm_ns": u_cm - u_c,
        "memcpy_ns": u_cmy - u_cm,
        "host_bound_ns": u_all - u_cmy,
        "idle_ns": step_ns - u_all,
        "busy_ns": u_cmy,
    })
    with np.errstate(divide="ignore", invalid="ignore"):
        out["gpu_busy_frac"] = np.where(step_ns > 0, u_cmy / np.maximum(step_ns, 1), np.nan)
    if by == "rank":
        sw = step_windows(t)
        n_steps = sw.groupby("rank").size()
        out.insert(2, "steps", n_steps.reindex(out["rank"].to_numpy()).fillna(0).to_numpy()
                   .astype(np.int64))
    return out


def summarize_breakdown(bd: pd.DataFrame) -> pd.DataFrame:
    """Mean over steps per rank, plus each part as a fraction of the step (``*_frac``).
    Rows of ``breakdown(by="rank")`` (a rank's steps summed, counted in ``steps``) give the
    same means as the per-step rows: the steps' windows tile the rank's row."""
    if len(bd) == 0:
        return bd.copy()
    cols = ["step_ns", *PARTS, "busy_ns"]
    if "steps" in bd.columns:  # per rank: sums over its steps
        g = bd.groupby("rank", sort=True)
        n = g["steps"].sum()
        s = (g[cols].sum().div(n.where(n > 0), axis=0)).reset_index()
        s.insert(1, "steps", n.to_numpy())
    else:
        s = bd.groupby("rank", sort=True)[cols].mean().reset_index()
        s.insert(1, "steps", bd.groupby("rank", sort=True).size().to_numpy())
    for p in PARTS:
        s[p.replace("_ns", "_frac")] = s[p] / s["step_ns"].where(s["step_ns"] > 0)
    s["gpu_busy_frac"] = s["busy_ns"] / s["step_ns"].where(s["step_ns"] > 0)
    return s
