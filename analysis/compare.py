"""Baseline vs candidate: one table of headline metrics with absolute and relative deltas,
and a verdict for CI.

Works on any two of Trace / ReplayResult (two traces, or a trace and its replay). Every
metric is computed the same way on both sides by :func:`metrics`. :func:`verdict` says
whether the candidate's step time regressed beyond a threshold, with a confidence taken
from the step-to-step spread of the two runs (``retime compare A B --threshold 5%``).
"""

from __future__ import annotations

import math
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

__all__ = ["metrics", "compare", "verdict", "step_times"]


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


def step_times(x: Any) -> np.ndarray:
    """Per step, the slowest rank's step time (ns): the job's step times."""
    bd = breakdown(as_trace(x))
    return bd.groupby("step")["step_ns"].max().to_numpy(dtype=float) if len(bd) else \
        np.zeros(0)


def _shared_names(ta: Any, tb: Any) -> float:
    """Share of op names found in both runs, of the run with fewer distinct names (1.0 when
    either run has none)."""
    def names(t: Any) -> set[str]:
        ids = np.unique(np.asarray(t.ops["name_id"]))
        return {t.strings[int(i)] for i in ids}
    na, nb = names(ta), names(tb)
    return len(na & nb) / min(len(na), len(nb)) if na and nb else 1.0


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def verdict(a: Any, b: Any, *, threshold: float = 0.05) -> dict[str, Any]:
    """Did ``b`` (candidate) regress against ``a`` (baseline)?

    The change is the relative difference of the mean step times (per step, the slowest
    rank). ``status`` is ``regression`` when ``b`` is slower by more than ``threshold``
    (a fraction: 0.05 for 5%), ``improvement`` when faster by more, else ``unchanged``.

    ``confidence`` is the probability, under a normal model of step-to-step noise, that the
    true change lies on the side of the threshold the status claims (beyond it for a
    regression or improvement, within it for unchanged). The noise is the standard error of
    the difference of the two means, from each run's spread of step times (a run with one
    step borrows the other's relative spread); with no spread known at all (one step in
    each run) it is None. Runs without step-to-step variation (modeled runs) give 0 or 1.

    Returns a dict: ``status``, ``change`` (fraction), ``baseline_ns``, ``candidate_ns``,
    ``threshold``, ``confidence`` (None when unknown), ``spread`` (relative step-to-step
    standard deviation used), ``steps`` ([baseline, candidate]), ``line`` (one sentence),
    ``note`` (None, or why the two runs may not be comparable: different rank counts).
    """
    if not (threshold >= 0):
        from retime.collectors.errors import RetimeError
        raise RetimeError(f"threshold={threshold!r}: must be a fraction >= 0 (0.05 for 5%)")
    sa, sb = step_times(a), step_times(b)
    if len(sa) == 0 or len(sb) == 0:
        from retime.collectors.errors import RetimeError
        raise RetimeError("compare: a run has no ops with step times; check `retime info`")
    ma, mb = float(sa.mean()), float(sb.mean())
    change = (mb - ma) / ma if ma else float("nan")
    rel = [float(np.std(s, ddof=1) / s.mean()) for s in (sa, sb) if len(s) > 1 and s.mean() > 0]
    if len(rel) == 2:
        va, vb = float(np.var(sa, ddof=1)), float(np.var(sb, ddof=1))
        spread = float(np.sqrt((rel[0] ** 2 + rel[1] ** 2) / 2))
    elif len(rel) == 1:
        spread = rel[0]
        va, vb = (spread * ma) ** 2, (spread * mb) ** 2
    else:
        spread, va, vb = float("nan"), float("nan"), float("nan")
    se = math.sqrt(va / len(sa) + vb / len(sb)) if va == va else float("nan")
    d = mb - ma
    thr = threshold * ma
    if change > threshold:
        status = "regression"
    elif change < -threshold:
        status = "improvement"
    else:
        status = "unchanged"
    if se != se:
        conf = None
    elif se == 0:
        conf = 1.0 if (status == "regression" and d > thr) or (status == "improvement" and -d > thr)\
            or (status == "unchanged" and abs(d) <= thr) else 0.0
    elif status == "regression":
        conf = _phi((d - thr) / se)
    elif status == "improvement":
        conf = _phi((-d - thr) / se)
    else:
        conf = _phi((thr - d) / se) - _phi((-thr - d) / se)
    what = {"regression": "REGRESSION", "improvement": "IMPROVEMENT",
            "unchanged": "NO SIGNIFICANT CHANGE"}[status]
    side = "over" if status != "unchanged" else "within"
    from .tables import fmt_ns
    # a run without step markers is one window, the whole trace: say so where its "step" is
    unmarked = [bool(len(t.ops)) and bool((np.asarray(t.ops["step"]) < 0).all())
                for t in (as_trace(a), as_trace(b))]
    one = ("one step in each run" if not any(unmarked) else
           "no step markers in either run (each is one window, the whole trace)"
           if all(unmarked) else
           f"one step in each run (the {'baseline' if unmarked[0] else 'candidate'} has no "
           "step markers: the whole trace)")
    if conf is None:
        c = f"confidence unknown ({one}: no step-to-step spread to judge noise)"
    else:
        borrowed = (f"; the {'baseline' if len(sa) == 1 else 'candidate'}'s one "
                    f"{'window' if unmarked[0 if len(sa) == 1 else 1] else 'step'} borrows it"
                    if len(rel) == 1 else "")
        c = (f"confidence {100 * conf:.0f}% (step-to-step spread {100 * spread:.1f}%, "
             f"{len(sa)} and {len(sb)} steps{borrowed})")
    line = (f"{what}: step time {100 * change:+.1f}% ({fmt_ns(ma)} -> {fmt_ns(mb)}; each the "
            f"mean of its steps' slowest rank), {side} the {100 * threshold:g}% threshold; {c}")
    # runs of different rank counts are rarely the same job measured twice: say so (the
    # verdict stands; a what-if of a new data-parallel size compares this way on purpose)
    ta, tb = as_trace(a), as_trace(b)
    na, nb = len(ta.ranks), len(tb.ranks)
    notes = [f"the runs hold {na} and {nb} ranks: check that they are the same job"
             ] if na != nb else []
    # two unrelated jobs (a DLRM trace against a Megatron one) can hold the same rank count:
    # runs of one job run (nearly) the same ops, so a small share of shared op names says so
    wa, wb = ta.world_size, tb.world_size
    if na == nb and wa and wb and wa != wb:  # one rank of each, of jobs of different sizes
        notes.append(f"the runs come from jobs of {wa} and {wb} rank(s): check that they are "
                     "the same job")
    ba, bb = (t.meta.get("backend") if isinstance(t.meta, dict) else None for t in (ta, tb))
    if ba and bb and ba != bb:
        notes.append(f"the runs communicate over {ba} and {bb}")
    shared = _shared_names(ta, tb)
    if shared < 0.5:
        notes.append(f"the runs share {100 * shared:.0f}% of their op names (of the run with "
                     "fewer): they look like different jobs")
    from .coverage import stack_traced_files
    sa_, sb_ = (bool(stack_traced_files(t.meta)) for t in (ta, tb))
    if sa_ != sb_:
        notes.append(f"the {'baseline' if sa_ else 'candidate'} was recorded with "
                     "with_stack=True and the other without: Python stack tracing slows the "
                     "host, so part of the change is the profiler's")
    note = "; ".join(notes) or None
    if note:
        line += f"; note: {note}"
    return {"status": status, "change": change, "baseline_ns": ma, "candidate_ns": mb,
            "threshold": threshold, "confidence": conf, "spread": spread,
            "steps": [int(len(sa)), int(len(sb))], "line": line, "note": note}
