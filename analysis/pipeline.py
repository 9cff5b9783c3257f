"""Pipeline bubbles: the fraction of each step a stage's device does no compute.

For each rank and step window (see :mod:`analysis.breakdown`), ``bubble_ns = step_ns -
|C|`` where ``C`` is the union of the rank's device compute intervals; it includes exposed
communication and idle time, the time a pipeline stage waits. A rank's stage is the most
common ``stage`` of its ops (-1 when the trace has no pipeline annotation; the frame then
has one row per rank). ``ideal_bubble_frac`` is the GPipe/1F1B bubble ``(p-1)/(m+p-1)`` for
``p`` stages and ``m`` micro-batches seen in the step (PUBLISHED.md §2), NaN when unknown.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retime.collectors.arrays import isin, unique

from ._kernels import _union_len_grouped
from ._util import (
    COMPUTE_KINDS,
    _memo,
    as_trace,
    clip_to_windows,
    comm_mask,
    device_mask,
    step_windows,
)

__all__ = ["rank_stages", "bubbles", "stage_bubbles"]


def rank_stages(x: Any) -> pd.DataFrame:
    """``rank`` -> ``stage`` (most common op stage of the rank, -1 when unknown)."""
    t = as_trace(x)
    # the pipeline, memory and report sections all ask: once per memo scope
    return _memo(t, "rank_stages", lambda: _rank_stages(t)).copy()


def _rank_stages(t) -> pd.DataFrame:
    o = t.ops
    ranks = unique(o["rank"].to_numpy()) if len(o) else np.zeros(0, np.int32)
    st = o["stage"].to_numpy()
    m = st >= 0
    if m.any():
        d = pd.DataFrame({"rank": o["rank"].to_numpy()[m], "stage": st[m]})
        mode = d.groupby("rank")["stage"].agg(lambda s: s.value_counts().index[0])
        stage = mode.reindex(ranks, fill_value=-1).to_numpy()
    else:
        stage = np.full(len(ranks), -1)
    return pd.DataFrame({"rank": ranks.astype(np.int32), "stage": stage.astype(np.int16)})


def bubbles(x: Any) -> pd.DataFrame:
    """Per rank and step: ``stage``, ``step_ns``, ``compute_ns``, ``bubble_ns``,
    ``bubble_frac``, ``microbatches`` and ``ideal_bubble_frac``."""
    t = as_trace(x)
    o = t.ops
    w = step_windows(t)
    n = len(w)
    ranks = o["rank"].to_numpy().astype(np.int64)
    steps = o["step"].to_numpy().astype(np.int64)
    key_ops = ranks * (1 << 32) + (steps + 1)
    key_w = w["rank"].to_numpy().astype(np.int64) * (1 << 32) + (w["step"].to_numpy() + 1)
    gidx = np.minimum(np.searchsorted(key_w, key_ops), max(n - 1, 0))
    ok = (key_w[gidx] == key_ops) if n else np.zeros(len(o), bool)
    m = device_mask(t) & isin(o["kind"].to_numpy(), COMPUTE_KINDS) & ~comm_mask(t)
    _, g, s, e = clip_to_windows(t, m, w)  # compute inside each window (windows tile)
    order = np.lexsort((s, g))
    comp = (_union_len_grouped(np.ascontiguousarray(g[order], np.int64),
                               np.ascontiguousarray(s[order], np.int64),
                               np.ascontiguousarray(e[order], np.int64), n)
            if len(g) else np.zeros(n, np.int64))
    out = w[["rank", "step"]].copy()
    stages = rank_stages(t).set_index("rank")["stage"]
    out["stage"] = stages.reindex(out["rank"].to_numpy(), fill_value=-1).to_numpy()
    out["step_ns"] = (w["end_ns"] - w["start_ns"]).to_numpy()
    out["compute_ns"] = comp
    out["bubble_ns"] = out["step_ns"] - comp
    out["bubble_frac"] = out["bubble_ns"] / out["step_ns"].where(out["step_ns"] > 0)
    mb = o["microbatch"].to_numpy()
    mm = ok & (mb >= 0)
    if mm.any():  # distinct (window, micro-batch) pairs, counted per window
        span = int(mb[mm].max()) + 1
        pairs = unique(gidx[mm].astype(np.int64) * span + mb[mm].astype(np.int64))
        out["microbatches"] = np.bincount(pairs // span, minlength=n)
    else:
        out["microbatches"] = 0
    sv = stages.to_numpy()
    p = len(unique(sv[sv >= 0]))
    mbs = out["microbatches"].to_numpy().astype(float)
    out["ideal_bubble_frac"] = np.where((p > 0) & (mbs > 0), (p - 1) / (mbs + p - 1), np.nan)
    return out


def stage_bubbles(x: Any | pd.DataFrame) -> pd.DataFrame:
    """Mean bubble per stage (over its ranks and steps): ``stage``, ``ranks``,
    ``step_ns``, ``bubble_ns``, ``bubble_frac``, ``ideal_bubble_frac``."""
    b = x if isinstance(x, pd.DataFrame) else bubbles(x)
    if len(b) == 0:
        return pd.DataFrame({c: [] for c in ["stage", "ranks", "step_ns", "bubble_ns",
                                             "bubble_frac", "ideal_bubble_frac"]})
    g = b.groupby("stage", sort=True).agg(ranks=("rank", "nunique"), step_ns=("step_ns", "mean"),
                                          bubble_ns=("bubble_ns", "mean"),
                                          ideal_bubble_frac=("ideal_bubble_frac", "mean"))
    g["bubble_frac"] = g["bubble_ns"] / g["step_ns"].where(g["step_ns"] > 0)
    return g.reset_index()[["stage", "ranks", "step_ns", "bubble_ns", "bubble_frac",
                            "ideal_bubble_frac"]]
