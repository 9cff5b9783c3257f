"""What the step figures leave out, and GPU work the trace cannot show.

Two kinds of GPU work sit outside a trace's step figures, and every command that prints
those figures names them (``retime analyze`` text and ``--json``, the report's headline):

* **Excluded**: GPU ops whose launch call is not in the trace. Most were queued before the
  profiler started (the GPU's backlog when it runs behind the host); they belong to no
  profiled step (:mod:`collectors.steps`), so their time counts in no step, while the
  critical path, which spans the whole trace, still runs through them.
* **Unseen**: GPU work the trace does not hold at all. Kernels launched while a stream was
  being captured into a CUDA/HIP graph do not run then (a capture records, it does not
  execute); the graph's replays (``cudaGraphLaunch``) run them, and a profiler that does
  not trace graph replays shows a graph launch with few or no GPU ops. The GPU was then
  busy where the trace shows it idle, so its host-bound and idle shares are not the GPU's:
  no conclusion is drawn from them.

Launch calls and GPU ops are paired by correlation id on one rank (a runtime call and the
GPU ops with its ``correlation``); a *launch call* is a runtime call named ``*Launch*``
(kernel launches, ``cudaLaunchKernelExC``, ``hipExtModuleLaunchKernel``) other than a graph
launch; a capture is the time between ``*StreamBeginCapture*`` and ``*StreamEndCapture*``
on one host thread.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import unique
from retime.collectors.enums import LaneKind, OpKind
from retime.collectors.steps import device_lane_mask

from ._util import as_trace, clip_to_windows, step_windows

if TYPE_CHECKING:
    from retime.collectors.trace import Trace

__all__ = ["unseen_work", "unseen_work_by_rank", "queued_before_trace", "combine_unseen", "unseen_notes", "hides_gpu_work",
           "excludes_gpu_work", "COUNTS"]

_LAUNCH = re.compile(r"launch", re.I)
_GRAPH_LAUNCH = re.compile(r"graphlaunch", re.I)
_BEGIN = re.compile(r"streambegincapture", re.I)
_END = re.compile(r"streamendcapture", re.I)

#: the counters of :func:`unseen_work` (all additive over ranks)
COUNTS = ("gpu_ops", "gpu_ns", "without_launch_ops", "without_launch_ns",
          "queued_before_trace_ops", "queued_before_trace_ns", "outside_steps_ns",
          "launches", "launches_without_gpu_op", "captured_launches", "captures",
          "graph_launches", "graph_launch_gpu_ops")


#: bits of :func:`_name_hits`: a launch other than a graph launch, a graph launch, a capture's
#: begin, its end
_LAUNCHES, _GRAPH, _BEGINS, _ENDS = 1, 2, 4, 8


def _name_hits(t) -> np.ndarray:
    """Per string id, the bits of the names' kinds (one pass over the strings; the ops then
    look their names up once per kind, only where a kind occurs)."""
    def bits(s: str) -> int:
        g = bool(_GRAPH_LAUNCH.search(s))
        return ((_LAUNCHES if _LAUNCH.search(s) and not g else 0) | (_GRAPH if g else 0)
                | (_BEGINS if _BEGIN.search(s) else 0) | (_ENDS if _END.search(s) else 0))

    return np.fromiter((bits(str(s)) for s in t.strings), np.int8, len(t.strings))


def _pick(hit: np.ndarray, bit: int, nid: np.ndarray) -> np.ndarray:
    """Ops whose name has ``bit`` (all False without a lookup where no name has it)."""
    has = (hit & bit) != 0
    return has[nid] if has.any() else np.zeros(len(nid), bool)


def _member(sorted_keys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``np.isin(x, sorted_keys)`` for sorted unique int keys, by binary search."""
    if not len(sorted_keys):
        return np.zeros(len(x), bool)
    pos = np.minimum(np.searchsorted(sorted_keys, x), len(sorted_keys) - 1)
    return sorted_keys[pos] == x


def unseen_work(x: Any, windows: pd.DataFrame | None = None) -> dict[str, int]:
    """Counts of excluded and unseen GPU work (module docstring), summed over ranks.

    ``windows``: the trace's step windows (``rank``, ``step``, ``start_ns``, ``end_ns``,
    as :func:`analysis._util.step_windows` gives them) when the caller has them already
    (a replay computed the measured ones); computed here otherwise.

    Returns a dict of the :data:`COUNTS`: GPU ops and their time; those without a launch
    call in the trace (and of them, those queued before the rank's first launched GPU op);
    GPU op time outside every step window; launch calls, those without a GPU op, those
    made during a stream capture, the number of captures; graph launches and the GPU ops
    they show.
    """
    t = as_trace(x)
    o = t.ops
    out = dict.fromkeys(COUNTS, 0)
    if len(o) == 0:
        return out
    lk = np.full(int(t.lanes["lane"].max()) + 1 if len(t.lanes) else 1, -1, np.int64)
    lk[t.lanes["lane"].to_numpy()] = t.lanes["lane_kind"].to_numpy()
    gpu = device_lane_mask(t) & (lk[o["lane"].to_numpy()] == int(LaneKind.GPU_STREAM))
    if not gpu.any():
        return out  # op-level and CPU-only traces: nothing is launched
    kind = o["kind"].to_numpy()
    rank = o["rank"].to_numpy().astype(np.int64)
    corr = o["correlation"].to_numpy().astype(np.int64)
    s = o["start_ns"].to_numpy().astype(np.int64)
    dur = o["dur_ns"].to_numpy().astype(np.int64)
    rt = (kind == int(OpKind.RUNTIME)) & ~gpu
    if not rt.any() and not (lk == int(LaneKind.CPU_THREAD)).any():
        # no host side at all (a synthesized run): launches are not recorded, not missing
        out["gpu_ops"] = int(gpu.sum())
        out["gpu_ns"] = int(dur[gpu].sum())
        w = step_windows(t) if windows is None else windows
        if len(w):
            _, _, cs, ce = clip_to_windows(t, gpu, w)
            out["outside_steps_ns"] = int(dur[gpu].sum() - (ce - cs).sum())
        return out
    hit = _name_hits(t)
    nid = o["name_id"].to_numpy()
    glaunch = rt & _pick(hit, _GRAPH, nid)
    launch = rt & _pick(hit, _LAUNCHES, nid)
    key = rank * (1 << 40) + corr
    rt_keys = unique(key[rt & (corr >= 0)])
    g_c = np.flatnonzero(gpu & (corr >= 0))
    gpu_keys = unique(key[g_c])
    launched = np.zeros(len(o), bool)
    launched[g_c[_member(rt_keys, key[g_c])]] = True
    nol = gpu & ~launched
    out["gpu_ops"] = int(gpu.sum())
    out["gpu_ns"] = int(dur[gpu].sum())
    out["without_launch_ops"] = int(nol.sum())
    out["without_launch_ns"] = int(dur[nol].sum())
    if nol.any():
        q = _queued_by_rank(rank, s, dur, nol, launched)
        rec = _recorded_queue(t, rank)
        if rec is not None:  # a replayed trace: the recording's count, not the replay's
            q = rec
        out["queued_before_trace_ops"] = int(sum(v[0] for v in q.values()))
        out["queued_before_trace_ns"] = int(sum(v[1] for v in q.values()))
    w = step_windows(t) if windows is None else windows
    if len(w):
        _, _, cs, ce = clip_to_windows(t, gpu, w)
        out["outside_steps_ns"] = int(dur[gpu].sum() - (ce - cs).sum())
    out["launches"] = int(launch.sum())
    li = np.flatnonzero(launch)
    no_op = np.zeros(len(o), bool)
    no_op[li[~_member(gpu_keys, key[li])]] = True
    out["launches_without_gpu_op"] = int(no_op.sum())
    out["graph_launches"] = int(glaunch.sum())
    if glaunch.any():
        gi = np.flatnonzero(gpu)
        out["graph_launch_gpu_ops"] = int(_member(unique(key[glaunch]), key[gi]).sum())
    cap, n_cap = _in_capture(t, rt, no_op, hit, nid)
    out["captured_launches"] = int(cap.sum())
    out["captures"] = n_cap
    return out


def _queued_by_rank(rank: np.ndarray, s: np.ndarray, dur: np.ndarray, nol: np.ndarray,
                    launched: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per rank: (ops, ns) of the GPU ops without a launch call (``nol``) that start before
    the rank's first launched GPU op (all of them on a rank with none launched)."""
    first = pd.Series(s[launched]).groupby(rank[launched]).min()
    f = first.reindex(rank[nol]).to_numpy(np.float64)
    before = np.isnan(f) | (s[nol] < np.nan_to_num(f, nan=np.inf))
    r = rank[nol][before]
    d = dur[nol][before]
    return {int(k): (int((r == k).sum()), int(d[r == k].sum())) for k in unique(r).tolist()}


def _recorded_queue(t, rank: np.ndarray) -> dict[int, tuple[int, int]] | None:
    """The measured queue counts a replayed trace carries (``meta["queued_before_trace"]``,
    written by :meth:`ReplayResult.to_trace`) for the ranks in ``rank``; None without."""
    rec = t.meta.get("queued_before_trace") if isinstance(t.meta, dict) else None
    if not isinstance(rec, dict) or "rank" not in rec:
        return None
    present = set(unique(rank).tolist())
    return {int(r): (int(n), int(ns)) for r, n, ns in zip(rec["rank"], rec["ops"], rec["ns"])
            if int(r) in present}


def queued_before_trace(trace: Trace) -> dict[str, list[int]]:
    """Per rank, the GPU ops without a launch call that ran before the rank's first
    launched GPU op (queued before the trace started), as ``{"rank": [...], "ops": [...],
    "ns": [...]}``: a fact of the recording, which a replay carries in its meta so that the
    replayed trace's notes say what was measured (a what-if that moves launches earlier
    does not make the backlog any less queued)."""
    t = as_trace(trace)
    o = t.ops
    out: dict[str, list[int]] = {"rank": [], "ops": [], "ns": []}
    if len(o) == 0 or not len(t.lanes):
        return out
    rank = o["rank"].to_numpy().astype(np.int64)
    rec = _recorded_queue(t, rank)
    if rec is None:
        lk = np.full(int(t.lanes["lane"].max()) + 1, -1, np.int64)
        lk[t.lanes["lane"].to_numpy()] = t.lanes["lane_kind"].to_numpy()
        gpu = device_lane_mask(t) & (lk[o["lane"].to_numpy()] == int(LaneKind.GPU_STREAM))
        rt = (o["kind"].to_numpy() == int(OpKind.RUNTIME)) & ~gpu
        if not gpu.any() or not rt.any():
            return out
        corr = o["correlation"].to_numpy().astype(np.int64)
        key = rank * (1 << 40) + corr
        g_c = np.flatnonzero(gpu & (corr >= 0))
        launched = np.zeros(len(o), bool)
        launched[g_c[_member(unique(key[rt & (corr >= 0)]), key[g_c])]] = True
        rec = _queued_by_rank(rank, o["start_ns"].to_numpy().astype(np.int64),
                              o["dur_ns"].to_numpy().astype(np.int64), gpu & ~launched,
                              launched)
    for r in sorted(rec):
        out["rank"].append(r)
        out["ops"].append(rec[r][0])
        out["ns"].append(rec[r][1])
    return out


def unseen_work_by_rank(trace: Trace, windows: pd.DataFrame | None = None, *,
                        chunk_ops: int = 1 << 20) -> dict[str, int]:
    """:func:`unseen_work` a batch of ranks at a time when the ops are in rank order (every
    count is per rank, as in the streamed analysis: the same result, with one batch's
    temporaries). ``windows`` as for :func:`unseen_work`."""
    import dataclasses

    o = trace.ops
    n = len(o)
    rank = o["rank"].to_numpy() if n else np.zeros(0, np.int32)
    if n <= chunk_ops or (rank[1:] < rank[:-1]).any():
        return unseen_work(trace, windows)
    bounds = np.r_[0, np.flatnonzero(rank[1:] != rank[:-1]) + 1, n]
    r_rank = trace.ranges["rank"].to_numpy()
    w_rank = None if windows is None else windows["rank"].to_numpy()
    parts, a = [], 0
    while a < n:
        b = int(bounds[min(np.searchsorted(bounds, a + chunk_ops, side="right"),
                           len(bounds) - 1)])
        lo, hi = int(rank[a]), int(rank[b - 1])
        sub = dataclasses.replace(
            trace, ops=o.iloc[a:b].reset_index(drop=True),
            ranges=trace.ranges[(r_rank >= lo) & (r_rank <= hi)].reset_index(drop=True))
        w = None if windows is None else windows[(w_rank >= lo) & (w_rank <= hi)].reset_index(
            drop=True)
        parts.append(unseen_work(sub, w))
        a = b
    return combine_unseen(parts)


def _in_capture(t, rt: np.ndarray, cand: np.ndarray, hit: np.ndarray,
                nid: np.ndarray) -> tuple[np.ndarray, int]:
    """Which ``cand`` ops run between a stream-capture begin and its end on their thread;
    and how many captures the trace holds (``hit``, ``nid``: :func:`_name_hits` and the
    ops' name ids)."""
    o = t.ops
    beg = rt & _pick(hit, _BEGINS, nid)
    end = rt & _pick(hit, _ENDS, nid)
    inside = np.zeros(len(o), bool)
    if not beg.any():
        return inside, 0
    lane = o["lane"].to_numpy().astype(np.int64)
    s = o["start_ns"].to_numpy().astype(np.int64)
    e = s + o["dur_ns"].to_numpy().astype(np.int64)
    n = 0
    for ln in unique(lane[beg]).tolist():
        on = lane == ln
        bs = np.sort(e[beg & on])
        es = np.sort(s[end & on])
        for b in bs.tolist():
            nxt = es[es >= b]
            stop = int(nxt[0]) if len(nxt) else np.iinfo(np.int64).max
            inside |= cand & on & (s >= b) & (s < stop)
            n += 1
    return inside, n


def combine_unseen(parts: list[dict[str, int]]) -> dict[str, int]:
    """Sum :func:`unseen_work` dicts of disjoint sets of ranks (streamed analysis)."""
    out = dict.fromkeys(COUNTS, 0)
    for p in parts:
        for k in COUNTS:
            out[k] += int(p.get(k, 0))
    return out


def excludes_gpu_work(u: dict[str, int]) -> bool:
    """Do the step figures leave out GPU work worth a word (ops without a launch, or more
    than 1% of the GPU time outside every step)?"""
    return u["without_launch_ops"] > 0 or u["outside_steps_ns"] > 0.01 * u["gpu_ns"]


def hides_gpu_work(u: dict[str, int]) -> bool:
    """Does the trace hide GPU work in graph replays (captured launches, or graph launches
    that show no GPU op)?"""
    return u["captured_launches"] > 0 or (u["graph_launches"] > 0
                                          and u["graph_launch_gpu_ops"] == 0)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.2f} ms"


def unseen_notes(u: dict[str, int], *, path: str = "whole trace") -> list[str]:
    """One sentence per kind of excluded or unseen work (empty when there is none);
    ``path`` says what the critical path spans (a streamed report's is one rank's)."""
    notes = []
    if u["without_launch_ops"]:
        share = u["without_launch_ns"] / u["gpu_ns"] if u["gpu_ns"] else 0.0
        q = u["queued_before_trace_ops"]
        notes.append(
            f"{u['without_launch_ops']:,} GPU ops ({_ms(u['without_launch_ns'])}, "
            f"{100 * share:.1f}% of GPU time) have no launch call in the trace"
            + (f"; {q:,} of them ran before the first launched GPU op (queued before the "
               "trace started)" if q else "") + "."
            + (f" GPU time outside every step: {_ms(u['outside_steps_ns'])}; step figures "
               f"leave it out, the critical path ({path}) does not."
               if u["outside_steps_ns"] else ""))
    elif excludes_gpu_work(u):
        notes.append(f"GPU time outside every step: {_ms(u['outside_steps_ns'])} (before the "
                     "first or after the last profiled step); step figures leave it out.")
    if hides_gpu_work(u):
        notes.append(
            f"CUDA/HIP graphs: {u['captured_launches']:,} kernel launches were recorded "
            f"during {u['captures']:,} stream capture(s) and {u['graph_launches']:,} graph "
            f"launch(es) show {u['graph_launch_gpu_ops']:,} GPU ops; the GPU work of the "
            "graph replays is not in the trace, so GPU busy, host-bound and idle shares "
            "understate the GPU and no conclusion is drawn from them.")
    return notes


def stack_traced_files(meta: dict[str, Any]) -> list[str]:
    """Source files recorded with ``torch.profiler(with_stack=True)`` (ingest notes it in
    ``meta["accounting"]``): Python stack tracing slows the host while it records."""
    acc = meta.get("accounting") if isinstance(meta, dict) else None
    return sorted(str(k) for k, v in (acc or {}).items()
                  if isinstance(v, dict) and v.get("with_stack"))


def profiler_notes(meta: dict[str, Any], host_bound_frac: float | None) -> list[str]:
    """A sentence when the trace was recorded with Python stack tracing (with_stack=True):
    its host-bound time is then partly the profiler's, not the job's."""
    files = stack_traced_files(meta)
    if not files:
        return []
    n = len(acc) if (acc := meta.get("accounting")) else len(files)
    hb = (f" ({100 * host_bound_frac:.1f}% of the time here)"
          if host_bound_frac is not None and host_bound_frac == host_bound_frac else "")
    who = "the trace was" if n == 1 else f"{len(files)} of its {n} files were"
    return [f"{who} recorded with with_stack=True (the profiler "
            "records the Python stack of every op): that slows the host while it records, so "
            f"host-bound time{hb} is partly the profiler's, not the job's; record without "
            "with_stack to measure the host"]


#: a gap between recorded ops shorter than this is the host between two calls (Python, the
#: profiler's own per-op work), not a rank waiting on nothing
SHORT_GAP_NS = 100_000


def short_gaps(trace: Any) -> dict[str, int]:
    """Idle time of a trace's step windows made of short gaps (< :data:`SHORT_GAP_NS`)
    between recorded ops and ranges (``ProfilerStep#`` markers left out): count and total
    ns, over every rank and step."""
    from ._util import as_trace, op_ends_ns, step_windows
    t = as_trace(trace)
    o, r = t.ops, t.ranges
    names = np.asarray(t.strings, dtype=object)
    keep_r = np.fromiter((not str(names[i]).startswith("ProfilerStep#")
                          for i in r["name_id"].to_numpy()), bool, count=len(r))
    rank = np.r_[o["rank"].to_numpy(), r["rank"].to_numpy()[keep_r]]
    s = np.r_[o["start_ns"].to_numpy(np.int64), r["start_ns"].to_numpy(np.int64)[keep_r]]
    e = np.r_[op_ends_ns(t).astype(np.int64), r["end_ns"].to_numpy(np.int64)[keep_r]]
    n = tot = 0
    for w in step_windows(t).itertuples():
        m = (rank == w.rank) & (e > w.start_ns) & (s < w.end_ns)
        a, b = np.maximum(s[m], w.start_ns), np.minimum(e[m], w.end_ns)
        if not len(a):
            continue
        i = np.argsort(a, kind="stable")
        a, b = a[i], np.maximum.accumulate(b[i])
        g = a[1:] - b[:-1]
        g = g[(g > 0) & (g < SHORT_GAP_NS)]
        n += len(g)
        tot += int(g.sum())
    return {"gaps": int(n), "ns": int(tot)}


def idle_notes(trace: Any, idle_frac: float | None, total_ns: int) -> list[str]:
    """A sentence when most of the breakdown's idle time is short gaps between recorded ops:
    the host ran code the profiler did not record (Python between calls, its own work)."""
    if not idle_frac or idle_frac < 0.02 or not total_ns:
        return []
    g = short_gaps(trace)
    idle_ns = idle_frac * total_ns
    if g["ns"] < 0.5 * idle_ns:
        return []
    return [f"idle ({100 * idle_frac:.1f}%) is mostly {g['gaps']:,} gaps shorter than "
            f"{SHORT_GAP_NS // 1000} us between recorded ops ({_ms(g['ns'])}): time the "
            "profiler recorded nothing, mostly the host between calls (Python, the profiler's "
            "own per-op work), not a rank waiting on nothing"]
