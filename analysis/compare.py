"""Baseline vs candidate: one table of headline metrics with absolute and relative deltas.

Works on any two of Trace / ReplayResult (two traces, or a trace and its replay). Every
metric is computed the same way on both sides by :func:`metrics`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ._util import as_trace
from .breakdown import PARTS, breakdown
from .comm import collectives
from .critical_path import critical_path
from .efficiency import job_efficiency
from .kernels import KERNEL_CLASSES, class_stats
from .memory import peak_memory

__all__ = ["metrics", "compare"]


def metrics(x: Any, *, with_critical_path: bool = True) -> dict[str, float]:
    """Headline metrics of one run (ns, bytes, fractions; NaN when unknown).

    ``step_ns`` is the mean over steps of the slowest rank's step (the time a step takes for
    the job); breakdown parts are means over ranks and steps.
    """
    t = as_trace(x)  # converted once; only the critical path needs a replay's crit_pred
    bd = breakdown(t)
    out: dict[str, float] = {}
    if len(bd):
        per_step = bd.groupby("step")["step_ns"].max()
        out["step_ns"] = float(per_step.mean())
        out["ranks"] = float(bd["rank"].nunique())
        out["steps"] = float(len(per_step))
        for p in PARTS:
            out[p] = float(bd[p].mean())
        out["gpu_busy_frac"] = float(bd["busy_ns"].sum() / max(bd["step_ns"].sum(), 1))
    else:
        out["step_ns"] = float("nan")
    cs = class_stats(t)
    for c in KERNEL_CLASSES:
        out[f"{c}_ns"] = float(cs.loc[cs["kernel_class"] == c, "total_ns"].sum())
    co = collectives(t)
    out["collectives"] = float(len(co))
    out["comm_bytes"] = float(co["bytes"].sum()) if len(co) else 0.0
    out["comm_wait_ns"] = float(co["wait_ns"].sum()) if len(co) else 0.0
    out["busbw_gbps_median"] = float(np.nanmedian(co["busbw_gbps"])) if (
        len(co) and co["busbw_gbps"].notna().any()) else float("nan")
    out.update(job_efficiency(t))
    pm = peak_memory(t)
    out["peak_memory_bytes"] = float(pm["peak_allocated_bytes"].max()) if len(pm) else float("nan")
    if with_critical_path:
        cp = critical_path(x)
        out["critical_path_ns"] = float(cp.attrs["length_ns"])
    return out


def compare(a: Any, b: Any, *, labels: tuple[str, str] = ("baseline", "candidate"),
            with_critical_path: bool = True) -> pd.DataFrame:
    """Side-by-side metrics of ``a`` (baseline) and ``b`` (candidate).

    Returns
    -------
    DataFrame with ``metric``, the two labels as columns, ``delta`` (b - a) and
    ``delta_pct`` (100 * delta / a; NaN when a is 0 or unknown).
    """
    ma = metrics(a, with_critical_path=with_critical_path)
    mb = metrics(b, with_critical_path=with_critical_path)
    keys = list(dict.fromkeys([*ma, *mb]))
    va = np.array([ma.get(k, np.nan) for k in keys], float)
    vb = np.array([mb.get(k, np.nan) for k in keys], float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(va != 0, 100.0 * (vb - va) / np.abs(va), np.nan)
    return pd.DataFrame({"metric": keys, labels[0]: va, labels[1]: vb, "delta": vb - va,
                         "delta_pct": pct})
