"""Metrics of one replayed scenario: the columns of a sweep row (:data:`METRICS`).

:func:`scenario_metrics` turns a ReplayResult into step time, tokens/s, MFU, peak memory,
exposed communication, bubble fraction and the OOM flag; :func:`replay.sweep.sweep` calls
it for every scenario (in workers, so it stays cheap: per-graph preparation is cached).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from retime.collectors.devices import device_peaks
from retime.collectors.steps import profiler_steps

from ._metric_kernels import _block_slots, _metric_spans, _metric_spans_layout
from .engine import ReplayResult
from .graph_arrays import _dense_inverse, _lexsort_small
from .graph_data import RES_COMPUTE

__all__ = ["METRICS", "scenario_metrics"]

#: metric columns of a sweep row, in order (``error`` follows them)
METRICS = ("step_time_ns", "step_time_lo_ns", "step_time_hi_ns", "tokens_per_s", "mfu",
           "peak_memory_bytes", "exposed_comm_ns", "bubble_fraction", "oom")
DTYPES = {"step_time_ns": "Int64", "step_time_lo_ns": "Int64", "step_time_hi_ns": "Int64",
          "tokens_per_s": "float64", "mfu": "float64",
          "peak_memory_bytes": "Int64", "exposed_comm_ns": "Int64",
          "bubble_fraction": "float64", "oom": "boolean"}


# ---------------------------------------------------------------------------- metrics
_PREP: dict[int, tuple[Any, dict[str, Any], Any]] = {}  # id(meas_start_ns) -> (ref, prep, ref)


def _prepared(g) -> dict[str, Any]:
    """Per-graph constants (cached while the graph's arrays live): dense rank index, the
    device ops ordered by (rank, measured start), step count."""
    key = g.meas_start_ns
    hit = _PREP.get(id(key))
    if hit is not None and hit[0]() is key and hit[2]() is g.resource:
        return hit[1]
    rank = np.asarray(g.rank)
    if len(rank) and rank.min() >= 0 and rank.max() < 4 * len(rank) + 65536:
        present = np.zeros(int(rank.max()) + 1, bool)
        present[rank] = True
        dense_of = np.cumsum(present) - 1
        ridx = dense_of[rank].astype(np.int64)
        n_ranks = int(present.sum())
    else:
        _, inv = np.unique(rank, return_inverse=True)
        ridx = inv.astype(np.int64)
        n_ranks = int(ridx.max()) + 1 if len(ridx) else 0
    res = g.by_op(g.resource)  # kernel arrays are in layout order; results in op ids
    dev = np.flatnonzero(res > 0)
    dev = dev[_lexsort_small((g.meas_start_ns[dev], ridx[dev]))]
    rd = ridx[dev]
    comp = res[dev] == RES_COMPUTE
    steps = g.trace.ops["step"].to_numpy() if g.trace is not None else np.zeros(0)
    n_steps = _dense_inverse(steps[steps >= 0])[0] if len(steps) else 0
    # the step windows (collectors.steps) are each rank's span of ops when every rank's ops
    # are all in steps or all outside and no profiler step range widens them; otherwise
    # the step time is computed from the windows themselves
    plain = True
    if g.trace is not None and len(steps):
        t = g.trace
        if len(t.ranges) and len(profiler_steps(t)):
            plain = False
        else:
            stepped = np.zeros(n_ranks, np.int64)
            np.add.at(stepped, ridx, (steps >= 0).astype(np.int64))
            cnt = np.bincount(ridx, minlength=n_ranks)
            plain = bool(((stepped == 0) | (stepped == cnt)).all())
    # each rank's device ops form one block in this order (dev_ptr); a scenario's replayed
    # starts re-sort them within the block, nearly sorted already (cheap insertion sort)
    dev_ptr = np.searchsorted(rd, np.arange(n_ranks + 1)).astype(np.int64)
    p = {"ridx": ridx, "n_ranks": n_ranks, "dev": np.ascontiguousarray(dev, np.int64),
         "dev_ptr": dev_ptr, "max_block": int(np.diff(dev_ptr).max()) if n_ranks else 0,
         "dev_compute": np.ascontiguousarray(comp),
         "other": np.flatnonzero(res <= 0).astype(np.int64), "n_steps": max(n_steps, 1),
         "plain_span": plain}
    k = id(key)

    def gone(ref, k=k):
        cur = _PREP.get(k)
        if cur is not None and cur[0] is ref:
            del _PREP[k]
    # keyed by the measured times (shared by the graphs policies derive from one trace) and
    # the resource classes (which a policy may replace)
    _PREP[k] = (weakref.ref(key, gone), p, weakref.ref(g.resource))
    return p


def _layout_index(p: dict[str, Any], g) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layout position of ``g``: the device op's slot in the rank blocks of the row
    metrics (``p["dev_ptr"]``; the ops of a block in layout order; ``-1`` for ops that are
    not device ops), the op's kind (2 device compute, 1 device communication, 0 other) and
    its dense rank (cached in ``p`` per layout: graphs a policy derives keep their
    ``perm``)."""
    perm = g.perm
    hit = p.get("layout")
    if hit is not None and hit[0]() is perm:
        return hit[1]
    res = np.asarray(g.resource)
    kind = np.where(res > 0, np.where(res == RES_COMPUTE, 2, 1), 0).astype(np.int8)
    ridx_l = np.ascontiguousarray(p["ridx"][np.asarray(perm)], np.int64)
    slot = np.empty(len(kind), np.int32)
    _block_slots(kind, ridx_l, p["dev_ptr"], slot)
    ix = (slot, kind, ridx_l)
    p["layout"] = (weakref.ref(perm), ix)
    return ix


def _meta_get(result: ReplayResult, key: str) -> Any:
    """``key`` from the result's meta (a policy's answer), else the trace meta, else synth."""
    for m in (result.meta, result.trace.meta, result.trace.meta.get("synth") or {}):
        if isinstance(m, Mapping) and m.get(key) is not None:
            return m[key]
    return None


def _device_values(meta: Mapping[str, Any], keys: tuple[str, ...]) -> list[float]:
    devs = meta.get("devices") or {}
    if not isinstance(devs, Mapping):
        return []
    entries = [devs] if any(k in devs for k in ("peak_flops", "name", "gpu")) else []
    if not entries:
        for d in devs.values():
            if isinstance(d, Mapping) and d and all(isinstance(v, Mapping) for v in d.values()):
                entries.extend(d.values())
            elif isinstance(d, Mapping):
                entries.append(d)
    out = []
    for d in entries:
        v = next((d[k] for k in keys if isinstance(d.get(k), (int, float)) and d[k] > 0), None)
        if v is None and "peak_flops" in keys:
            v = device_peaks(str(d.get("name") or d.get("gpu") or "")).get("peak_flops")
        if v:
            out.append(float(v))
    return out


def scenario_metrics(result: ReplayResult) -> dict[str, Any]:
    """The metrics of one sweep row, from a replay (small, vectorized, no analysis import).

    Definitions (``W`` = the replayed window: each rank's span of all its ops, first start to
    last end; device ops = ops the replay graph marks compute or communication):

    ``step_time_ns``
        ``max`` over ranks of the rank's step windows end to end (``ReplayResult.step_time_ns``,
        :mod:`collectors.steps`): the rank's span when all its ops are in steps.
    ``step_time_lo_ns`` / ``step_time_hi_ns``
        The what-if's range (:func:`replay.prediction_range`) on ``step_time_ns``; filled by
        :func:`replay.sweep.sweep` (null with ``ranges=False`` or a custom ``run``).
    ``tokens_per_s``
        ``tokens_per_step * steps / step_time`` with ``tokens_per_step`` from the result or
        trace meta (``meta["synth"]`` for modeled runs) and ``steps`` the distinct step ids in
        the trace (at least 1); NaN when the trace does not know its tokens.
    ``mfu``
        ``model_flops_per_step * steps / (step_time * peak)``: a modeled run's job-level
        model FLOPs over the sum of its ``world_size`` device peaks; a per-rank
        ``meta["model_flops_per_step"]`` (number, or ``{rank: flops}``) over one device's
        peak. NaN when flops or the peak are unknown.
    ``peak_memory_bytes``
        The what-if's modeled peak (``meta["whatif"]["memory"]``, which includes what
        caching policies add), else the model's ``peak_memory_bytes`` (largest rank), else
        the largest ``allocated_bytes`` sample of the trace's memory table; null if unknown.
    ``exposed_comm_ns``
        ``max`` over ranks of ``|C ∪ X| - |X|``: the time the rank's communication ops run
        while none of its compute ops does (``C``, ``X`` unions of intervals).
    ``bubble_fraction``
        Mean over ranks with device compute of ``1 - |X| / span``: the part of the rank's
        window its device computes nothing (exposed communication, pipeline bubbles, idle),
        as in :func:`analysis.pipeline.bubbles` for a one-step window. NaN without compute.
    ``oom``
        ``peak_memory_bytes`` above the device capacity (``memory_bytes`` in
        ``meta["devices"]``, the rule synth uses), else the model's ``oom`` flag; null when
        neither is known.
    """
    g = result.graph
    p = _prepared(g)
    lay = result._layout
    n_r = p["n_ranks"]
    row: dict[str, Any] = dict.fromkeys(METRICS)
    if result.graph.n_ops == 0:
        return row
    lo = np.full(n_r, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_r, np.iinfo(np.int64).min, np.int64)
    x = both = None
    if len(p["dev"]):
        both = np.zeros(n_r, np.int64)
        x = np.zeros(n_r, np.int64)
        has_x = np.zeros(n_r, np.bool_)
    if lay is not None and len(p["dev"]):
        # the kernels' per-position results, read in one sequential pass (never mapped to
        # op ids; replay._metric_kernels._metric_spans_layout)
        _, start, end, _, base = lay
        slot, kind, ridx_l = _layout_index(p, g)
        nd = len(p["dev"])  # scratch per call: Dask workers may run scenarios in threads
        _metric_spans_layout(start, end, np.int64(base), slot, kind, ridx_l, p["dev_ptr"], lo,
                             hi, both, x, has_x, np.empty(nd, np.int64),
                             np.empty(nd, np.int64), np.empty(nd, np.bool_))
    else:
        s = np.ascontiguousarray(result.start_ns, np.int64)
        e = np.ascontiguousarray(result.end_ns, np.int64)
        if x is not None:
            # rank spans and interval unions per rank, in one pass over each rank's device
            # ops (replay._metric_kernels._metric_spans)
            mb = p["max_block"]
            _metric_spans(s, e, p["dev"], p["dev_ptr"], p["dev_compute"], p["other"],
                          p["ridx"], lo, hi, both, x, has_x, np.empty(mb, np.int64),
                          np.empty(mb, np.int64), np.empty(mb, np.bool_))
        else:
            other = p["other"]
            np.minimum.at(lo, p["ridx"][other], s[other])
            np.maximum.at(hi, p["ridx"][other], e[other])
    span = hi - lo
    step_ns = int(span.max()) if p["plain_span"] else result.step_time_ns
    row["step_time_ns"] = step_ns
    if x is not None:
        row["exposed_comm_ns"] = int((both - x).max())
        ok = has_x & (span > 0)
        if ok.any():
            row["bubble_fraction"] = float(np.mean(1.0 - x[ok] / span[ok]))
    else:
        row["exposed_comm_ns"] = 0
    if row["bubble_fraction"] is None:
        row["bubble_fraction"] = float("nan")
    # throughput and efficiency from what the trace knows
    step_s = step_ns / 1e9
    steps = p["n_steps"]
    tok = _meta_get(result, "tokens_per_step")
    row["tokens_per_s"] = (float(tok) * steps / step_s if isinstance(tok, (int, float)) and step_s
                           else float("nan"))
    row["mfu"] = _mfu(result, step_s, steps)
    peak = _peak_memory(result)
    row["peak_memory_bytes"] = peak
    cap = _device_values(result.trace.meta, ("memory_bytes", "total_memory_bytes",
                                             "totalGlobalMem"))
    oom = _meta_get(result, "oom")
    if peak is not None and cap:
        row["oom"] = bool(peak > min(cap))
    elif isinstance(oom, (bool, np.bool_)):
        row["oom"] = bool(oom)
    return row


def _mfu(result: ReplayResult, step_s: float, steps: int) -> float:
    if not step_s:
        return float("nan")
    peaks = _device_values(result.trace.meta, ("peak_flops", "peak_flops_per_s"))
    if not peaks:
        return float("nan")
    peak = float(np.mean(peaks))
    syn = result.trace.meta.get("synth") or {}
    job = result.meta.get("model_flops_per_step", syn.get("model_flops_per_step"))
    if isinstance(job, (int, float)) and "model_flops_per_step" not in result.trace.meta:
        world = int(syn.get("world_size") or result.trace.world_size or 1)
        return float(job) * steps / (step_s * peak * world)
    mf = result.trace.meta.get("model_flops_per_step")
    if isinstance(mf, (int, float)):
        return float(mf) * steps / (step_s * peak)
    if isinstance(mf, Mapping) and mf:
        return float(np.mean([float(v) for v in mf.values()])) * steps / (step_s * peak)
    return float("nan")


def _peak_memory(result: ReplayResult) -> int | None:
    wi = result.meta.get("whatif") or {}
    v = (wi.get("memory") or {}).get("peak_memory_bytes") if isinstance(wi, Mapping) else None
    if v is None:
        v = _meta_get(result, "peak_memory_bytes")
    if isinstance(v, Mapping):
        v = max((int(x) for x in v.values()), default=None)
    if isinstance(v, (int, float, np.integer)):
        return int(v)
    m = result.trace.memory
    if len(m):
        a = m["allocated_bytes"].to_numpy()
        if (a >= 0).any():
            dev = m["device"].to_numpy() >= 0
            sel = (a >= 0) & dev if ((a >= 0) & dev).any() else a >= 0
            return int(a[sel].max())
    return None
