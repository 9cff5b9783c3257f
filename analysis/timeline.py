"""What the step timeline, the pipeline Gantt and the rank heatmaps draw, as frames.

* :func:`typical_step` picks the step a report draws whole (the median step of the job).
* :func:`fold_ranks` groups ranks whose step is identical (same ops, names, durations and
  offsets from the rank's step start on the same lanes): modeled runs repeat every
  data- and tensor-parallel rank of a pipeline stage, and a picture draws each group once.
* :func:`step_segments` is the timeline of one step, one row per (rank group, activity:
  host, GPU compute, communication), with nearby boxes merged below a pixel.
* :func:`pipeline_blocks` is the pipeline Gantt: per stage, runs of compute ops of one
  micro-batch and phase.
* :func:`rank_activity` is the rank x time heatmap: per rank and time bin, the covered time
  of each breakdown part (same interval-union rules as :mod:`analysis.breakdown`).

Times in the frames are ns from the step's start (the earliest start of the step's ops over
all ranks), so every picture reads "time from the step start".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique
from retime.collectors.enums import LaneKind, Phase

from ._kernels import _binned_union, _merge_close, _op_signatures
from ._util import (
    COMM_KINDS,
    COMPUTE_KINDS,
    HOST_KINDS,
    MEM_KINDS,
    _keep_step_mask,
    _lane_kind_of_ops,
    _memo,
    device_mask,
    host_mask,
    op_ends_ns,
    step_windows,
)
from .tables import ranks_label

__all__ = ["StepWindow", "typical_step", "typical_step_of", "fold_ranks", "step_signatures",
           "fold_groups", "step_segments", "pipeline_blocks",
           "rank_activity", "activity_rows", "activity_cover", "activity_parts",
           "activity_edges", "ACTIVITIES", "ACTIVITY_PARTS"]

#: timeline row activities, in row order within a rank group
ACTIVITIES = ("host", "compute", "communication")
#: heatmap parts, in the order of :data:`analysis.breakdown.PARTS` (overlapped comm counts
#: as compute there: the device computes)
ACTIVITY_PARTS = ("compute", "exposed_comm", "memcpy", "host_bound", "idle")


@dataclass(frozen=True)
class StepWindow:
    """The step a picture shows: ``step`` id, ``start_ns``/``end_ns`` (over all ranks),
    ``steps`` (how many the trace holds) and ``why`` (how it was chosen, in words)."""

    step: int
    start_ns: int
    end_ns: int
    steps: int
    why: str

    @property
    def dur_ns(self) -> int:
        return int(self.end_ns - self.start_ns)


def typical_step(trace) -> StepWindow:
    """The median step by duration (slowest rank's step time; the earlier of the two middle
    steps when their number is even); the whole trace when it has no step attribution."""
    return typical_step_of(step_windows(trace))


def typical_step_of(w: pd.DataFrame) -> StepWindow:
    """:func:`typical_step` from the step windows ``w`` (``rank``, ``step``, ``start_ns``,
    ``end_ns``) of every rank: a streamed report has the windows, not the trace."""
    if len(w) == 0:
        return StepWindow(-1, 0, 0, 0, "the trace has no ops")
    g = w.groupby("step").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    dur = (w["end_ns"] - w["start_ns"]).groupby(w["step"]).max()
    n = len(g)
    if n == 1:
        s = int(g.index[0])
        why = "the only step in the trace" if s >= 0 else "the whole trace (no step markers)"
    else:
        order = dur.sort_values(kind="mergesort")
        s = int(order.index[(n - 1) // 2])
        why = f"step {s}, the median of {n} steps by duration"
    return StepWindow(s, int(g.loc[s, "start_ns"]), int(g.loc[s, "end_ns"]), n, why)


def _step_ops(trace, step: int) -> np.ndarray:
    """Mask of the ops of ``step`` (all step-attributed ops when ``step`` is -1); a copy of
    the one computed per memo scope (four timeline analyses ask, and some narrow it in
    place)."""
    return _memo(trace, f"step_ops:{step}", lambda: _step_ops_(trace, step)).copy()


def _step_ops_(trace, step: int) -> np.ndarray:
    o = trace.ops
    steps = o["step"].to_numpy()
    keep = _keep_step_mask(o["rank"].to_numpy(), steps)
    return keep & (steps == step) if step >= 0 else keep


def fold_ranks(trace, step: StepWindow | None = None) -> pd.DataFrame:
    """Group ranks whose ops in ``step`` are identical (kind, name, duration, offset from the
    rank's step start, and lane position within the rank).

    Returns
    -------
    DataFrame with one row per rank: ``rank``, ``group`` (0.., in order of the groups'
    lowest rank), ``representative`` (the group's lowest rank), ``size`` (ranks in the
    group) and ``label`` (the group's ranks, e.g. ``0-31``).
    """
    step = step or typical_step(trace)
    ranks_all = unique(trace.lanes["rank"].to_numpy()) if len(trace.lanes) else np.zeros(0)
    return fold_groups(step_signatures(trace, step.step), step.step, ranks_all)


def step_signatures(trace, step: int | None = None) -> pd.DataFrame:
    """Per (rank, step) of the reported steps (``step`` only, when given): ``sig`` (a hash
    of the rank's ops in the step: kind, name, duration, offset from the rank's first op in
    the step, lane position within the rank) and ``n`` (ops). Per rank, so a streamed
    report computes them a batch of ranks at a time; :func:`fold_groups` groups them."""
    o = trace.ops
    steps = o["step"].to_numpy()
    keep = _keep_step_mask(o["rank"].to_numpy(), steps)
    m = keep if step is None or step < 0 else keep & (steps == step)
    cols = {"rank": np.zeros(0, np.int64), "step": np.zeros(0, np.int64),
            "sig": np.zeros(0, np.uint64), "n": np.zeros(0, np.int64)}
    if not m.any():
        return pd.DataFrame(cols)
    rank = o["rank"].to_numpy()[m].astype(np.int64)
    st = steps[m].astype(np.int64) if step is None else np.full(len(rank), step, np.int64)
    start = o["start_ns"].to_numpy()[m]
    lanes = trace.lanes.sort_values(["rank", "lane"], kind="mergesort")
    first = lanes.groupby("rank")["lane"].transform("min").to_numpy()
    ordinal = np.zeros(int(lanes["lane"].max()) + 1, np.int64)
    ordinal[lanes["lane"].to_numpy()] = (lanes["lane"].to_numpy() - first)
    # offsets from the rank's own step start; one stable sort by (rank, step) gives the
    # groups, their first start and the order their sums are taken in
    key = rank * (1 << 32) + (st + 1)
    order = np.argsort(key, kind="stable")
    ks = key[order]
    bounds = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1]
    ur = ks[bounds]
    inv = np.empty(len(key), np.int64)
    inv[order] = np.cumsum(np.r_[0, (ks[1:] != ks[:-1]).astype(np.int64)]) if len(ks) else 0
    rs = np.minimum.reduceat(start[order], bounds)
    rel = start - rs[inv]
    # pandas' hash_array of each field, weighted and summed: one compiled pass
    def u64(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, np.int64).view(np.uint64)

    sig = _op_signatures(u64(o["name_id"].to_numpy()[m]), u64(o["kind"].to_numpy()[m]),
                         u64(rel), u64(o["dur_ns"].to_numpy()[m]),
                         u64(ordinal[o["lane"].to_numpy()[m]]))
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(sig[order], bounds)
    counts = np.diff(np.r_[bounds, len(key)])
    return pd.DataFrame({"rank": ur >> 32, "step": (ur & ((1 << 32) - 1)) - 1, "sig": sums,
                         "n": counts.astype(np.int64)})


def fold_groups(sig: pd.DataFrame, step: int, ranks_all: np.ndarray) -> pd.DataFrame:
    """:func:`fold_ranks`' frame from the :func:`step_signatures` of every rank (rows of
    other steps are ignored); ranks of ``ranks_all`` with no op in the step form groups of
    their own."""
    ranks_all = np.asarray(ranks_all).astype(np.int64)
    k = sig[sig["step"] == step] if len(sig) else sig
    if not len(k):
        r = ranks_all
        return pd.DataFrame({"rank": r, "group": np.arange(len(r)), "representative": r,
                             "size": np.ones(len(r), np.int64),
                             "label": [str(x) for x in r]})
    k = k.sort_values("rank", kind="mergesort")
    ur = k["rank"].to_numpy().astype(np.int64)
    key = pd.DataFrame({"rank": ur, "sum": k["sig"].to_numpy(), "n": k["n"].to_numpy()})
    gid = key.groupby(["sum", "n"], sort=False).ngroup().to_numpy()
    # ranks with no op in the step form their own groups
    missing = np.setdiff1d(ranks_all, ur)
    r = np.concatenate([ur, missing])
    gid = np.concatenate([gid, gid.max() + 1 + np.arange(len(missing))]) if len(gid) else \
        np.arange(len(missing))
    df = pd.DataFrame({"rank": r, "g": gid}).sort_values("rank", kind="mergesort")
    rep = df.groupby("g")["rank"].transform("min")
    df["representative"] = rep.to_numpy()
    df["size"] = df.groupby("g")["rank"].transform("size").to_numpy()
    order_g = df.drop_duplicates("g").sort_values("representative")["g"].to_numpy()
    remap = {g: i for i, g in enumerate(order_g)}
    df["group"] = df["g"].map(remap).to_numpy()
    labels = df.groupby("group")["rank"].agg(lambda s: ranks_label(s.to_numpy()))
    df["label"] = labels.reindex(df["group"].to_numpy()).to_numpy()
    return df[["rank", "group", "representative", "size", "label"]].reset_index(drop=True)


def _activity_of_ops(trace) -> np.ndarray:
    """Per op: 0 host, 1 compute (memcpy included: the device is busy), 2 communication,
    -1 not drawn (e.g. sync markers, host ops of CPU-only ranks drawn as compute)."""
    o = trace.ops
    kind = o["kind"].to_numpy()
    dev = device_mask(trace)
    out = np.full(len(o), -1, np.int8)
    out[host_mask(trace) & isin(kind, HOST_KINDS)] = 0
    cpu_dev = dev & (_lane_kind_of_ops(trace) == int(LaneKind.CPU_THREAD))
    out[dev & (isin(kind, COMPUTE_KINDS + MEM_KINDS) | (cpu_dev & isin(kind, HOST_KINDS)))] = 1
    out[dev & isin(kind, COMM_KINDS)] = 2
    return out


def step_segments(trace, step: StepWindow, row_ranks: pd.DataFrame, *,
                  critical_op_ids: np.ndarray | None = None, px_ns: float = 0.0) -> pd.DataFrame:
    """Boxes of the step timeline.

    Parameters
    ----------
    step : the window drawn (:func:`typical_step`)
    row_ranks : frame with ``rank`` (the rank drawn), ``row_group`` (0.. top to bottom) and
        ``label`` (the group's name); one row per rank drawn
    critical_op_ids : ops on the critical path (their boxes are flagged)
    px_ns : boxes of one row and activity closer than this are merged (one pixel)

    Returns
    -------
    DataFrame with ``row_group``, ``activity`` (index into :data:`ACTIVITIES`), ``kind``
    (``compute``/``memcpy``/... colour key), ``start_ns``, ``end_ns`` (from the step start)
    and ``critical`` (bool; critical boxes are merged separately).
    """
    o = trace.ops
    m = _step_ops(trace, step.step)
    rr = row_ranks.set_index("rank")["row_group"]
    rank = o["rank"].to_numpy()
    m &= isin(rank, rr.index.to_numpy())
    act = _activity_of_ops(trace)
    m &= act >= 0
    idx = np.flatnonzero(m)
    kind = o["kind"].to_numpy()[idx]
    color = np.where(isin(kind, MEM_KINDS), 3, act[idx].astype(np.int64))  # 3: memcpy
    rowg = rr.reindex(rank[idx]).to_numpy().astype(np.int64)
    s = o["start_ns"].to_numpy()[idx] - step.start_ns
    e = op_ends_ns(trace)[idx] - step.start_ns
    crit = (isin(o["op_id"].to_numpy()[idx], critical_op_ids) if critical_op_ids is not None
            and len(critical_op_ids) else np.zeros(len(idx), bool))
    frames = []
    gap = int(max(px_ns, 0))
    for flag in (False, True):
        sel = crit == flag if flag else np.ones(len(idx), bool)
        # group = (row, activity, colour); critical boxes additionally by themselves
        grp = (rowg[sel] * 4 + act[idx][sel].astype(np.int64)) * 4 + color[sel]
        if not len(grp):
            continue
        order = np.lexsort((s[sel], grp))
        g2, s2, e2 = grp[order], s[sel][order], e[sel][order]
        first, ms, me = _merge_close(np.ascontiguousarray(g2, np.int64),
                                     np.ascontiguousarray(s2, np.int64),
                                     np.ascontiguousarray(e2, np.int64), np.int64(gap))
        gg = g2[first]
        frames.append(pd.DataFrame({"row_group": gg // 16, "activity": (gg // 4) % 4,
                                    "kind": np.array(["host", "compute", "communication",
                                                      "memcpy"])[gg % 4],
                                    "start_ns": ms, "end_ns": me, "critical": flag}))
    if not frames:
        return pd.DataFrame({"row_group": [], "activity": [], "kind": [], "start_ns": [],
                             "end_ns": [], "critical": []})
    return pd.concat(frames, ignore_index=True)


def pipeline_blocks(trace, step: StepWindow, stage_ranks: pd.DataFrame) -> pd.DataFrame:
    """Blocks of the pipeline Gantt: on each stage's rank, consecutive compute ops of one
    micro-batch, phase and model chunk merged into one block.

    ``stage_ranks`` has ``stage`` and ``rank`` (one rank per stage). Returns ``stage``,
    ``rank``, ``microbatch`` (-1: not in a micro-batch, e.g. the optimizer), ``phase``
    (``forward``, ``backward`` (recomputation included), ``other``), ``chunk``, ``start_ns``,
    ``end_ns`` (from the step start).
    """
    o = trace.ops
    m = _step_ops(trace, step.step) & device_mask(trace) & isin(o["kind"].to_numpy(),
                                                                  COMPUTE_KINDS)
    m &= isin(o["rank"].to_numpy(), stage_ranks["rank"].to_numpy())
    idx = np.flatnonzero(m)
    cols = ["stage", "rank", "microbatch", "phase", "chunk", "start_ns", "end_ns"]
    if not len(idx):
        return pd.DataFrame({c: [] for c in cols})
    rank = o["rank"].to_numpy()[idx]
    s = o["start_ns"].to_numpy()[idx] - step.start_ns
    e = op_ends_ns(trace)[idx] - step.start_ns
    mb = o["microbatch"].to_numpy()[idx].astype(np.int64)
    ph = o["phase"].to_numpy()[idx].astype(np.int64)
    ch = np.maximum(o["chunk"].to_numpy()[idx].astype(np.int64), 0)
    rec = np.array(["recompute" in n.lower() for n in trace.strings], bool)
    is_rec = rec[o["name_id"].to_numpy()[idx]] if len(rec) else np.zeros(len(idx), bool)
    # recomputation runs inside the backward pass, layer by layer: drawn as part of the
    # micro-batch's backward block (a block per layer would be unreadable)
    code = np.where((ph == int(Phase.FWD)) & ~is_rec, 0,
                    np.where((ph == int(Phase.BWD)) | is_rec, 1, 3))
    code = np.where(mb < 0, 3, code)
    order = np.lexsort((s, rank))
    rank, s, e, mb, code, ch = rank[order], s[order], e[order], mb[order], code[order], ch[order]
    key = ((rank * 100003 + (mb + 1)) * 5 + code) * 1009 + ch
    new = np.r_[True, key[1:] != key[:-1]]
    first = np.flatnonzero(new)
    end = np.maximum.reduceat(e, first)
    stage_of = stage_ranks.set_index("rank")["stage"]
    names = np.array(["forward", "backward", "backward", "other"])
    df = pd.DataFrame({"stage": stage_of.reindex(rank[first]).to_numpy(), "rank": rank[first],
                       "microbatch": mb[first], "phase": names[code[first]], "chunk": ch[first],
                       "start_ns": s[first], "end_ns": end})
    return df[cols]


def rank_activity(trace, step: StepWindow, *, bins: int = 240, max_rows: int = 512,
                  windows: pd.DataFrame | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rank x time: per row of ranks and time bin, the covered ns of each part of
    :data:`ACTIVITY_PARTS` (disjoint per rank, adding up to the bin inside the rank's own
    step window; outside it nothing is counted). Up to ``max_rows`` ranks each rank is a
    row; beyond, consecutive ranks share a row (their times summed), so memory stays
    bounded at any scale (16,384 ranks: 512 rows of 32).

    Returns ``(first_rank, ranks_per_row, edges_ns, parts)``: the first rank of each row
    int64[R], ranks per row int64[R], bin edges int64[bins + 1] (from the step start), and
    parts float64[R, bins, len(ACTIVITY_PARTS)].

    ``windows``: the ranks' step windows (default :func:`analysis._util.step_windows` of
    ``trace``). A streamed report sums :func:`activity_cover` over batches of ranks and
    calls :func:`activity_parts`: the same figures.
    """
    o = trace.ops
    m = _step_ops(trace, step.step)
    ranks = unique(o["rank"].to_numpy()[m]).astype(np.int64)
    first, counts, row_of = activity_rows(ranks, max_rows)
    w = step_windows(trace) if windows is None else windows
    cover = activity_cover(trace, step, ranks, row_of, w, bins=bins)
    return first, counts, activity_edges(step, bins), activity_parts(cover)


def activity_edges(step: StepWindow, bins: int = 240) -> np.ndarray:
    """Bin edges (ns from the step start) of :func:`rank_activity`."""
    return np.round(np.arange(bins + 1) * (max(step.dur_ns, 1) / bins)).astype(np.int64)


def activity_rows(ranks: np.ndarray, max_rows: int = 512
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first rank of each row, ranks per row, row of each rank) of :func:`rank_activity`
    for the sorted ``ranks`` with ops in the step."""
    n_r = len(ranks)
    if n_r == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    per_row = int(np.ceil(n_r / max_rows)) if n_r > max_rows else 1
    row_of = (np.arange(n_r) // per_row).astype(np.int64)
    n_rows = int(row_of[-1]) + 1
    first = ranks[np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]])]
    return first, np.bincount(row_of, minlength=n_rows).astype(np.int64), row_of


def activity_cover(trace, step: StepWindow, ranks: np.ndarray, row_of: np.ndarray,
                   windows: pd.DataFrame, *, bins: int = 240) -> np.ndarray:
    """Per row and bin, the summed covered ns of the ranks' compute, +communication,
    +copies, +host work (nested unions) and their time inside their own step window:
    float64[R, bins, 5], before the parts are told apart (:func:`activity_parts`).

    ``ranks`` (sorted) and ``row_of`` are the rows of every rank of the job
    (:func:`activity_rows`); ``trace`` may hold some of them (a batch of ranks: only they
    are counted, so batches add up to the whole), ``windows`` those ranks' step windows."""
    o = trace.ops
    m = _step_ops(trace, step.step)
    n_rows = int(row_of[-1]) + 1 if len(row_of) else 0
    width = max(step.dur_ns, 1)
    bin_ns = width / bins
    edges = activity_edges(step, bins)
    out = np.zeros((n_rows, bins, 5))
    n_r = len(ranks)
    if n_r == 0 or not m.any():
        return out
    kind = o["kind"].to_numpy()
    dev = device_mask(trace)
    cpu_dev = dev & (_lane_kind_of_ops(trace) == int(LaneKind.CPU_THREAD))
    c = m & dev & (isin(kind, COMPUTE_KINDS) | (cpu_dev & isin(kind, HOST_KINDS)))
    cm = m & dev & isin(kind, COMM_KINDS)
    y = m & dev & isin(kind, MEM_KINDS)
    h = m & host_mask(trace) & isin(kind, HOST_KINDS)
    g_all = np.minimum(np.searchsorted(ranks, o["rank"].to_numpy().astype(np.int64)), n_r - 1)
    start = o["start_ns"].to_numpy()
    end = op_ends_ns(trace)
    sel = np.flatnonzero(c | cm | y | h)
    order = sel[np.lexsort((start[sel], g_all[sel]))]
    g_s = np.ascontiguousarray(g_all[order], np.int64)
    s_s = np.ascontiguousarray(start[order], np.int64)
    e_s = np.ascontiguousarray(end[order], np.int64)

    def cover(mask: np.ndarray) -> np.ndarray:
        k = mask[order]
        return _binned_union(g_s[k], s_s[k], e_s[k], row_of, n_rows, np.int64(step.start_ns),
                             float(bin_ns), int(bins))

    out[..., 0] = cover(c)
    out[..., 1] = cover(c | cm)
    out[..., 2] = cover(c | cm | y)
    out[..., 3] = cover(c | cm | y | h)
    # each rank's own step window bounds its idle time (the ranks of this trace only)
    mine = unique(o["rank"].to_numpy()[m]).astype(np.int64)
    w = windows[windows["step"] == step.step].set_index("rank").reindex(mine)
    ws = w["start_ns"].to_numpy(dtype=float) - step.start_ns
    we = w["end_ns"].to_numpy(dtype=float) - step.start_ns
    rows = row_of[np.searchsorted(ranks, mine)]
    inside = np.zeros((n_rows, bins))
    lo_e, hi_e = edges[:-1].astype(float), edges[1:].astype(float)
    for r0 in range(0, len(mine), 4096):  # bounded temporaries at any rank count
        sl = slice(r0, min(r0 + 4096, len(mine)))
        lo = np.clip(ws[sl, None], lo_e, hi_e)
        hi = np.clip(we[sl, None], lo_e, hi_e)
        np.add.at(inside, rows[sl], np.maximum(hi - lo, 0.0))
    out[..., 4] = inside
    return out


def activity_parts(cover: np.ndarray) -> np.ndarray:
    """The :data:`ACTIVITY_PARTS` of :func:`activity_cover`'s sums, float64[R, bins, 5]."""
    u_c, u_cm, u_cmy, u_all, inside = (cover[..., i] for i in range(5))
    return np.stack([u_c, u_cm - u_c, u_cmy - u_cm, u_all - u_cmy,
                     np.maximum(inside - u_all, 0.0)], axis=-1)
