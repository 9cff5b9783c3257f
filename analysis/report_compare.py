"""Comparison sections (a run against a baseline: waterfall of what changed, per-rank
deltas, metrics side by side) and the report of a sweep (Pareto front, sensitivity)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import plots
from .breakdown import PARTS
from .report_findings import PART_WORDS
from .report_model import Fig, Section
from .report_run import RunAnalysis
from .tables import Column, fmt_bytes, fmt_count, fmt_ns, fmt_pct, people_table, plural

__all__ = ["section_comparison", "waterfall_frame", "comparison_finding", "build_sweep_sections"]


_WATERFALL_WORDS = {"compute_ns": "compute", "overlapped_comm_ns": "hidden comm.",
                    "exposed_comm_ns": "exposed comm.", "memcpy_ns": "copies",
                    "host_bound_ns": "host-bound", "idle_ns": "idle"}


def waterfall_frame(base: RunAnalysis, cand: RunAnalysis, *, pipeline: bool = False
                    ) -> pd.DataFrame:
    """The step-time change split by part: ``part`` (words), ``key``, ``delta_ns``;
    ``attrs`` baseline_ns / candidate_ns. The parts are those of each step's slowest rank,
    so baseline + sum(delta) == candidate exactly."""
    a, b = base.slow_parts, cand.slow_parts
    rows = []
    for p in PARTS:
        word = _WATERFALL_WORDS[p]
        if p == "idle_ns" and pipeline:
            word = "idle (incl. bubbles)"
        rows.append((word, p, float(b[p] - a[p])))
    df = pd.DataFrame(rows, columns=["part", "key", "delta_ns"])
    df.attrs["baseline_ns"] = float(a.sum())
    df.attrs["candidate_ns"] = float(b.sum())
    return df


def comparison_finding(base: RunAnalysis, cand: RunAnalysis, what: str) -> str:
    wf = waterfall_frame(base, cand)
    a, b = base.step_ns, cand.step_ns
    d = b - a
    pct = d / a if a else float("nan")
    big = wf.iloc[int(np.argmax(np.abs(wf["delta_ns"].to_numpy())))]
    verb = "shortens" if d < 0 else "lengthens"
    if d == 0:
        return f"{what} leaves the step unchanged at {fmt_ns(a)}."
    ratio = f"{a / b:.2f}x faster" if b < a else f"{b / a:.2f}x slower"
    return (f"{what} {verb} the step from {fmt_ns(a)} to {fmt_ns(b)} ({pct:+.1%}, "
            f"{ratio}); the largest change is {big['part']} "
            f"({'+' if big['delta_ns'] > 0 else '-'}{fmt_ns(abs(big['delta_ns']))}).")


def _metric_rows(base: RunAnalysis, cand: RunAnalysis) -> pd.DataFrame:
    def row(name, a, b, kind):
        return (name, a, b, kind)

    rows = [row("Step time", base.step_ns, cand.step_ns, "time")]
    for p in PARTS:
        rows.append(row(f"of which: {PART_WORDS[p]}", float(base.slow_parts[p]),
                        float(cand.slow_parts[p]), "time"))
    rows.append(row("GPU busy", float(base.bd["busy_ns"].sum() / max(base.bd["step_ns"].sum(), 1)),
                    float(cand.bd["busy_ns"].sum() / max(cand.bd["step_ns"].sum(), 1)), "pct"))
    for k, name in (("mfu", "MFU"), ("hfu", "HFU")):
        va, vb = base.je.get(k, np.nan), cand.je.get(k, np.nan)
        if va == va or vb == vb:
            rows.append(row(name, va, vb, "pct"))
    wa = float(base.co["wait_ns"].sum()) / max(base.steps, 1) if len(base.co) else 0.0
    wb = float(cand.co["wait_ns"].sum()) / max(cand.steps, 1) if len(cand.co) else 0.0
    if wa or wb:
        rows.append(row("Waiting at collectives (all ranks, per step)", wa, wb, "time"))
    # a streamed run's path is its slowest rank's own (analysis.report_stream): said so
    scoped = "scope_rank" in base.cp.attrs or "scope_rank" in cand.cp.attrs
    rows.append(row("Critical path (each run's slowest rank alone)" if scoped else
                    "Critical path", float(base.cp.attrs["length_ns"]),
                    float(cand.cp.attrs["length_ns"]), "time"))
    pa = float(base.pm["peak_allocated_bytes"].max()) if len(base.pm) else np.nan
    pb = float(cand.pm["peak_allocated_bytes"].max()) if len(cand.pm) else np.nan
    if pa == pa or pb == pb:
        rows.append(row("Peak memory", pa, pb, "bytes"))
    rows.append(row("Ranks", base.n_ranks, cand.n_ranks, "count"))
    rows.append(row("Ops", base.n_ops, cand.n_ops, "count"))
    return pd.DataFrame(rows, columns=["metric", "a", "b", "kind"])


def _fmt(kind: str, v: float) -> str:
    return {"time": fmt_ns, "pct": fmt_pct, "bytes": fmt_bytes, "count": fmt_count}[kind](v)


def _change(kind: str, a: float, b: float) -> str:
    if a != a or b != b:
        return "n/a"
    d = b - a
    if kind == "pct":
        return f"{100 * d:+.1f} points"
    if kind == "time":
        return ("+" if d > 0 else "-" if d < 0 else "±") + fmt_ns(abs(d))
    if kind == "bytes":
        return ("+" if d >= 0 else "-") + fmt_bytes(abs(d))
    return f"{d:+,.0f}"


def _the(label: str) -> str:
    return "this run's" if label == "this run" else f"the {label}"


def section_comparison(base: RunAnalysis, cand: RunAnalysis, *, labels: tuple[str, str],
                       top: int) -> Section:
    """Waterfall of what changed, per-rank deltas and the metrics side by side."""
    la, lb = labels
    s = Section("comparison", f"{lb.capitalize()} against {la}")
    s.blocks.append(f"The waterfall starts at {_the(la)} step, adds how each part changed, and "
                    f"ends at {_the(lb)} step. Parts are those of each step's slowest rank (the "
                    "rank that sets the step time), so they add up exactly.")
    wf = waterfall_frame(base, cand, pipeline=cand.n_stages > 1)
    s.blocks.append(Fig("waterfall", f"What changed in the step, {la} to {lb} (ms).",
                        plots.plot_waterfall(wf, labels=(la, lb), title="")))
    m = _metric_rows(base, cand)
    m["A"] = [_fmt(k, v) for k, v in zip(m["kind"], m["a"])]
    m["B"] = [_fmt(k, v) for k, v in zip(m["kind"], m["b"])]
    m["change"] = [_change(k, a, b) for k, a, b in zip(m["kind"], m["a"], m["b"])]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where((m["kind"] != "pct") & (m["a"].astype(float) != 0),
                       (m["b"].astype(float) - m["a"].astype(float)) / m["a"].astype(float), np.nan)
    m["rel"] = [f"{100 * r:+.1f}%" if r == r else "" for r in rel]
    s.blocks.append(people_table(m, [Column("metric", "Metric", "text"),
                                     Column("A", la.capitalize(), "text"),
                                     Column("B", lb.capitalize(), "text"),
                                     Column("change", "Change", "text"),
                                     Column("rel", "Change (%)", "text")],
                                 caption="Side by side"))
    ta = base.bsum.set_index("rank")
    tb = cand.bsum.set_index("rank")
    common = ta.index.intersection(tb.index)
    if len(common):
        d = pd.DataFrame({"rank": common.to_numpy(), "a_ns": ta.loc[common, "step_ns"].to_numpy(),
                          "b_ns": tb.loc[common, "step_ns"].to_numpy()})
        d["delta_ns"] = d["b_ns"] - d["a_ns"]
        pd_parts = (tb.loc[common, list(PARTS)] - ta.loc[common, list(PARTS)])
        big = pd_parts.abs().idxmax(axis=1).to_numpy()
        d["part"] = [f"{PART_WORDS[p]} ({'+' if pd_parts.iloc[i][p] > 0 else '-'}"
                     f"{fmt_ns(abs(pd_parts.iloc[i][p]))})" for i, p in enumerate(big)]
        with np.errstate(divide="ignore", invalid="ignore"):
            d["rel"] = d["delta_ns"] / d["a_ns"]
        if len(common) > 1:
            s.blocks.append(Fig("rank_deltas", f"Change of each rank's mean step, {la} to {lb}.",
                                plots.plot_rank_deltas(d, title="")))
        if len(common) < max(len(ta), len(tb)):
            s.blocks.append(f"Only {plural(len(common), 'rank')} present in both runs "
                            f"{'is' if len(common) == 1 else 'are'} compared "
                            f"({la}: {len(ta):,} ranks, {lb}: {len(tb):,}).")
        order = d.reindex(d["delta_ns"].abs().sort_values(ascending=False,
                                                          kind="mergesort").index)
        s.blocks.append(people_table(order, [Column("rank", "Rank", "count"),
                                             Column("a_ns", la.capitalize(), "time"),
                                             Column("b_ns", lb.capitalize(), "time"),
                                             Column("delta_ns", "Change", "dtime"),
                                             Column("rel", "Change (%)",
                                                    lambda v: f"{100 * v:+.1f}%"
                                                    if v == v else "n/a"),
                                             Column("part", "Part that changed most", "text")],
                                     caption="Per-rank change, largest first", top=top,
                                     what="ranks", csv_name="rank_deltas"))
    return s


# ------------------------------------------------------------------ sweeps
_METRIC_WORDS = {"step_time_ns": ("Step time", "time"), "tokens_per_s": ("Tokens/s", "num"),
                 "mfu": ("MFU", "pct"), "peak_memory_bytes": ("Peak memory", "bytes"),
                 "exposed_comm_ns": ("Exposed comm.", "time"),
                 # the step share with no device compute (pipeline bubbles, exposed
                 # communication, host waits): most of a DDP step is no pipeline bubble
                 "bubble_fraction": ("No compute", "pct"), "oom": ("Out of memory",
                                                               lambda v: "yes" if v is True
                                                               else "no" if v is False else "")}


def _sweep_keys(df: pd.DataFrame) -> list[str]:
    from retime.replay.sweep_metrics import METRICS
    skip = {"scenario_id", "error", "name", *METRICS}
    return [c for c in df.columns if c not in skip]


def build_sweep_sections(df: pd.DataFrame, *, top: int) -> tuple[list[Section], dict]:
    """Sections of a sweep's report and the facts its headline needs."""
    from .sweep_plots import pareto_front, plot_pareto, plot_sensitivity, sensitivity

    keys = _sweep_keys(df)
    ok = df[df["error"].isna() & df["step_time_ns"].notna()] if "error" in df else df
    info = {"keys": keys, "ok": ok, "failed": int(df["error"].notna().sum())
            if "error" in df else 0,
            "oom": int(df["oom"].fillna(False).astype(bool).sum()) if "oom" in df else 0}
    secs: list[Section] = []
    s = Section("scenarios", "Scenarios")
    s.blocks.append(f"{len(df):,} scenario{'s' if len(df) != 1 else ''} over {len(keys)} "
                    f"key{'s' if len(keys) != 1 else ''}: "
                    f"{', '.join(keys) or 'none'}; {info['failed']} failed, "
                    f"{info['oom']} run out of memory. Fastest first.")
    metric_cols = [c for c in _METRIC_WORDS if c in df.columns and df[c].notna().any()]
    cols = [Column("scenario_id", "#", "count"), *[Column(k, k, "text") for k in keys],
            *[Column(c, *_METRIC_WORDS[c]) for c in metric_cols]]
    ranked = ok.sort_values("step_time_ns", kind="mergesort")
    s.blocks.append(people_table(ranked.assign(**{k: ranked[k].astype(str) for k in keys}),
                                 cols, caption="Scenarios by step time", top=top,
                                 what="scenarios", csv_name="scenarios", csv_frame=df))
    secs.append(s)
    if len(ok) and keys:
        sens = sensitivity(ok, keys)
        s2 = Section("sensitivity", "Sensitivity")
        s2.blocks.append("For each key, the median step time over all scenarios holding each of "
                         "its values (the band spans their fastest and slowest). Keys are ranked "
                         "by how much the median moves between their best and worst value.")
        s2.blocks.append(Fig("sensitivity", "Step time against each key (ms).",
                             plot_sensitivity(ok, [k for k in sens["key"]][:6])))
        s2.blocks.append(people_table(sens, [Column("key", "Key", "text"),
                                             Column("best", "Best value", "text"),
                                             Column("worst", "Worst value", "text"),
                                             Column("best_ns", "Median step at best", "time"),
                                             Column("worst_ns", "Median step at worst", "time"),
                                             Column("range_frac", "Range", "pct")],
                                     caption="Keys by effect on the step time"))
        secs.append(s2)
    if "peak_memory_bytes" in ok and ok["peak_memory_bytes"].notna().sum() >= 2 \
            and ok["peak_memory_bytes"].nunique() > 1:
        front = pareto_front(df)
        s3 = Section("pareto", "Step time against memory")
        s3.blocks.append("Each scenario's step time against its peak memory per GPU; the Pareto "
                         "front holds the scenarios no other beats on both (crosses: out of "
                         "memory).")
        s3.blocks.append(Fig("pareto", "Pareto front of step time and peak memory.",
                             plot_pareto(df, label="scenario_id", title="")))
        s3.blocks.append(people_table(front.assign(**{k: front[k].astype(str) for k in keys}),
                                      cols, caption="Scenarios on the front"))
        secs.append(s3)
    bad = df[df["error"].notna()] if "error" in df else df.iloc[:0]
    if len(bad):
        s4 = Section("failed", "Failed scenarios")
        s4.blocks.append(people_table(bad.assign(**{k: bad[k].astype(str) for k in keys}),
                                      [Column("scenario_id", "#", "count"),
                                       *[Column(k, k, "text") for k in keys],
                                       Column("error", "Error", "name")],
                                      caption="Scenarios that did not run", top=top,
                                      what="failed scenarios", csv_name="failed"))
        secs.append(s4)
    return secs, info


def finite(v: float) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))
